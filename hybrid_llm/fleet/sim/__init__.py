"""``hybrid-llm simulate``: a discrete-event simulator of the edge-plus-center fleet.

Pure Python on a heap of events: users in regions, an RTT table, edge and
center instances with engine profiles (prefill rate, batch-dependent decode
step), and a routing policy behind a small seam (:class:`Policy`); the hybrid
policies call the router's own scoring (``geo_router.scoring``).
"""

from hybrid_llm.fleet.sim.config import (
    CenterSpec,
    LengthDist,
    PolicySpec,
    RegionSpec,
    SimConfig,
    WarmState,
    WorkloadSpec,
)
from hybrid_llm.fleet.sim.instance import Instance
from hybrid_llm.fleet.sim.policy import AllToCenter, CenterPool, Fleet, Policy
from hybrid_llm.fleet.sim.profiles import PRESETS, EngineProfile
from hybrid_llm.fleet.sim.protection import EdgeProtection
from hybrid_llm.fleet.sim.report import summarize_result, tidy
from hybrid_llm.fleet.sim.simulation import SimResult, Simulation
from hybrid_llm.fleet.sim.sizing import Sizer, Slo, fleet_price, size_edges

__all__ = [
    "PRESETS",
    "AllToCenter",
    "CenterPool",
    "CenterSpec",
    "EdgeProtection",
    "EngineProfile",
    "Fleet",
    "Instance",
    "LengthDist",
    "Policy",
    "PolicySpec",
    "RegionSpec",
    "SimConfig",
    "SimResult",
    "Simulation",
    "Sizer",
    "Slo",
    "WarmState",
    "WorkloadSpec",
    "fleet_price",
    "size_edges",
    "summarize_result",
    "tidy",
]
