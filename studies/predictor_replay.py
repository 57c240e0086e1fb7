"""Replay recorded bench runs through the router's TTFT predictor, offline.

    .venv/bin/python -m studies.predictor_replay var/mape-a.json [more.json ...]

A change to ``geo_router.predictor`` is judged on real traffic without running
the topology again: each report's requests (``hybrid-llm bench --out``, one
at a time) are fed, in the order they were sent, to one
:class:`~geo_router.predictor.TtftModel` per instance, with one quick-request
pool per tier as the router's ``Tracker`` keeps. Each request is predicted
from what the router believed when it was sent (``X-Route-Prediction``: the
prompt and cached token counts, the waits, the running count, the RTT and
the formula's cost of a token), then the model observes the TTFT the router
saw (its ``Server-Timing``). The error is the bench's: the predicted median
against the TTFT the client saw.

Reports recorded before the router sent ``rtt_ms`` and ``ms_per_token`` are
replayed with an RTT of zero (plain ``up``: the instances are on this machine)
and, per instance, the cost of a token its first formula prediction implies
(its predicted TTFT over the tokens it counted uncached): the prefill rate
the engines report drifts within a run, which these reports do not show. Such
rows are marked ``~``.

Printed per report and over all: the MAPE of the replay beside the router's
live one, for all requests, those with nothing to prefill (the ``quick``
rule) and the rest, per tier.
"""

from __future__ import annotations

import argparse
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from geo_router.predictor import Features, TtftModel
from geo_router.routing_settings import PredictionSettings
from hybrid_llm.bench.client import RequestRecord
from studies.prediction_split import load_records

__all__ = ["Replayed", "replay"]

_MIN_TOKENS_FOR_RATE = 50  # a formula prediction this long tells the cost of a token


@dataclass(frozen=True, slots=True)
class Replayed:
    """One request: the tier it went to, its rule, the live and replayed medians (ms)
    and the TTFT the client saw."""

    tier: str
    quick: bool
    live_ms: float
    replay_ms: float
    ttft_ms: float
    exact: bool  # the report held the RTT and the cost of a token


def _rate_of(records: list[RequestRecord], instance: str) -> float | None:
    """The formula's ms per token the instance's first formula prediction implies."""
    for r in records:
        uncached = (r.router_prompt_tokens or 0) - (r.router_cached_tokens or 0)
        if (
            r.instance == instance
            and r.route_basis == "formula"
            and r.predicted_ttft is not None
            and uncached >= _MIN_TOKENS_FOR_RATE
        ):
            return r.predicted_ttft * 1000.0 / uncached
    return None


def _features(r: RequestRecord, rate: float | None) -> tuple[Features, bool] | None:
    if r.router_prompt_tokens is None or r.router_cached_tokens is None:
        return None
    exact = r.router_rtt_ms is not None and r.router_ms_per_token is not None
    rtt = r.router_rtt_ms if r.router_rtt_ms is not None else 0.0
    per_token = r.router_ms_per_token if r.router_ms_per_token is not None else rate
    if per_token is None:
        return None
    uncached = max(0, r.router_prompt_tokens - r.router_cached_tokens)
    wait = r.router_wait_ms or 0.0
    features = Features(
        rtt_ms=rtt,
        uncached_tokens=uncached,
        wait_ms=wait,
        reported_wait_ms=r.router_reported_wait_ms or 0.0,
        busy_seqs=r.router_running or 0,
        prior_ms=rtt + wait + uncached * per_token,
        ms_per_token=per_token,
        cached_tokens=r.router_cached_tokens,
    )
    return features, exact


def replay(
    records: list[RequestRecord], settings: PredictionSettings | None = None
) -> list[Replayed]:
    """Every served request of one run with a prediction, replayed in order."""
    settings = settings or PredictionSettings()
    models: dict[str, TtftModel] = {}
    pools: dict[str, deque[float]] = {}
    rates: dict[str, float | None] = {}
    out: list[Replayed] = []
    for i, r in enumerate(sorted(records, key=lambda r: r.start)):
        if not r.ok or r.ttft is None or r.router_ttft is None or r.predicted_ttft is None:
            continue
        if r.instance not in rates:
            rates[r.instance] = _rate_of(records, r.instance)
        found = _features(r, rates[r.instance])
        if found is None:
            continue
        features, exact = found
        model = models.get(r.instance)
        if model is None:
            pool = pools.setdefault(r.tier, deque(maxlen=settings.window))
            model = models[r.instance] = TtftModel(settings, pool)
        now = float(i)  # one at a time: nothing fades between requests
        predicted = model.predict(features, now)
        model.observe(predicted, r.router_ttft * 1000.0, now)
        out.append(
            Replayed(
                r.tier,
                features.quick,
                r.predicted_ttft * 1000.0,
                predicted.median_ms,
                r.ttft * 1000.0,
                exact,
            )
        )
    return out


def _mape(rows: list[Replayed], live: bool) -> str:
    if not rows:
        return "   -"
    errors = [abs((r.live_ms if live else r.replay_ms) - r.ttft_ms) / r.ttft_ms for r in rows]
    return f"{100.0 * sum(errors) / len(errors):4.0f}%"


def _line(name: str, rows: list[Replayed]) -> str:
    cells = [f"{name:28s} {len(rows):4d}"]
    for subset in (
        rows,
        [r for r in rows if r.quick],
        [r for r in rows if not r.quick],
    ):
        cells.append(f"{_mape(subset, True)} {_mape(subset, False)}")
    exact = "" if all(r.exact for r in rows) else " ~"
    return "   ".join(cells) + exact


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("reports", type=Path, nargs="+", help="hybrid-llm bench --out files")
    args = p.parse_args()
    print(f"{'report':28s} {'n':>4s}   all: live replay   quick: live replay   rest: live replay")
    everything: list[Replayed] = []
    for path in args.reports:
        rows = replay(load_records(path))
        everything.extend(rows)
        print(_line(path.name, rows))
        for tier in sorted({r.tier for r in rows}):
            print(_line(f"  {tier}", [r for r in rows if r.tier == tier]))
    if len(args.reports) > 1:
        print(_line("all reports", everything))


if __name__ == "__main__":
    main()
