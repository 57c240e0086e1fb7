"""The latency–load plot: TTFT, TPOT and E2E percentiles against load, one line
per variant, the knee marked. Written with matplotlib's Agg backend (no display)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["write_plot"]


def write_plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "E2E"))
    fig, axes = plt.subplots(1, len(metrics) + 1, figsize=(18, 4.5))
    variants = list(report["meta"]["variants"])
    mode = report["steps"][0]["mode"] if report["steps"] else "concurrency"
    xlabel = "concurrency" if mode == "concurrency" else "offered rate (req/s)"
    for variant in variants:
        steps = [s for s in report["steps"] if s["variant"] == variant]
        load = [s["load"] for s in steps]
        for ax, (key, title) in zip(axes, metrics, strict=False):
            for q, style in (("p50", "-"), ("p99", "--")):
                ys = [s["summary"][key][q] for s in steps]
                pts = [(x, y) for x, y in zip(load, ys, strict=True) if y is not None]
                if pts:
                    ax.plot(*zip(*pts, strict=True), style, marker="o", label=f"{variant} {q}")
            ax.set_title(f"{title} (ms)")
            ax.set_xlabel(xlabel)
        tput = [s["summary"]["output_tokens_per_s"] for s in steps]
        axes[-1].plot(load, tput, marker="o", label=variant)
        knee = report["knee"].get(variant)
        if knee:
            for ax in axes:
                ax.axvline(knee["load"], color="grey", linestyle=":", linewidth=1)
    axes[-1].set_title("throughput (output tokens/s)")
    axes[-1].set_xlabel(xlabel)
    loads = [s["load"] for s in report["steps"]]
    geometric = bool(loads) and min(loads) > 0 and max(loads) / min(loads) >= 8
    for ax in axes:
        if geometric:  # stepped 1, 2, 4, 8...: equal spacing reads better
            ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{report['meta']['url']} ({report['meta']['model']})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
