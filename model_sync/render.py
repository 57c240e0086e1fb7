"""Rich tables for the ops CLI (``--json`` bypasses all of this: :func:`out`)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table

from model_sync.records import ArtifactRecord, HistoryEntry, RolloutPlan, RolloutState
from model_sync.status import FleetStatus

__all__ = [
    "history_table",
    "out",
    "plan_table",
    "rollout_line",
    "status_view",
    "versions_table",
]

_STATE_STYLE = {
    "serving": "green",
    "downloading": "cyan",
    "loading": "cyan",
    "failed": "bold red",
    "unknown": "dim",
}
_ROLLOUT_STYLE = {
    "running": "cyan",
    "paused": "yellow",
    "rolling_back": "bold red",
    "completed": "green",
    "aborted": "yellow",
    "rolled_back": "red",
}


def out(console: Console, as_json: bool, data: Any, human: Any = None) -> None:
    """A command's result: ``data`` as JSON on stdout, or ``human`` on the console."""
    if as_json:
        print(json.dumps(data, indent=2, default=str))
    elif human is not None:
        console.print(human)


def when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def versions_table(
    records: Sequence[ArtifactRecord],
    aliases: dict[str, dict[str, str]],
    shares: dict[str, dict[str, float]],
) -> Table:
    table = Table(title="model versions")
    for col in ("model", "version", "aliases", "traffic", "format", "size", "sha256", "pushed"):
        table.add_column(col, justify="right" if col in ("size", "traffic") else "left")
    table.add_column("by")
    table.add_column("signed by")
    for r in records:
        names = sorted(a for a, v in aliases.get(r.name, {}).items() if v == r.version)
        share = shares.get(r.name, {}).get(r.version)
        table.add_row(
            r.name,
            r.version,
            ", ".join(names),
            f"{share:.0%}" if share else "",
            r.format,
            size(r.size),
            r.sha256[:12],
            time.strftime("%m-%d %H:%M", time.localtime(r.created_at)),
            r.created_by,
            r.signed_by or "unsigned",
        )
    for column in table.columns:
        column.no_wrap = True
    return table


def plan_table(plan: RolloutPlan) -> Table:
    table = Table(
        title=f"rollout {plan.model} {plan.from_version or '?'} → {plan.version} ({plan.id})"
    )
    for col in ("#", "wave", "nodes", "bake"):
        table.add_column(col)
    for i, wave in enumerate(plan.waves):
        table.add_row(str(i), wave.name, ", ".join(wave.nodes), f"{wave.bake_s:g}s")
    g = plan.gates
    table.caption = (
        f"gates: error rate ≤ {g.max_error_rate:.1%} and ≤ old +{g.max_error_rate_increase:.1%}; "
        f"TTFT P95 ≤ old × {g.max_ttft_p95_ratio:g} + {g.ttft_slack_ms:g} ms; "
        f"at least {g.min_requests} requests"
    )
    return table


def rollout_line(state: RolloutState, plan: RolloutPlan | None) -> str:
    style = _ROLLOUT_STYLE.get(state.status, "")
    waves = len(plan.waves) if plan else 0
    wave = plan.waves[state.wave].name if plan and state.wave < waves else "?"
    line = f"[{style}]{state.status}[/] {state.model} → {state.version}"
    if state.active:
        line += f"  wave {state.wave + 1}/{waves} ({wave}), step {state.step}"
    if state.reason:
        line += f"\n  reason: {state.reason}"
    if state.last_gate:
        figures = ", ".join(f"{k}={v}" for k, v in state.last_gate.items() if v is not None)
        line += f"\n  last gate: {figures}"
    return line


def status_view(status: FleetStatus) -> Group:
    """Rollout line, traffic split and the node table, as one renderable."""
    parts: list[RenderableType] = []
    if status.rollout is not None:
        parts.append(rollout_line(status.rollout, status.plan))
    if status.shares:
        parts.append(
            "traffic: " + ", ".join(f"{v} {f:.0%}" for v, f in sorted(status.shares.items()))
        )
    table = Table(title="edge nodes")
    columns = ("node", "region", "model", "desired", "actual", "state", "health", "ttft p95")
    for col in columns:
        table.add_column(col, no_wrap=True)
    table.add_column("ok/failed", justify="right")
    table.add_column("error", overflow="fold")
    for n in status.nodes:
        style = _STATE_STYLE.get(n.state, "")
        state = n.state
        if n.progress is not None:
            state += f" {n.progress:.0%}"
        health = {True: "[green]healthy", False: "[red]down", None: "[dim]?"}[n.healthy]
        desired = n.desired or "-"
        if not n.in_sync:
            desired = f"[yellow]{desired}"
        table.add_row(
            n.node,
            n.region,
            n.model,
            desired,
            n.version or "-",
            f"[{style}]{state}" if style else state,
            health,
            f"{n.ttft_p95_ms:.0f} ms" if n.ttft_p95_ms is not None else "-",
            f"{n.requests_ok}/{n.requests_failed}",
            n.error or "",
        )
    return Group(*parts, table)


def history_table(entries: Sequence[HistoryEntry]) -> Table:
    table = Table(title="history")
    for col in ("when", "who", "action", "model", "version", "detail"):
        table.add_column(col)
    for e in entries:
        detail = e.detail
        if e.nodes:
            detail = f"{detail} [{', '.join(e.nodes)}]" if detail else ", ".join(e.nodes)
        table.add_row(when(e.at), e.actor, e.action, e.model, e.version, detail)
    return table
