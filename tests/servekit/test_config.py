"""Every service's settings tree refuses a misspelt key, top level or nested,
naming the file and the dotted field (one :class:`servekit.config.Section`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from central.settings import CentralSettings
from edge_agent.settings import EdgeSettings
from geo_router.settings import RouterSettings
from servekit.config import ConfigError, deep_merge, load_settings

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("model", "shipped", "block"),
    [
        (EdgeSettings, "edge-single.yaml", "admission"),
        (CentralSettings, "central-cpu.yaml", "admission"),
        (RouterSettings, "router.yaml", "routing"),
    ],
)
def test_a_misspelt_key_names_its_file_and_field(
    tmp_path: Path, model: type[BaseModel], shipped: str, block: str
) -> None:
    data = yaml.safe_load((REPO / "configs" / shipped).read_text())
    load_settings(model, REPO / "configs" / shipped)  # the shipped file itself loads
    for where, bad in ((block, {**data, block: {**data.get(block, {}), "max_waitng": 3}}),
                       ("<root>", {**data, "max_waitng": 3})):  # fmt: skip
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump(bad))
        with pytest.raises(ConfigError) as caught:
            load_settings(model, path)
        field = "max_waitng" if where == "<root>" else f"{block}.max_waitng"
        assert f"{path}: {field}: Extra inputs are not permitted" in str(caught.value)


def test_deep_merge_merges_mappings_and_replaces_the_rest_without_touching_its_inputs() -> None:
    base = {"engine": {"slots": 4, "chunk_tokens": 128}, "aliases": ["edge"], "port": 1}
    over = {"engine": {"slots": 8}, "aliases": ["small"], "extra": {"a": 1}}
    merged = deep_merge(base, over)
    assert merged == {
        "engine": {"slots": 8, "chunk_tokens": 128},
        "aliases": ["small"],
        "port": 1,
        "extra": {"a": 1},
    }
    assert base["engine"] == {"slots": 4, "chunk_tokens": 128}  # a copy, not an edit
