"""Hot swap on real engines: in-flight requests finish on the version they
started on, new ones go to the new version, a failed load changes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from edge_agent.engines import build_engine
from edge_agent.slot import ModelSlot
from servekit.engine.protocol import Finish, GenerationRequest, SamplingParams, TextDelta
from servekit.errors import EngineFailure

pytestmark = [pytest.mark.anyio, pytest.mark.model]

COUNT = GenerationRequest("c", SamplingParams(max_tokens=40, temperature=0.0), prompt="1, 2, 3, 4,")


def engine(edge_settings: Any, path: Path | None = None) -> Any:
    s = edge_settings().engine
    if path is not None:
        s = s.model_copy(update={"model_path": path})
    return s


async def test_swap_keeps_in_flight_request_on_old_version(edge_settings: Any) -> None:
    settings = engine(edge_settings)
    slot = ModelSlot(build_engine(settings, "v1"), "v1")
    await slot.current().start()
    old = slot.current()
    stream = old.generate(COUNT)
    first = await anext(stream)
    assert isinstance(first, TextDelta)
    await slot.swap(build_engine(settings, "v2"), "v2")
    assert slot.version == "v2"
    assert slot.current() is not old
    # The old engine keeps serving the stream it started...
    rest = [e async for e in stream]
    assert isinstance(rest[-1], Finish)
    assert rest[-1].completion_tokens == 40
    # ...and is closed once that stream is done.
    for task in list(slot._retiring):
        await task
    assert not await old.ready()
    new_events = [e async for e in slot.current().generate(COUNT)]
    assert slot.current().load().version == "v2"
    assert isinstance(new_events[-1], Finish)
    await slot.aclose()


async def test_failed_load_leaves_old_version_serving(edge_settings: Any, tmp_path: Path) -> None:
    settings = engine(edge_settings)
    slot = ModelSlot(build_engine(settings, "v1"), "v1")
    await slot.current().start()
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 1024)  # a valid upload that is not a model
    with pytest.raises(EngineFailure):
        await slot.swap(
            build_engine(settings.model_copy(update={"model_path": broken}), "v2"), "v2"
        )
    assert slot.version == "v1"
    events = [e async for e in slot.current().generate(COUNT)]
    assert isinstance(events[-1], Finish)
    await slot.aclose()


async def test_drain_first_swap_restores_old_model_on_failure(
    edge_settings: Any, tmp_path: Path
) -> None:
    settings = engine(edge_settings)
    slot = ModelSlot(build_engine(settings, "v1"), "v1")
    await slot.current().start()
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a model")
    with pytest.raises(EngineFailure):
        await slot.replace_when_idle(
            build_engine(settings.model_copy(update={"model_path": broken}), "v2"),
            "v2",
            rebuild_old=lambda: build_engine(settings, "v1"),
        )
    assert slot.version == "v1"
    assert await slot.current().ready()
    await slot.replace_when_idle(
        build_engine(settings, "v2"), "v2", rebuild_old=lambda: build_engine(settings, "v1")
    )
    assert slot.version == "v2"
    events = [e async for e in slot.current().generate(COUNT)]
    assert isinstance(events[-1], Finish)
    await slot.aclose()
