"""Trimming long conversations: the policy per tier and tenant, last resort, budgets,
and cutting inside a message that alone is longer than the budget."""

from __future__ import annotations

import json
import re
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

from geo_router.conversation import estimate_tokens
from geo_router.request import RouteRequest, upstream_body
from geo_router.routing_settings import RoutingSettings
from geo_router.scoring import Scored
from geo_router.trimming import trim_messages, truncate_text
from tests.geo_router.conftest import KEY, serve_fake
from tests.geo_router.fake_upstream import Behavior
from tests.geo_router.test_failover import routed, state
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
        "truncated_messages": 0,
        "omitted_chars": 0,
    }
    header = chosen.trim.header()
    assert header == f"dropped={chosen.trim.dropped}; tokens={chosen.trim.tokens}; budget=345"
    # The center's policy is off: it would get the whole conversation.
    center = next(c for c in p.plan(_body(messages), EAST, "u").candidates if c.tier == "center")
    assert center.trim is None


def test_trim_returns_nothing_when_it_fits_or_cannot() -> None:
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "hello"}]
    assert trim_messages(msgs, 100) is None
    # The system prompt is never cut: alone over the budget, no trim can help.
    long_system = [{"role": "system", "content": "x " * 2000}, {"role": "user", "content": "hi"}]
    assert trim_messages(long_system, 100) is None
    # No user turn to keep.
    assert trim_messages([{"role": "assistant", "content": "x " * 2000}], 100) is None


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


# -- one message longer than the budget: cut inside ---------------------------------

HEAD = "Summarize the following report in three bullet points.\n"
TAIL = "\nWhich of these findings matters most for next quarter?"


def _document(tokens: int) -> str:
    """A pasted document of about ``tokens`` estimated tokens between an instruction
    and a question, as the long single-message ShareGPT records are."""
    filler = "".join(f"Line {i}: the quarterly figures rose and fell. " for i in range(tokens))
    return HEAD + filler[: tokens * 4] + TAIL


def _cut_parts(text: str) -> tuple[str, int, str]:
    """``text`` split at its marker: head, characters omitted, tail."""
    found = re.search(r"\n\[\.\.\. (\d+) characters omitted \.\.\.\]\n", text)
    assert found is not None, text[:200]
    return text[: found.start()], int(found.group(1)), text[found.end() :]


@pytest.mark.parametrize("budget", [40, 1000, 6000])
def test_truncate_text_keeps_head_and_tail_with_a_marker_within_the_estimate(budget: int) -> None:
    text = _document(10_000)
    cut = truncate_text(text, budget)
    assert cut is not None
    short, omitted = cut
    assert budget - 2 <= estimate_tokens(short) <= budget  # the budget used, not exceeded
    head, named, tail = _cut_parts(short)
    assert named == omitted == len(text) - len(head) - len(tail)
    assert text.startswith(head)
    assert text.endswith(tail)
    assert abs(len(head) - len(tail)) <= 1  # half each
    if budget >= 1000:
        assert head.startswith(HEAD)
        assert tail.endswith(TAIL)


def test_truncate_text_counts_cjk_as_the_estimator_does() -> None:
    text = "请总结下面的文章。" + "中文文本" * 3000 + "最重要的是什么?"
    cut = truncate_text(text, 500)
    assert cut is not None
    assert 490 <= estimate_tokens(cut[0]) <= 500
    assert cut[0].startswith("请总结")
    assert cut[0].endswith("最重要的是什么?")
    assert truncate_text(text, 5) is None  # the marker alone is longer
    assert truncate_text("short", 5) == ("short", 0)


def test_a_single_message_longer_than_the_budget_is_cut_inside() -> None:
    system = {"role": "system", "content": "Be brief."}
    huge = {"role": "user", "content": _document(10_000)}
    trim = trim_messages([system, huge], 1600)
    assert trim is not None
    assert (trim.dropped, trim.truncated) == (0, 1)
    assert trim.tokens <= 1600
    assert trim.messages[0] == system
    head, omitted, tail = _cut_parts(trim.messages[1]["content"])
    assert head.startswith(HEAD)
    assert tail.endswith(TAIL)
    assert trim.omitted_chars == omitted
    assert trim.header().endswith(f"; truncated=1; omitted_chars={omitted}")
    # With history before it, the history goes first, then the cut.
    history = [
        {"role": "user", "content": "earlier question"},
        {"role": "assistant", "content": "earlier answer"},
    ]
    trim = trim_messages([system, *history, huge], 1600)
    assert trim is not None
    assert (trim.dropped, trim.truncated, len(trim.messages)) == (2, 1, 2)


