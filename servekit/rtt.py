"""The region round-trip-time table: one type for the router's scorer, the
fleet simulator, the local topology and its delay proxies.

Lookup of ``rtt(a, b)``: the pair as written (``rtt_ms[a][b]``), else the
other way round (the table is symmetric when only one side is given), else
``same_region_ms`` when ``a == b`` (a user to a node in the same city), else
``default_ms`` (a pair the table does not name). The defaults are the
router's, which it has shipped with: 1 ms within a city, and 150 ms for an
unnamed pair, so a pair nobody measured looks far rather than near and is
not spilled to on a guess. Every shipped simulator and topology file sets
both explicitly.

:class:`MeasuredRtt` is the other source: the round trip a reader timed to
one peer (the router's ``/load`` polls), the minimum of the last few. A poll
also pays the peer's handling of it and any stall of either event loop, and
its first one a connection's set-up; the minimum of a recent window is the
path's own time, and a path that got longer shows within that window.
"""

from __future__ import annotations

from collections import deque

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DEFAULT_MS", "MEASURED_WINDOW", "SAME_REGION_MS", "MeasuredRtt", "RttTable"]

SAME_REGION_MS = 1.0
DEFAULT_MS = 150.0
MEASURED_WINDOW = 10  # timed requests a measured RTT is the minimum of (10 s of 1 s polls)


class RttTable(BaseModel):
    """Round-trip times in ms between regions."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rtt_ms: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="region -> region -> round-trip ms (either order)"
    )
    same_region_ms: float = Field(
        SAME_REGION_MS, ge=0, description="user to a node in the same city"
    )
    default_ms: float = Field(DEFAULT_MS, ge=0, description="pairs the table does not name")

    def rtt(self, a: str, b: str) -> float:
        """Round-trip ms between regions ``a`` and ``b``."""
        row = self.rtt_ms.get(a, {})
        if b in row:
            return row[b]
        back = self.rtt_ms.get(b, {})
        if a in back:
            return back[a]
        return self.same_region_ms if a == b else self.default_ms

    def one_way_s(self, a: str, b: str) -> float:
        """Half the round trip, in seconds (what a delay proxy holds each direction)."""
        return self.rtt(a, b) / 2000.0


class MeasuredRtt:
    """One peer's round trip as timed: the minimum of the last ``window`` samples."""

    __slots__ = ("_recent",)

    def __init__(self, window: int = MEASURED_WINDOW) -> None:
        self._recent: deque[float] = deque(maxlen=window)

    def add(self, ms: float) -> None:
        """A request to the peer answered ``ms`` after it was sent."""
        self._recent.append(ms)

    @property
    def ms(self) -> float | None:
        """The round trip in ms, None before any sample."""
        return min(self._recent) if self._recent else None
