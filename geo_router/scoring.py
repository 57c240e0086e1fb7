"""Candidate scoring: predicted TTFT, slow start, and power-of-two choices.

predicted TTFT = RTT(user region → instance region)
               + queue wait (requests beyond capacity × typical service time / capacity)
               + prefill estimate (uncached prompt tokens / prefill rate)
               + busy slowdown (running sequences × the engine's measured cost of one)

The RTT is the region table's, or, with ``region.measured_rtt`` on, the
router's own measured round trip to the instance (``InstanceState.rtt_ms``,
from its ``/load`` polls) for a user in the router's own region (its default
region): a router and its users share a city, and the TTFT the predictor
learns from is timed at the router, so the router's path is the one it
pays. A user resolved elsewhere keeps the table (the router measured no path
of theirs), as does every user before the instance's first timed poll.

Uncached tokens are the prompt's minus what the router estimates the
instance holds in its prefix cache (``geo_router.prefix_index``: what this
router sent it recently), so a repeated system prompt or a conversation's
history is charged only where it is not cached. Stickiness stays bounded by
the other terms: as the instance holding a prefix fills up, its queue and
busy terms grow until a cold instance predicts the earlier first token.

The busy count is the larger of the instance's last load report and the
router's own in-flight count, so a burst between two heartbeats does not
herd onto one instance. Requests of this router that ended after the report
was taken no longer count in it: a report up to a poll period old would
otherwise keep an idle edge busy for that long after its last answer. The
wait the instance predicted for a newcomer (``predicted_wait_ms``: the
prefill left and the decode of the sequences it counted) shrinks with them,
by their share of its count: a report taken while a long prompt prefilled
there must not price the next request, sent when it ended, behind it (the
suspected cause of repeats predicted at 201 and 817 ms that took 29-39 ms,
one at a time on ShareGPT, each sent right after a long prompt there ended).

A batching engine admits a new prompt while others decode, but not for free:
the prefill shares the engine's compute (on a CPU edge, its one core) with
their decode steps, waits for the step in flight and for earlier prompts.
The engine measures what each sequence already running added to its recent
arrivals' TTFT beyond their own prefill (``busy_ms_per_seq`` in its load
report, independent of prompt length: see ``servekit.engine.batching_stats``),
so each sequence running there (up to capacity) adds that, times
``busy_slowdown_weight``. Nothing is added until the engine has measured it,
nor for an idle engine.

An instance that sheds on a TTFT budget (``ttft_budget_ms`` in its load
report) is *over budget* when the router's wait estimate there (queue + busy)
and the request's own prefill exceed that budget as the instance counts them
(``servekit.admission.over_ttft_budget``: a prompt too long for the budget
fits only an idle instance), or when it refused a request within the last
``shed_backoff_s``: it would refuse, so :func:`within_budget_first` ranks it
behind the candidates that can start in time (still tried last).

Candidates within ``p2c_window_ms`` of the best compete by power of two
choices, sampled by their slow-start weight, except for a prefix none of
them holds yet (a new system prompt, a conversation's first turn): then the
near-best are ranked by rendezvous hashing of the prefix's opening
(:attr:`~geo_router.prefix_index.Prefix.anchor`) with each instance id, so
every router sends the first copy of a new system prompt to the same instance
without talking to the others, and the copies after it find it cached there.
The load terms still bound it: only instances within the window compete.

The formula is the *prior* of each instance's learned prediction
(``geo_router.predictor``): once the router has seen enough first tokens
there, :attr:`Scored.predicted_ms` is the learned median (plus the tier's
bias), and :attr:`Scored.prediction` carries its P90 for the hedge delay and
the first-token deadline. The formula's terms stay in explain as they were.
"""

from __future__ import annotations

import functools
import hashlib
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from geo_router.predictor import Features, Prediction
from geo_router.prefix_index import Prefix
from geo_router.routing_settings import RoutingSettings
from geo_router.tracker import Circuit, Tracker
from geo_router.trimming import Trim
from servekit.admission import over_ttft_budget
from servekit.registry.protocol import InstanceState
from servekit.rtt import RttTable

