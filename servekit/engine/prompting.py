"""From chat messages to prompt tokens, the same way for every llama.cpp engine.

The chat template comes from the GGUF (``tokenizer.chat_template``) and is
rendered with a sandboxed Jinja environment, as Hugging Face does. A request
that continues an unfinished assistant turn (``continue_final_message``) is
rendered with the final message as a placeholder and cut there, so the model
resumes mid-turn instead of opening a new one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from servekit.engine.protocol import GenerationRequest, Message
from servekit.errors import ContextLengthExceeded, InvalidRequest

__all__ = [
    "ChatTemplate",
    "Tokenizer",
    "completion_budget",
    "nonempty",
    "render_prompt",
    "tokenize_request",
]

# Used when a GGUF carries no template: ChatML, which most small instruct models use.
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_PLACEHOLDER = "\x00__servekit_continue__\x00"


class Tokenizer(Protocol):
    """The few tokenizer operations the engines need (llama.cpp's vocab)."""

    def tokenize(self, text: bytes, add_bos: bool, special: bool) -> list[int]: ...

    def piece(self, token: int) -> bytes: ...

    def is_eog(self, token: int) -> bool: ...


def _raise(message: str) -> None:
    raise InvalidRequest(f"chat template rejected the conversation: {message}", param="messages")


@dataclass
class ChatTemplate:
    source: str
    bos_token: str
    eos_token: str

    def __post_init__(self) -> None:
        env = ImmutableSandboxedEnvironment(
            loader=jinja2.BaseLoader(),
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[jinja2.ext.loopcontrols],
        )
        env.globals["raise_exception"] = _raise
        self._template = env.from_string(self.source)

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, str], bos: str, eos: str) -> ChatTemplate:
        return cls(metadata.get("tokenizer.chat_template") or CHATML, bos, eos)

    def render(self, messages: Sequence[Message], *, continue_final: bool = False) -> str:
        msgs: list[dict[str, Any]] = [{"role": m.role, "content": m.content} for m in messages]
        if continue_final:
            if not msgs or msgs[-1]["role"] != "assistant":
                raise InvalidRequest(
                    "continue_final_message needs a final assistant message",
                    param="continue_final_message",
                )
            partial = msgs[-1]["content"]
            msgs[-1] = {"role": "assistant", "content": _PLACEHOLDER}
        try:
            text = self._template.render(
                messages=msgs,
                add_generation_prompt=not continue_final,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except InvalidRequest:
            raise
        except jinja2.TemplateError as exc:
            raise InvalidRequest(f"chat template failed: {exc}", param="messages") from None
        if continue_final:
            head, sep, _ = text.partition(_PLACEHOLDER)
            if not sep:
                raise InvalidRequest(
                    "this model's chat template cannot continue a message",
                    param="continue_final_message",
                )
            text = head + partial
        return text


def render_prompt(request: GenerationRequest, template: ChatTemplate) -> tuple[str, bool]:
    """The prompt text, and whether it is chat-templated (templates add BOS themselves)."""
    if request.messages is not None:
        return template.render(
            request.messages, continue_final=request.continue_final_message
        ), True
    return request.prompt or "", False


def tokenize_request(
    request: GenerationRequest, template: ChatTemplate, tokenizer: Tokenizer, add_bos: bool
) -> list[int]:
    text, templated = render_prompt(request, template)
    bos = add_bos and not (templated and template.bos_token and text.startswith(template.bos_token))
    # Lone surrogates can arrive through JSON escapes; never let them crash encoding.
    return tokenizer.tokenize(text.encode("utf-8", errors="replace"), bos, True)


def nonempty(tokens: list[int], bos: int) -> list[int]:
    """An empty prompt still needs one token to condition on, as OpenAI's
    <|endoftext|> default does; models without BOS refuse it."""
    if tokens:
        return tokens
    if bos < 0:
        raise InvalidRequest("prompt must not be empty", param="prompt")
    return [bos]


def completion_budget(
    prompt_tokens: int, max_tokens: int | None, n_ctx: int, default_cap: int | None = None
) -> int:
    """How many tokens a completion may have in a window of ``n_ctx``, or the 400.

    A prompt that fills the window, or a ``max_tokens`` larger than the whole
    window, is refused; a ``max_tokens`` that only exceeds what the prompt
    leaves is trimmed to fit (finish reason "length"), as llama.cpp's server
    does. Every llama.cpp engine applies these same rules.
    """
    if prompt_tokens >= n_ctx:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {n_ctx} tokens; the prompt has "
            f"{prompt_tokens} tokens.",
            param="messages",
        )
    room = n_ctx - prompt_tokens
    if max_tokens is None:
        return room if default_cap is None else min(room, default_cap)
    if max_tokens > n_ctx:
        raise ContextLengthExceeded(
            f"max_tokens is too large: {max_tokens}. This model's context holds "
            f"{n_ctx} tokens in all.",
            param="max_tokens",
        )
    # Within the window but past what the prompt leaves: generate what fits and
    # finish with "length", as llama.cpp's server does.
    return min(max_tokens, room)
