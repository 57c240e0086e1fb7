"""PROVISIONAL until servekit.engine.prompting / textstream land on main."""

from __future__ import annotations

import codecs

import jinja2

from servekit.engine.batching_llama import LlamaBatchModel
from servekit.engine.protocol import GenerationRequest


class _Text:
    def __init__(self, model: LlamaBatchModel, stop: tuple[str, ...]) -> None:
        self._model = model
        self._stop = stop
        self._dec = codecs.getincrementaldecoder("utf-8")("replace")
        self._held = ""
        self.stopped = False

    def feed(self, token: int) -> str:
        self._held += self._dec.decode(self._model.piece(token))
        for s in self._stop:
            i = self._held.find(s)
            if i >= 0:
                self.stopped = True
                out, self._held = self._held[:i], ""
                return out
        keep = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(self._held)), 0, -1):
                if self._held.endswith(s[:k]):
                    keep = max(keep, k)
                    break
        out = self._held[: len(self._held) - keep]
        self._held = self._held[len(out) :]
        return out

    def flush(self) -> str:
        out, self._held = self._held + self._dec.decode(b"", final=True), ""
        return out


class PromptMaker:
    def __init__(self, model: LlamaBatchModel) -> None:
        self._model = model
        tpl = model.metadata("tokenizer.chat_template") or ""
        self._tpl = jinja2.Environment().from_string(tpl)

    def tokens(self, request: GenerationRequest) -> list[int]:
        if request.messages is not None:
            text = self._tpl.render(
                messages=[{"role": m.role, "content": m.content} for m in request.messages],
                add_generation_prompt=True,
                bos_token="",
                eos_token="",
            )
            return self._model.tokenize(text, add_special=True, parse_special=True)
        return self._model.tokenize(request.prompt or "", add_special=True, parse_special=False)

    def text_stream(self, request: GenerationRequest) -> _Text:
        return _Text(self._model, request.sampling.stop)
