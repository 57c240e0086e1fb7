from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from edge_agent.settings import EdgeSettings
from servekit.config import ConfigError, load_settings

REPO = Path(__file__).resolve().parents[2]


def test_shipped_config_loads() -> None:
    s = load_settings(EdgeSettings, REPO / "configs" / "edge-local.yaml", **{"server.port": 9})
    assert s.engine.kind == "llama-batching"
    single = load_settings(EdgeSettings, REPO / "configs" / "edge-single.yaml")
    assert single.engine.kind == "llama"
    assert s.server.port == 9
    assert s.engine.model_name == "smollm2-135m-instruct"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            "engine: {model_path: models/nope.gguf, model_name: x}",
            "engine: Value error, model file",
        ),
        ("server: {port: 99999}\nengine: {model_name: x}", "server.port"),
        ("engine: {model_path: x, model_name: y, n_ctx: -1, bogus: 1}", "engine.llama.n_ctx"),
        ("- just\n- a list", "top level must be a mapping"),
        ("engine: [unclosed", "not valid YAML"),
    ],
)
def test_bad_file_names_path_and_field(tmp_path: Path, text: str, needle: str) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(EdgeSettings, cfg)
    assert str(cfg) in str(info.value)
    assert needle in str(info.value)


def test_cli_fails_at_start_with_clear_message(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("engine: {model_path: x.gguf, model_name: m}\nadmission: {max_waiting: -3}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "edge_agent", "serve", "--config", str(cfg)],
        capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert f"{cfg}: admission.max_waiting" in proc.stderr
    assert "Traceback" not in proc.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "edge_agent", "serve", "--config", str(tmp_path / "none.yaml")],
        capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
    )  # fmt: skip
    assert missing.returncode == 2
    assert "cannot read settings file" in missing.stderr
