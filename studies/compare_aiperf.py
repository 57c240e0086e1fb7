"""Compare a ``hybrid-llm bench`` report with an ``aiperf`` run on the same target.

    python -m studies.compare_aiperf BENCH.json AIPERF_DIR/profile_export_aiperf.json

Prints TTFT, TPOT (aiperf's per-request "inter_token_latency" is our TPOT),
E2E and throughput side by side with the relative difference. The procedure
that produces both files is in docs/operations.md ("Checking the bench
against aiperf"); run both at the same concurrency, request count and lengths.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bench", type=Path, help="the hybrid-llm bench --out report")
    p.add_argument("aiperf", type=Path, help="aiperf's profile_export_aiperf.json")
    args = p.parse_args()
    bench = json.loads(args.bench.read_text())
    aiperf = json.loads(args.aiperf.read_text())
    if len(bench["steps"]) != 1:
        raise SystemExit("compare one bench step (one --concurrency value, one variant)")
    ours: dict[str, Any] = bench["steps"][0]["summary"]
    rows = [
        ("TTFT p50 ms", ours["ttft_ms"]["p50"], aiperf["time_to_first_token"]["p50"]),
        ("TTFT p99 ms", ours["ttft_ms"]["p99"], aiperf["time_to_first_token"]["p99"]),
        ("TPOT p50 ms", ours["tpot_ms"]["p50"], aiperf["inter_token_latency"]["p50"]),
        ("TPOT p99 ms", ours["tpot_ms"]["p99"], aiperf["inter_token_latency"]["p99"]),
        ("E2E p50 ms", ours["e2e_ms"]["p50"], aiperf["request_latency"]["p50"]),
        ("E2E p99 ms", ours["e2e_ms"]["p99"], aiperf["request_latency"]["p99"]),
        ("requests/s", ours["requests_per_s"], aiperf["request_throughput"]["avg"]),
        ("output tokens/s", ours["output_tokens_per_s"], aiperf["output_token_throughput"]["avg"]),
    ]
    print(f"{'metric':<18}{'hybrid-llm bench':>18}{'aiperf':>12}{'diff':>9}")
    for name, a, b in rows:
        diff = (a - b) / b * 100 if b else float("nan")
        print(f"{name:<18}{a:>18.2f}{b:>12.2f}{diff:>8.1f}%")


if __name__ == "__main__":
    main()
