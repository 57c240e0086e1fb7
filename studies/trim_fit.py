"""Would real chat histories fit the local topology's windows, as the router would send them?

    .venv/bin/python -m studies.trim_fit var/sg.jsonl [more.jsonl ...] [--max-tokens 16]

A check without an engine run: for each conversation of the files
(``studies.sharegpt`` writes them), the router's own window fit and trimming
(``geo_router.trimming.fit_pool``) over the local topology's windows (an edge
of ``configs/edge-local.yaml``, a center replica of
``configs/central-cpu.yaml``) with its policy (trimming on both tiers as a
last resort, ``configs/local.yaml``); then what each offered instance would
get is counted as the engines count it: the GGUF's chat template and
llama.cpp's tokenizer (the vocabulary alone is loaded), plus ``max_tokens``.
A conversation is served when some offered instance's window holds its real
count (the router moves a request refused for its context to a larger
window); otherwise the client would get the engine's 400.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time
from pathlib import Path
from typing import Any

import yaml

from geo_router.conversation import estimate_prompt_tokens
from geo_router.routing_settings import TrimSettings
from geo_router.trimming import Trim, fit_pool
from hybrid_llm.local.servers import REPO
from servekit.engine.llama_lib import llama_cpp
from servekit.engine.llama_vocab import LlamaVocab
from servekit.engine.prompting import ChatTemplate
from servekit.engine.protocol import LoadReport, Message
from servekit.registry.protocol import InstanceInfo, InstanceState, Tier

LAST_RESORT = TrimSettings(enabled=True, last_resort=True)
_QUIET = llama_cpp.llama_log_callback(lambda _level, _text, _data: None)


class Counter:
    """Prompt tokens as the llama.cpp engines count them (template, then tokenizer)."""

    def __init__(self, model_path: Path) -> None:
        llama_cpp.llama_log_set(_QUIET, ctypes.c_void_p(0))  # no model-loading chatter
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self._model = llama_cpp.llama_model_load_from_file(str(model_path).encode(), params)
        if not self._model:
            raise SystemExit(f"llama.cpp could not load {model_path}")
        self._vocab = LlamaVocab(llama_cpp.llama_model_get_vocab(self._model))
        buf = bytes(1 << 16)
        n = llama_cpp.llama_model_meta_val_str(
            self._model, b"tokenizer.chat_template", buf, len(buf)
        )
        source = buf[: max(n, 0)].decode("utf-8", "replace")
        meta = {"tokenizer.chat_template": source} if n > 0 else {}
        self._template = ChatTemplate.from_metadata(
            meta, self._vocab.special_text("bos"), self._vocab.special_text("eos")
        )

    def tokens(self, messages: list[Any]) -> int:
        text = self._template.render([Message(m["role"], m["content"]) for m in messages])
        bos = self._vocab.add_bos() and not text.startswith(self._template.bos_token or "\0")
        return len(self._vocab.tokenize(text.encode("utf-8", "replace"), bos, True))


def instance(iid: str, tier: Tier, window: int) -> InstanceState:
    info = InstanceInfo(iid, tier, tier, "127.0.0.1", 1, "m")
    return InstanceState(info, LoadReport(ready=True, max_context_tokens=window), True, 0.0)


def describe(trim: Trim | None) -> str:
    if trim is None:
        return "whole"
    cut = f", cut {trim.omitted_chars} chars" if trim.truncated else ""
    return f"dropped {trim.dropped}{cut}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", type=Path, nargs="+", help="JSON lines of {'messages': [...]}")
    p.add_argument("--max-tokens", type=int, default=16, help="the answer's tokens (bench's)")
    p.add_argument("--model", type=Path, default=REPO / "models/SmolLM2-135M-Instruct.Q4_1.gguf")
    args = p.parse_args()
    edge = yaml.safe_load((REPO / "configs/edge-local.yaml").read_text())["engine"]
    center = yaml.safe_load((REPO / "configs/central-cpu.yaml").read_text())
    center_window = min(r["n_ctx"] for r in center["replicas"])
    pool = [
        instance("edge", "edge", edge["ctx_per_slot"]),
        instance("center", "center", center_window),
    ]
    counter = Counter(args.model)
    out = args.max_tokens
    print("conv  msgs  estimate  real   offered: tier plan real+answer/window")
    refused = served = 0
    planning: list[float] = []
    for n, line in enumerate(line for f in args.files for line in f.read_text().splitlines()):
        messages = json.loads(line)["messages"]
        estimate = estimate_prompt_tokens({"messages": messages})
        start = time.perf_counter()
        found = fit_pool(pool, estimate, out, messages, lambda _tier: LAST_RESORT)
        planning.append(time.perf_counter() - start)
        cells, ok = [], False
        for state, _, trim in found.fitted:
            real = counter.tokens(messages if trim is None else trim.messages) + out
            window = state.load.max_context_tokens or 0
            ok = ok or real <= window
            cells.append(f"{state.info.tier} {describe(trim)} {real}/{window}")
        served += ok
        refused += not ok
        whole = counter.tokens(messages)
        verdict = "" if ok else "  -> 400"
        print(
            f"{n:4d}  {len(messages):4d}  {estimate:8d}  {whole:5d}   {'; '.join(cells)}{verdict}"
        )
    slowest = max(planning) * 1000
    print(f"{served + refused} conversations: {served} fit a window as sent, {refused} would get")
    print(f"the engine's 400; fit and trim took at most {slowest:.2f} ms a conversation")


if __name__ == "__main__":
    main()
