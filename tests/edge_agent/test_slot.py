"""The leased engine passes through what admission asks an engine that can tell."""

from __future__ import annotations

from edge_agent.slot import ModelSlot
from hybrid_llm.local.scripted_engine import ScriptedEngine
from servekit.engine.protocol import prefill_backlog_ahead_ms, slot_hold_ms, slot_release_ms


class _ShortestFirst(ScriptedEngine):
    def prefill_backlog_ahead_ms(self, tokens: int) -> float | None:
        return float(tokens)  # only what goes before a prompt of this size

    def slot_hold_ms(self, tokens: int, max_tokens: int | None) -> float | None:
        return float(tokens + (max_tokens or 0))  # its own prompt and answer


def test_admissions_questions_reach_the_engine_behind_the_lease() -> None:
    engine = _ShortestFirst("m")
    engine.slot_releases = (120.0, 3000.0)
    leased = ModelSlot(engine, "v1").current()
    assert slot_release_ms(leased) == (120.0, 3000.0)
    assert prefill_backlog_ahead_ms(leased, 40) == 40.0
    assert slot_hold_ms(leased, 40, 32) == 72.0
    plain = ModelSlot(ScriptedEngine("m"), "v1").current()
    assert slot_release_ms(plain) is None
    assert prefill_backlog_ahead_ms(plain, 40) is None
    assert slot_hold_ms(plain, 40, 32) is None