__all__ = ["Scored", "Scorer", "instance_url", "within_budget_first"]


def instance_url(state: InstanceState) -> str:
    """Where to send an instance's requests: its registered address, port and scheme.

    ``meta["url"]`` (a static upstream's configured URL, which may carry a path
    prefix) is used only when it names that same origin: the registration's
    meta is the instance's own word, and an instance (a stolen edge) must not
    point the router, with the fleet's token, at another host or port.
    """
    info = state.info
    given = info.meta.get("url")
    if given and _same_origin(given, info.meta.get("scheme", "http"), info.address, info.port):
        return given
    return info.url


@functools.lru_cache(maxsize=4096)
def _same_origin(url: str, scheme: str, address: str, port: int) -> bool:
    try:
        parts = urlsplit(url)
        given_port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:  # an unparsable port
        return False
    return (
        parts.scheme == scheme
        and (parts.hostname or "").lower() == address.lower()
        and given_port == port
        and not parts.username
        and not parts.password
    )


@dataclass(frozen=True, slots=True)
class Scored:
    state: InstanceState
    predicted_ms: float
    rtt_ms: float
    queue_ms: float
    prefill_ms: float
    bias_ms: float
    busy_ms: float
    weight: float
    circuit: Circuit
    prompt_tokens: int = 0
    cached_tokens: int = 0
    cached_source: str = "none"  # "reported" by the instance, the "router"'s record, or "none"
    over_budget: bool = False
    trim: Trim | None = None
    prefix: Prefix | None = None  # what this instance will have cached once it serves it
    warming: bool = False  # chosen to take a prefix cached elsewhere (a cold start, once)
    rent_ms: float = 0.0  # what serving here costs beyond a same-city edge holding the prefix
    rtt_source: str = "table"  # where rtt_ms came from: the region "table" or "measured"
    prediction: Prediction | None = None  # the request's TTFT there (None: predicted_ms)

    @property
    def ttft_ms(self) -> float:
        """The predicted median TTFT, without the tier's bias."""
        return self.predicted_ms - self.bias_ms

    @property
    def formula_ms(self) -> float:
        """The formula's estimate (RTT + wait + prefill at the reported rate) with the
        tier's bias: what the deadline of an instance still learning is a multiple of."""
        formula = self.ttft_ms if self.prediction is None else self.prediction.features.prior_ms
        return formula + self.bias_ms

    @property
    def ttft_p90_ms(self) -> float | None:
        """The calibrated upper quantile, once the instance's model has learned."""
        return None if self.prediction is None else self.prediction.p90_ms

    @property
    def basis(self) -> str:
        """Which rule gave the predicted median (``Prediction.basis``)."""
        return "formula" if self.prediction is None else self.prediction.basis

    def prediction_header(self) -> str:
        """``X-Route-Prediction``: the rule and what the router believed when it
        predicted (its prompt token count, what it counted cached there, its wait
        estimate, the instance's own as the router used it, the sequences it counted
        running, the RTT and the formula's cost of a token there), so a client
        comparing the prediction with its TTFT can tell a wrong belief from a wrong
        model, and a report can be replayed through another model
        (``studies/predictor_replay.py``)."""
        f = None if self.prediction is None else self.prediction.features
        running = "" if f is None else f.busy_seqs
        reported = "" if f is None else f"{f.reported_wait_ms:.0f}"
        rtt = "" if f is None else f"{f.rtt_ms:.1f}"
        per_token = "" if f is None else f"{f.ms_per_token:.3f}"
        return (
            f"{self.basis}; prompt_tokens={self.prompt_tokens};"
            f" cached_tokens={self.cached_tokens};"
            f" wait_ms={self.queue_ms + self.busy_ms:.0f}; reported_wait_ms={reported};"
            f" running={running}; rtt_ms={rtt}; ms_per_token={per_token}"
        )

    @property
    def window(self) -> int | None:
        """The instance's context window (prompt + completion), if it reports one."""
        return self.state.load.max_context_tokens

    @property
    def id(self) -> str:
        return self.state.info.id

    @property
    def tier(self) -> str:
        return self.state.info.tier

    @property
    def region(self) -> str:
        return self.state.info.region

    @property
    def url(self) -> str:
        return instance_url(self.state)

    def to_dict(self) -> dict[str, Any]:
        info = self.state.info
        return {
            "id": info.id,
            "tier": info.tier,
            "region": info.region,
            "model": info.model,
            "version": info.version,
            "url": self.url,
            "predicted_ttft_ms": round(self.ttft_ms, 2),
            "predicted_ttft_p90_ms": _rounded(self.ttft_p90_ms),
            "prediction": "learned" if self.ttft_p90_ms is not None else "formula",
            "prediction_basis": self.basis,
            "rank_ms": round(self.predicted_ms, 2),
            "rtt_ms": round(self.rtt_ms, 2),
            "rtt_source": self.rtt_source,
            "measured_rtt_ms": _rounded(self.state.rtt_ms),
            "queue_ms": round(self.queue_ms, 2),
            "prefill_ms": round(self.prefill_ms, 2),
            "busy_ms": round(self.busy_ms, 2),
            "bias_ms": round(self.bias_ms, 2),
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "cached_source": self.cached_source,
            "max_context_tokens": self.window,
            "ttft_budget_ms": self.state.load.ttft_budget_ms,
            "reported_wait_ms": self.state.load.predicted_wait_ms,
            "over_budget": self.over_budget,
            "warming": self.warming,
            "rent_ms": round(self.rent_ms, 2),
            "trimmed": None if self.trim is None else self.trim.to_dict(),
            "weight": round(self.weight, 3),
            "circuit": self.circuit.name.lower(),
        }