def test_only_the_latest_turns_text_is_cut_and_a_continued_answer_keeps_its_end() -> None:
    """A tool result after the user turn may be cut (the longer is cut first); a
    partial answer being continued and list content are never cut."""
    system = {"role": "system", "content": "Use the tool."}
    ask = {"role": "user", "content": "What does the page say? " * 40}  # ~240 tokens
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}
    page = {"role": "tool", "tool_call_id": "1", "content": _document(8000)}
    trim = trim_messages([system, ask, call, page], 1000)
    assert trim is not None
    assert trim.messages[:3] == [system, ask, call]  # the shorter turn stays whole
    assert trim.truncated == 1
    assert trim.tokens <= 1000
    partial = {"role": "assistant", "content": "So far I found"}
    huge = {"role": "user", "content": _document(10_000)}
    trim = trim_messages([system, huge, partial], 1000)
    assert trim is not None
    assert trim.messages[-1] == partial
    parts = [{"type": "text", "text": _document(10_000)}, {"type": "image_url", "image_url": {}}]
    assert trim_messages([system, {"role": "user", "content": parts}], 1000) is None


# The local topology's windows, as fakes that refuse what exceeds them (4 characters
# a token), trimming as a last resort on both tiers.
EDGE_WINDOW, CENTER_WINDOW = 2048, 8192
ROUTER_AUTH = {"Authorization": f"Bearer {KEY}"}


def _windows(stack: ExitStack, **routing: Any) -> tuple[str, Behavior, Behavior]:
    edge, center = Behavior(words=3), Behavior(words=3)
    edge.max_prompt_chars, center.max_prompt_chars = EDGE_WINDOW * 4, CENTER_WINDOW * 4
    a, b = stack.enter_context(serve_fake(edge)), stack.enter_context(serve_fake(center))
    states = [
        state(a, "edge-a", window=EDGE_WINDOW),
        state(b, "center", "center", "center", window=CENTER_WINDOW),
    ]
    return stack.enter_context(routed(states, ttft_deadline_s=5.0, **routing)), edge, center


def _ask(url: str, content: Any) -> httpx.Response:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": content}]
    body = {"model": "auto", "max_tokens": 16, "stream": False, "messages": messages}
    return httpx.post(url + "/v1/chat/completions", json=body, headers=ROUTER_AUTH, timeout=20)


def test_a_message_longer_than_every_window_is_served_cut_and_says_so() -> None:
    """Issue 31: with trimming on, a 10,000-token single message is served."""
    last_resort = {"enabled": True, "last_resort": True}
    document = _document(10_000)
    with ExitStack() as stack:
        url, edge, center = _windows(stack, trimming={"edge": last_resort, "center": last_resort})
        body = {
            "model": "auto",
            "max_tokens": 16,
            "messages": [{"role": "user", "content": document}],
        }
        r = httpx.post(url + "/v1/route/explain", json=body, headers=ROUTER_AUTH, timeout=20)
        assert r.status_code == 200, r.text
        for cand in r.json()["candidates"]:
            assert cand["trimmed"]["truncated_messages"] == 1
            assert cand["trimmed"]["tokens"] <= cand["trimmed"]["budget"]
        r = _ask(url, document)
        assert r.status_code == 200, r.text
        fields = dict(part.split("=") for part in r.headers["x-route-trimmed"].split("; "))
        assert fields["truncated"] == "1"
        assert int(fields["omitted_chars"]) > 0
        (seen,) = [*edge.seen, *center.seen]
        sent = seen["body"]["messages"]
        assert sent[0] == {"role": "system", "content": "Be brief."}
        head, omitted, tail = _cut_parts(sent[1]["content"])
        assert str(omitted) == fields["omitted_chars"]
        assert head.startswith(HEAD)
        assert tail.endswith(TAIL)


def test_with_trimming_off_the_widest_windows_400_reaches_the_client() -> None:
    with ExitStack() as stack:
        url, edge, center = _windows(stack)
        document = _document(10_000)
        r = _ask(url, document)
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "context_length_exceeded"
        assert "x-route-trimmed" not in r.headers
        assert edge.seen == []  # offered to the widest window only, whole
        assert center.seen[-1]["body"]["messages"][1]["content"] == document


def test_list_content_is_left_whole_and_gets_the_400() -> None:
    last_resort = {"enabled": True, "last_resort": True}
    with ExitStack() as stack:
        url, _, center = _windows(stack, trimming={"edge": last_resort, "center": last_resort})
        parts = [{"type": "text", "text": _document(10_000)}]
        r = _ask(url, parts)
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "context_length_exceeded"
        assert center.seen[-1]["body"]["messages"][1]["content"] == parts
