"""``hybrid-llm bench``: a streaming load generator for OpenAI-compatible servers.

Stepped concurrency or a Poisson request rate; conversation workloads
(customer service, multi-turn chat, long context, the labelled mix, or a
dataset file) or synthetic length buckets; per-request TTFT/ITL/TPOT/E2E,
percentiles and throughput per step, per route (from the router's
``X-Route-*`` headers: tier shares, same-city share) and per workload; 429s
counted apart; the knee of the latency–load curve, a JSON report, a PNG plot
and a baseline comparison.
"""

from hybrid_llm.bench.client import RequestRecord, send_streaming
from hybrid_llm.bench.conversations import Conversation, ConversationWorkload, builtin_workload
from hybrid_llm.bench.datasets import dataset_workload, parse_dataset
from hybrid_llm.bench.report import Regression, build_report, compare
from hybrid_llm.bench.runner import LoadStep, RunPlan, StepRun, Variant, run_plan
from hybrid_llm.bench.stats import find_knee, percentile, summarize
from hybrid_llm.bench.workload import Bucket, Workload, parse_bucket

__all__ = [
    "Bucket",
    "Conversation",
    "ConversationWorkload",
    "LoadStep",
    "Regression",
    "RequestRecord",
    "RunPlan",
    "StepRun",
    "Variant",
    "Workload",
    "build_report",
    "builtin_workload",
    "compare",
    "dataset_workload",
    "find_knee",
    "parse_bucket",
    "parse_dataset",
    "percentile",
    "run_plan",
    "send_streaming",
    "summarize",
]