class Scorer:
    def __init__(
        self,
        routing: RoutingSettings,
        rtt: RttTable,
        tracker: Tracker,
        rng: random.Random | None = None,
        *,
        measured_rtt_region: str | None = None,
    ) -> None:
        """``measured_rtt_region``: users there are priced with each instance's measured
        RTT once it has one (the router's own region; None: the table for everyone)."""
        self._routing = routing
        self._rtt = rtt
        self._measured_region = measured_rtt_region
        self._tracker = tracker
        self._rng = rng or random.Random()

    def score(
        self,
        state: InstanceState,
        user_region: str,
        prompt_tokens: int,
        bias_ms: float = 0.0,
        now: float | None = None,
        *,
        cached_tokens: int = 0,
        cached_source: str = "none",
        trim: Trim | None = None,
        prefix: Prefix | None = None,
    ) -> Scored:
        now = time.monotonic() if now is None else now
        info, load = state.info, state.load
        stats = self._tracker.stats(info.id, info.tier)
        tier = info.tier
        capacity = max(1, load.capacity or info.capacity)
        counted = reported = load.running + load.waiting
        if reported and state.last_heartbeat:
            reported = max(0, reported - stats.released_since(state.last_heartbeat))
        busy = max(reported, stats.inflight)
        reported_wait = load.predicted_wait_ms or 0.0
        if counted:  # the wait behind the sequences it counted, less those that ended
            reported_wait *= reported / counted
        excess = busy - capacity + 1
        service_ms = self._routing.default_service_ms.get(tier, 2000.0)
        if load.decode_tokens_per_s:
            service_ms = self._routing.default_max_tokens / load.decode_tokens_per_s * 1000.0
        queue_ms = max(0, excess) * service_ms / capacity
        prefill_tps = load.prefill_tokens_per_s or self._routing.default_prefill_tps.get(
            tier, 1000.0
        )
        cached_tokens = max(0, min(cached_tokens, prompt_tokens - 1))
        prefill_ms = (prompt_tokens - cached_tokens) / prefill_tps * 1000.0
        per_seq = load.busy_ms_per_seq or 0.0
        busy_ms = min(busy, capacity) * per_seq * self._routing.busy_slowdown_weight
        budget = load.ttft_budget_ms
        over = stats.refused_until > now or (
            budget is not None
            and over_ttft_budget(queue_ms + busy_ms, prefill_ms, budget, idle=busy == 0)
        )
        rtt, rtt_source = self._rtt.rtt(user_region, info.region), "table"
        if state.rtt_ms is not None and user_region == self._measured_region:
            rtt, rtt_source = state.rtt_ms, "measured"
        ramp = self._routing.slow_start_s
        weight = 1.0 if ramp <= 0 else min(1.0, max(0.05, (now - stats.first_seen) / ramp))
        features = Features(
            rtt_ms=rtt,
            uncached_tokens=prompt_tokens - cached_tokens,
            wait_ms=queue_ms + busy_ms,
            reported_wait_ms=reported_wait,
            busy_seqs=min(busy, capacity),
            prior_ms=rtt + queue_ms + prefill_ms + busy_ms,
            ms_per_token=1000.0 / prefill_tps,
            # A repeat's uncached tail and the attention term are priced from it.
            cached_tokens=cached_tokens,
        )
        prediction = stats.model.predict(features, now)
        return Scored(
            state=state,
            predicted_ms=prediction.median_ms + bias_ms,
            rtt_ms=rtt,
            rtt_source=rtt_source,
            queue_ms=queue_ms,
            prefill_ms=prefill_ms,
            bias_ms=bias_ms,
            busy_ms=busy_ms,
            weight=weight,
            circuit=stats.circuit,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached_tokens,
            cached_source=cached_source if cached_tokens else "none",
            over_budget=over,
            trim=trim,
            prefix=prefix,
            prediction=prediction,
        )

    def order(self, scored: Sequence[Scored]) -> list[Scored]:
        """Best first: a power-of-two pick among the near-best, then by predicted TTFT."""
        ranked = sorted(scored, key=lambda s: s.predicted_ms)
        if len(ranked) < 2:
            return ranked
        best = ranked[0].predicted_ms
        window = [s for s in ranked if s.predicted_ms <= best + self._routing.p2c_window_ms]
        if len(window) < 2:
            return ranked
        anchor = _new_prefix_anchor(window)
        if anchor is not None:
            chosen = max(window, key=lambda s: _rendezvous(anchor, s.id) * s.weight)
            return [chosen, *(s for s in ranked if s is not chosen)]
        a, b = self._pick_two(window)
        chosen = a if a.predicted_ms / a.weight <= b.predicted_ms / b.weight else b
        return [chosen, *(s for s in ranked if s is not chosen)]

    def _pick_two(self, window: Sequence[Scored]) -> tuple[Scored, Scored]:
        weights = [s.weight for s in window]
        first = self._rng.choices(range(len(window)), weights=weights)[0]
        rest = [i for i in range(len(window)) if i != first]
        second = self._rng.choices(rest, weights=[weights[i] for i in rest])[0]
        return window[first], window[second]


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _new_prefix_anchor(window: Sequence[Scored]) -> int | None:
    """The prefix's anchor when no candidate holds any of it, else None (affinity decides)."""
    prefix = window[0].prefix
    if prefix is None or not prefix.blocks or any(s.cached_tokens for s in window):
        return None
    return prefix.anchor


def _rendezvous(anchor: int, instance_id: str) -> float:
    """A uniform (0, 1] draw that every router computes alike for (prefix, instance)."""
    key = anchor.to_bytes(8, "big") + instance_id.encode()
    return (int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") + 1) / 2**64


def within_budget_first(ordered: Sequence[Scored]) -> list[Scored]:
    """Candidates that can start in time keep their order; the over-budget ones follow."""
    return [s for s in ordered if not s.over_budget] + [s for s in ordered if s.over_budget]
