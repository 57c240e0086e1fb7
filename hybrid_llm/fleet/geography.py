"""The region RTT table shared by the simulator, the delay proxies and the
local topology: symmetric, zero (plus a same-city floor) on the diagonal."""

from __future__ import annotations

from pydantic import BaseModel, Field

__all__ = ["RttTable"]


class RttTable(BaseModel):
    """Round-trip times in ms between regions; missing pairs use ``default_ms``."""

    rtt_ms: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="region -> region -> round-trip ms (either order)"
    )
    same_region_ms: float = Field(2.0, ge=0, description="user to a node in the same city")
    default_ms: float = Field(80.0, ge=0, description="pairs the table does not name")

    def rtt(self, a: str, b: str) -> float:
        """Round-trip ms between regions ``a`` and ``b``."""
        if a == b:
            return self.same_region_ms
        row = self.rtt_ms.get(a, {})
        if b in row:
            return row[b]
        back = self.rtt_ms.get(b, {})
        return back.get(a, self.default_ms)

    def one_way_s(self, a: str, b: str) -> float:
        return self.rtt(a, b) / 2000.0
