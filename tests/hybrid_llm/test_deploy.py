"""The deploy/ examples refer to things that exist: metric names the services
export, console scripts the package installs, and well-formed files."""

from __future__ import annotations

import configparser
import importlib
import json
import re
import tomllib
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from hybrid_llm.local.servers import REPO
from model_sync.signing import generate_keypair
from servekit.config import load_settings
from servekit.engine.protocol import LoadReport
from servekit.metrics import GuardMetrics, ServingMetrics
from servekit.serve_cli import refuse_open

DEPLOY = REPO / "deploy"
NAME = re.compile(r"\b((?:vllm:|router_|hybrid_)[a-z0-9_:]+)")


def _exported_serving_names() -> set[str]:
    registry = CollectorRegistry()
    metrics = ServingMetrics(
        registry, model="m", version="v", region="r", tier="edge", load=lambda: LoadReport()
    )
    metrics.finished("stop")
    metrics.outcome("ok")
    guard = GuardMetrics()  # every service serves it beside its own
    text = (generate_latest(registry) + generate_latest(guard.registry)).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}


def _queries() -> list[str]:
    dash = json.loads((DEPLOY / "grafana" / "hybrid-llm-fleet.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    rules = yaml.safe_load((DEPLOY / "prometheus" / "hybrid-llm.rules.yml").read_text())
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    return exprs


def _referenced(prefixes: tuple[str, ...]) -> set[str]:
    names = {n for e in _queries() for n in NAME.findall(e)}
    return {n for n in names if n.startswith(prefixes) and ":" not in n.removeprefix("vllm:")}


def test_dashboard_and_rules_use_metrics_the_engines_export() -> None:
    used = _referenced(("vllm:", "hybrid_"))
    assert "vllm:time_to_first_token_seconds_bucket" in used
    missing = used - _exported_serving_names()
    assert not missing, f"dashboard/rules name metrics nobody exports: {sorted(missing)}"


def test_dashboard_and_rules_use_metrics_the_router_exports() -> None:
    metrics = pytest.importorskip("geo_router.metrics")
    text = metrics.RouterMetrics().render().decode()
    # Labelled series have no samples until first use; their `# TYPE` line counts.
    families = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    suffixes = ("_bucket", "_sum", "_count", "_total")
    used = _referenced(("router_",))
    missing = {
        n
        for n in used
        if n not in families and not any(n.removesuffix(x) in families for x in suffixes)
    }
    assert not missing, sorted(missing)


def test_dashboard_shape() -> None:
    dash = json.loads((DEPLOY / "grafana" / "hybrid-llm-fleet.json").read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    titles = " ".join(p["title"] for p in dash["panels"])
    for needed in ("TTFT", "ITL", "E2E", "Route decisions", "Fallbacks", "version"):
        assert needed in titles
    assert {v["name"] for v in dash["templating"]["list"]} == {"datasource", "tier", "region"}


def test_systemd_units_run_installed_commands_with_limits() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    units = sorted((DEPLOY / "systemd").glob("*.service"))
    assert len(units) == 5
    for unit in units:
        parser = configparser.ConfigParser(strict=False, interpolation=None)
        parser.read_string(unit.read_text())
        service = parser["Service"]
        for key in ("Restart", "MemoryMax", "CPUQuota", "LimitNOFILE", "TimeoutStopSec"):
            assert service.get(key), f"{unit.name} lacks {key}"
        command = Path(service["ExecStart"].split()[0]).name
        assert command in scripts, f"{unit.name} runs {command}, not a console script"
        # Secrets arrive as systemd credentials, never in the unit or the YAML.
        assert "LoadCredential" in unit.read_text(), f"{unit.name} loads no credentials"


@pytest.mark.parametrize(
    ("name", "module", "model"),
    [
        ("edge.yaml", "edge_agent.settings", "EdgeSettings"),
        ("router.yaml", "geo_router.settings", "RouterSettings"),
        ("central.yaml", "central.settings", "CentralSettings"),
        ("model-sync.yaml", "model_sync.settings", "ModelSyncSettings"),
    ],
)
def test_production_configs_load_with_credentials_and_certificates_in_place(
    tmp_path: Path, name: str, module: str, model: str
) -> None:
    """deploy/config/*.yaml are valid settings once their files exist (here under tmp)."""
    from tests.support.pki import PrivateCA

    text = (DEPLOY / "config" / name).read_text()
    etc, creds = tmp_path / "etc", tmp_path / "credentials"
    creds.mkdir()
    text = text.replace("/etc/hybrid-llm", str(etc)).replace("/var/lib/hybrid-llm", str(etc))
    for credential in set(re.findall(r"\$CREDENTIALS_DIRECTORY/([\w-]+)", text)):
        (creds / credential).write_text(f"token-{credential}\n")
    ca = PrivateCA(tmp_path / "pki")
    issued = ca.issue("127.0.0.1")
    files = {Path(p) for p in re.findall(str(etc) + r"/[\w./-]+", text)}
    for path in sorted(p for p in files if p.suffix):  # files; the rest are directories
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".pub":  # an operator's public signing key (model-sync keygen)
            generate_keypair(tmp_path / "operator")
            path.write_bytes((tmp_path / "operator" / "operator.pub").read_bytes())
            continue
        source = issued.key_file if "key" in path.name else issued.cert_file
        path.write_bytes(ca.ca_file.read_bytes() if "ca" in path.name else source.read_bytes())
    cfg = tmp_path / name
    cfg.write_text(text)
    settings_model = getattr(importlib.import_module(module), model)
    settings = load_settings(settings_model, cfg, {"CREDENTIALS_DIRECTORY": str(creds)})
    dumped = settings.model_dump_json()
    assert "token-" not in dumped  # the secrets were read, and stay hidden
    if module != "model_sync.settings":  # services on 0.0.0.0 must authenticate callers
        refuse_open(settings)


def test_prometheus_config_parses_and_scrapes_every_service() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {j["job_name"] for j in config["scrape_configs"]}
    assert {"hybrid-llm-serving", "geo-router", "model-sync-controller"} <= jobs


def test_the_collector_receives_where_the_services_export() -> None:
    collector = yaml.safe_load((DEPLOY / "otel" / "collector.yaml").read_text())
    http = collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    (traces,) = collector["service"]["pipelines"].values()
    assert set(traces["exporters"]) <= set(collector["exporters"])
    assert set(traces["processors"]) <= set(collector["processors"])
    assert "tail_sampling" in traces["processors"]
    for name in ("router.yaml", "edge.yaml", "central.yaml"):
        tracing = yaml.safe_load((DEPLOY / "config" / name).read_text())["tracing"]
        assert tracing["endpoint"].endswith(":" + http.rsplit(":", 1)[1] + "/v1/traces"), name


def test_the_production_router_checks_roles_and_sends_a_token_per_tier() -> None:
    """A stolen edge's certificate or token must not pass for the center's."""
    peers = yaml.safe_load((DEPLOY / "config" / "router.yaml").read_text())["peers"]
    assert peers["edge"]["identity"] == peers["center"]["identity"] == "instance"
    assert peers["edge"]["token_file"] != peers["center"]["token_file"]
    units = {
        name: (DEPLOY / "systemd" / f"{name}.service").read_text()
        for name in ("edge-agent", "central")
    }
    edge_tokens = re.findall(r"LoadCredential=service-tokens:(\S+)", units["edge-agent"])
    center_tokens = re.findall(r"LoadCredential=service-tokens:(\S+)", units["central"])
    assert edge_tokens
    assert center_tokens
    assert edge_tokens != center_tokens
