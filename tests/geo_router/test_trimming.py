"""Trimming long conversations: the policy per tier and tenant, last resort, budgets."""

from __future__ import annotations

import json
from typing import Any

import pytest

from geo_router.request import RouteRequest, upstream_body
from geo_router.scoring import Scored
from geo_router.settings import RoutingSettings
from geo_router.trimming import trim_messages
from tests.geo_router.test_placement import EAST, inst, planner


def _conversation(turns: int, words: int = 80) -> list[dict[str, str]]:
    history = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "word " * words}
        for i in range(turns)
    ]
    return [{"role": "system", "content": "Be brief."}, *history, {"role": "user", "content": "ok"}]


def payload(body: dict[str, Any], cand: Scored) -> bytes:
    """What ``cand`` is sent for ``body``."""
    req = RouteRequest(body, "chat", "/v1/chat/completions", EAST, "sticky", {}, 0.0)
    return upstream_body(req, cand)


def _body(messages: list[dict[str, str]], model: str = "auto") -> dict[str, Any]:
    return {"model": model, "max_tokens": 64, "messages": messages}


# Same engines (the local topology's CPU stand-ins): only the window differs.
EDGE_AND_CENTER = [
    inst("edge-a", max_context_tokens=512, prefill_tokens_per_s=150.0),
    inst("center", "center", "center", max_context_tokens=8192, prefill_tokens_per_s=150.0),
]


def test_trimming_is_opt_in_per_tier_and_keeps_the_system_prompt_and_latest_turns() -> None:
    messages = _conversation(12)
    p, _, _ = planner(EDGE_AND_CENTER, trimming={"edge": {"enabled": True}})
    chosen = p.plan(_body(messages), EAST, "u").candidates[0]
    assert chosen.id == "edge-a"
    assert chosen.trim is not None
    kept = chosen.trim.messages
    assert kept[0]["content"] == "Be brief."
    assert kept[-1]["content"] == "ok"
    assert kept[1]["role"] == "user"
    assert messages[-len(kept) + 1 :] == kept[1:]
    # The budget is window_share (0.8) of the window, less the answer's tokens.
    assert chosen.trim.budget == int(512 * 0.8) - 64
    assert chosen.trim.tokens <= chosen.trim.budget
    assert chosen.to_dict()["trimmed"] == {
        "dropped_messages": chosen.trim.dropped,
        "tokens": chosen.trim.tokens,
        "budget": chosen.trim.budget,
    }
    header = chosen.trim.header()
    assert header == f"dropped={chosen.trim.dropped}; tokens={chosen.trim.tokens}; budget=345"
    # The center's policy is off: it would get the whole conversation.
    center = next(c for c in p.plan(_body(messages), EAST, "u").candidates if c.tier == "center")
    assert center.trim is None


def test_trim_returns_nothing_when_it_fits_or_cannot() -> None:
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "hello"}]
    assert trim_messages(msgs, 100) is None
    huge = [{"role": "system", "content": "s"}, {"role": "user", "content": "x " * 2000}]
    assert trim_messages(huge, 100) is None


LAST_RESORT = {"enabled": True, "last_resort": True}


def test_a_last_resort_policy_trims_only_what_no_tier_can_hold() -> None:
    p, _, _ = planner(EDGE_AND_CENTER, trimming={"edge": LAST_RESORT, "center": LAST_RESORT})
    # ~1,000 tokens: too long for the edge, whole at the center, so nobody trims.
    between = p.plan(_body(_conversation(12)), EAST, "u")
    assert 512 < between.prompt_tokens < 8192
    assert [(c.id, c.trim) for c in between.candidates] == [("center", None)]
    # ~10,000 tokens: no window holds it, so each tier trims to its own budget.
    beyond = p.plan(_body(_conversation(120)), EAST, "u")
    assert beyond.prompt_tokens > 8192
    assert beyond.fits
    budgets = {c.id: c.trim.budget for c in beyond.candidates if c.trim is not None}
    assert budgets == {"edge-a": int(512 * 0.8) - 64, "center": int(8192 * 0.8) - 64}


def test_a_tenant_has_its_own_policy_per_tier() -> None:
    trimming = {"tenants": {"batch-jobs": {"edge": {"enabled": True}}}}
    p, _, _ = planner(EDGE_AND_CENTER, trimming=trimming)
    body = _body(_conversation(12))
    others = p.plan(body, EAST, "u", tenant="dev").candidates
    assert [c.id for c in others] == ["center"]
    batch = p.plan(body, EAST, "u", tenant="batch-jobs").candidates
    assert {c.id: c.trim is not None for c in batch} == {"edge-a": True, "center": False}
    # A tenant's entry replaces the tier default; other tiers keep the default.
    routing = RoutingSettings.model_validate(
        {"trimming": {"edge": {"enabled": True}, "tenants": {"vip": {"edge": {"enabled": False}}}}}
    )
    policy = routing.trimming.policy
    assert policy("edge", "vip") is not None
    assert not policy("edge", "vip").enabled  # type: ignore[union-attr]
    assert policy("edge", "dev").enabled  # type: ignore[union-attr]
    assert policy("center", "vip") is None


def test_a_tier_pinned_too_small_is_offered_anyway_so_its_own_400_answers() -> None:
    """Not a 503 "no healthy upstream": the pinned tier's widest instances say why."""
    p, _, _ = planner(EDGE_AND_CENTER)
    pinned = p.plan(_body(_conversation(12), model="edge"), EAST, "u")
    assert [c.id for c in pinned.candidates] == ["edge-a"]
    assert pinned.fits is False
    # With its tier's trimming on, the pinned tier trims instead.
    p, _, _ = planner(EDGE_AND_CENTER, trimming={"edge": LAST_RESORT})
    trimmed = p.plan(_body(_conversation(12), model="edge"), EAST, "u").candidates
    assert [c.id for c in trimmed] == ["edge-a"]
    assert trimmed[0].trim is not None


@pytest.mark.parametrize("share", [0, 1.5])
def test_window_share_is_a_share(share: float) -> None:
    with pytest.raises(ValueError, match="window_share"):
        RoutingSettings.model_validate({"trimming": {"edge": {"window_share": share}}})


def test_a_continuation_of_a_trimmed_conversation_keeps_its_partial_answer() -> None:
    """The body of a continuation is the conversation plus the partial answer: the
    trim keeps what it kept and the answer after it, not the bare trimmed list."""
    messages = _conversation(12)
    p, _, _ = planner(EDGE_AND_CENTER, trimming={"edge": {"enabled": True}})
    chosen = p.plan(_body(messages), EAST, "u").candidates[0]
    assert chosen.trim is not None
    partial = {"role": "assistant", "content": "So far I"}
    body = {**_body([*messages, partial]), "continue_final_message": True}
    sent = json.loads(payload(body, chosen))
    assert sent["messages"] == [*chosen.trim.messages, partial]
    assert json.loads(payload(_body(messages), chosen))["messages"] == chosen.trim.messages
