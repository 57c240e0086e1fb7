"""What the local Consul agent's settings mean for this fleet (``/v1/agent/self``).

Checked once when a Consul registry opens; each finding is logged as a
warning. The settings that matter (Consul's ``agent/local/state.go`` and
``agent/config/default.go``):

* ``check_update_interval`` (default ``5m``): a heartbeat that changes only a
  check's output reaches the servers after half of it plus a random stagger
  of up to all of it, so catalog copies of load lag up to 1.5x the interval.
  Routers read live load from each instance's ``/load`` and do not care;
  readers of the catalog's figures (``model-sync status``, rollout gates) do.
  ``0`` turns every heartbeat into a write on the servers.
* ``discard_check_output``: the catalog then carries no load at all.
* ``check_output_max_size`` (4096): a load report longer than that is cut.
* the agent's ``Datacenter``: registrations always land in the datacenter of
  the agent that takes them (agent endpoints ignore ``?dc=``), so a service
  configured for another datacenter would register where nobody reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from servekit.durations import parse_duration

__all__ = ["STALE_CATALOG_LOAD_S", "AgentFacts", "agent_facts", "judge_agent"]

# Catalog copies of load older than this draw a warning (deploy/consul sets
# check_update_interval = "30s": at most 45 s).
STALE_CATALOG_LOAD_S = 60.0
_OUTPUT_MAX_DEFAULT = 4096


@dataclass(frozen=True, slots=True)
class AgentFacts:
    node: str
    datacenter: str
    check_update_interval_s: float | None  # None: the agent did not say
    discard_check_output: bool
    check_output_max_size: int | None


def agent_facts(body: Mapping[str, Any]) -> AgentFacts:
    config = body.get("Config") or {}
    debug = body.get("DebugConfig") or {}
    interval = debug.get("CheckUpdateInterval")
    size = debug.get("CheckOutputMaxSize")
    return AgentFacts(
        node=str(config.get("NodeName", "?")),
        datacenter=str(config.get("Datacenter", "")),
        check_update_interval_s=parse_duration(interval) if isinstance(interval, str) else None,
        discard_check_output=bool(debug.get("DiscardCheckOutput", False)),
        check_output_max_size=int(size) if isinstance(size, int) else None,
    )


def judge_agent(facts: AgentFacts, datacenter: str | None) -> list[str]:
    """Warnings for settings this fleet's design does not work well with."""
    out = []
    where = f"consul agent {facts.node}"
    fix = 'set check_update_interval = "30s" on agents that host instances (deploy/consul)'
    interval = facts.check_update_interval_s
    if interval == 0:
        out.append(
            f"{where} has check_update_interval 0: every heartbeat becomes a catalog write on"
            f" the servers; {fix}"
        )
    elif interval is not None and 1.5 * interval > STALE_CATALOG_LOAD_S:
        out.append(
            f"{where} forwards load-only heartbeats to the catalog after up to"
            f" {1.5 * interval:.0f}s (check_update_interval {interval:g}s): routers read live"
            " load from /load and are not affected, but load figures read from the catalog"
            f" (model-sync status, rollout gates) can be that old; {fix}"
        )
    if facts.discard_check_output:
        out.append(
            f"{where} discards check output (discard_check_output): the catalog carries no load"
            " reports, so model-sync status and rollout gates see no instance figures"
        )
    size = facts.check_output_max_size
    if size is not None and size < _OUTPUT_MAX_DEFAULT:
        out.append(f"{where} cuts check output at {size} bytes: load reports may be cut")
    if datacenter and facts.datacenter and datacenter != facts.datacenter:
        out.append(
            f"{where} is in datacenter {facts.datacenter!r} but registry.consul.datacenter is"
            f" {datacenter!r}: instances register through their local agent into"
            f" {facts.datacenter!r} (agent endpoints ignore the datacenter), while this service"
            f" reads {datacenter!r}"
        )
    return out
