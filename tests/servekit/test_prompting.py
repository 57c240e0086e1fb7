from __future__ import annotations

import pytest

from servekit.engine.prompting import CHATML, ChatTemplate, render_prompt
from servekit.engine.protocol import GenerationRequest, Message, SamplingParams
from servekit.errors import InvalidRequest


def req(*messages: Message, cont: bool = False) -> GenerationRequest:
    return GenerationRequest("r", SamplingParams(), messages=messages, continue_final_message=cont)


def test_chatml_with_generation_prompt() -> None:
    t = ChatTemplate(CHATML, "", "")
    text, templated = render_prompt(req(Message("user", "hi")), t)
    assert templated
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_continue_final_message_resumes_mid_turn() -> None:
    t = ChatTemplate(CHATML, "", "")
    text, _ = render_prompt(req(Message("user", "hi"), Message("assistant", "Hel"), cont=True), t)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nHel"


def test_continue_needs_assistant_last() -> None:
    with pytest.raises(InvalidRequest) as info:
        render_prompt(req(Message("user", "hi"), cont=True), ChatTemplate(CHATML, "", ""))
    assert info.value.param == "continue_final_message"


def test_template_raise_exception_becomes_400() -> None:
    t = ChatTemplate("{{ raise_exception('roles must alternate') }}", "", "")
    with pytest.raises(InvalidRequest) as info:
        render_prompt(req(Message("user", "hi")), t)
    assert "roles must alternate" in info.value.message


def test_completion_prompt_is_raw() -> None:
    r = GenerationRequest("r", SamplingParams(), prompt="Once upon")
    assert render_prompt(r, ChatTemplate(CHATML, "", "")) == ("Once upon", False)
