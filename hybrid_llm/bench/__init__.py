"""``hybrid-llm bench``: a streaming load generator for OpenAI-compatible servers.

Stepped concurrency or a Poisson request rate, prompt/output length buckets,
per-request TTFT/ITL/TPOT/E2E, percentiles and throughput per step and per
route (from the router's ``X-Route-*`` headers), the knee of the latency–load
curve, a JSON report, a PNG plot and a baseline comparison.
"""

from hybrid_llm.bench.client import RequestRecord, send_streaming
from hybrid_llm.bench.report import Regression, build_report, compare
from hybrid_llm.bench.runner import LoadStep, RunPlan, StepRun, Variant, run_plan
from hybrid_llm.bench.stats import find_knee, percentile, summarize
from hybrid_llm.bench.workload import Bucket, Workload, parse_bucket

__all__ = [
    "Bucket",
    "LoadStep",
    "Regression",
    "RequestRecord",
    "RunPlan",
    "StepRun",
    "Variant",
    "Workload",
    "build_report",
    "compare",
    "find_knee",
    "parse_bucket",
    "percentile",
    "run_plan",
    "send_streaming",
    "summarize",
]
