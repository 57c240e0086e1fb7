"""The local topology: which services run, with what settings, behind which
emulated network delays; turned into supervisor process specs.

Each service names a base settings file and overrides merged over it; the
result is written under the state directory and passed as ``--config``, so a
topology never needs a service to grow flags. Strings in ``args``,
``settings`` and ``env`` may use placeholders:

``{name}`` ``{port}`` ``{region}`` ``{host}`` ``{registry}`` ``{state_dir}``
``{config}`` (this service's rendered settings file), ``{url}`` (its own
address), ``{advertise}`` (where the fleet should reach it: through its delay
proxy when netem is on), ``{advertise_of[other-name]}`` / ``{url_of[..]}``,
``{service_token_file}``: the file holding the edges' service token (the
router sends it to edges), and ``{center_token_file}``: the center's (the
router sends it to the center, the gateway to its stand-in replicas). One
token per tier, so an edge's token (a stolen edge's) does not open the
center. Every build writes fresh random tokens (mode 0600), so each ``up``
has its own; :func:`service_headers` gives operator tools (profile, benches)
a tier's token.
``{trusted_keys_file}`` is the public half of the topology's operator signing
key (``<state_dir>/secrets/operator.pub``; the private key beside it, mode
0600), made once and kept across runs: the edges trust it, so a version
pushed with ``--signing-key-file <state_dir>/secrets/operator.key`` rolls out
and an unsigned one is refused, as in production.

Traces: ``tracing`` is an OTLP/HTTP endpoint every router, edge and center
exports to, or :data:`LOCAL_TRACES`: the topology's own trace store (its
``kind: traces`` service, Arize Phoenix in ``configs/local.yaml``), which
then runs too, before everything else, and takes every service's spans at
its ``/v1/traces``. A service in an environment of its own (``python:``,
e.g. ``.phoenix/bin/python``) runs under that interpreter; when it is
missing the build stops and names the ``setup`` command that installs it.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from hybrid_llm.local.supervisor import ProcessSpec
from model_sync.signing import SigningKey, generate_keypair, public_key_text
from servekit.config import deep_merge
from servekit.registry.protocol import Tier
from servekit.rtt import RttTable

__all__ = [
    "LOCAL_TRACES",
    "SERVICE_TOKEN_ENV",
    "NetemSettings",
    "ServiceSpec",
    "TopologyError",
    "TopologySettings",
    "build_specs",
    "ensure_signing_key",
    "service_headers",
    "service_token",
    "service_token_path",
    "signing_key_paths",
    "with_services",
    "write_service_tokens",
]

SERVICE_TOKEN_ENV = "HYBRID_LLM_SERVICE_TOKEN"
LOCAL_TRACES = "local"  # `tracing:` naming the topology's own trace store


class TopologyError(Exception):
    """The topology cannot be built (a base settings file is missing or unreadable)."""


Kind = Literal["router", "edge", "center", "controller", "traces", "other"]
_TRACED = ("router", "edge", "center")  # the kinds with a `tracing:` block


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ServiceSpec(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")
    kind: Kind
    module: str = Field(description="run as `python -m <module> <args>`")
    python: Path | None = Field(
        None,
        description="the interpreter that runs it, relative to the checkout, for a service "
        "installed in an environment of its own (e.g. .phoenix/bin/python); default: this one",
    )
    setup: str | None = Field(
        None, description="the command that installs `python`, named when it is missing"
    )
    args: list[str] = Field(default_factory=list)
    config: Path | None = Field(None, description="base settings YAML of the service")
    variants: dict[str, Path] = Field(
        default_factory=dict,
        description="other base settings by engine name; a center's is picked with "
        "`hybrid-llm up --center NAME` (e.g. vllm: configs/central-vllm-cpu.yaml)",
    )
    settings: dict[str, Any] = Field(default_factory=dict, description="merged over `config`")
    region: str | None = None
    port: int | None = Field(None, ge=1, le=65535)
    also_binds: list[int] = Field(
        default_factory=list, description="other ports it listens on (checked before start)"
    )
    ready_path: str | None = Field("/ready", description="GET 200 means ready; null: started")
    ready_timeout_s: float = Field(180.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    enabled: bool = True


class NetemSettings(_Strict):
    enabled: bool = Field(False, description="delay router->edge/center hops by the RTT table")
    port_offset: int = Field(1000, ge=1, description="proxy listens on the service port + this")


class TopologySettings(_Strict):
    """``configs/local.yaml``: the whole system on one machine."""

    host: str = "127.0.0.1"
    state_dir: Path = Path("var")
    registry: Path = Path("var/registry.db")
    models_dir: Path = Path("models")
    models: list[str] = Field(default_factory=lambda: ["smollm2-135m-instruct-q4_1"])
    router_region: str = Field("local", description="where the router (and its users) sit")
    example_api_key: str = Field("local", description="the key the printed examples send")
    rtt: RttTable = Field(default_factory=RttTable)
    netem: NetemSettings = Field(default_factory=NetemSettings)
    center: str = Field(
        "default", description="which engine the center runs: `default` or one of its variants"
    )
    tracing: str | None = Field(
        None,
        description="OTLP/HTTP traces endpoint every router, edge and center exports to "
        "(`hybrid-llm up --tracing URL`), or `local`: the topology's own trace store, its "
        "`kind: traces` service, started with it (`hybrid-llm up --tracing`); none: "
        "tracing stays as each config says",
    )
    services: list[ServiceSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> TopologySettings:
        from servekit.modelfetch import BUNDLED_MODELS

        unknown = [m for m in self.models if m not in BUNDLED_MODELS]
        if unknown:
            raise ValueError(f"unknown models {unknown}; bundled: {sorted(BUNDLED_MODELS)}")
        names = [s.name for s in self.services]
        if len(set(names)) != len(names):
            raise ValueError(f"service names must be unique: {names}")
        stores = [s for s in self.services if s.kind == "traces"]
        if self.tracing == LOCAL_TRACES and (len(stores) != 1 or stores[0].port is None):
            raise ValueError(
                f"tracing: {LOCAL_TRACES} needs one service of kind traces with a port, "
                f"not {[s.name for s in stores]}"
            )
        ports = [p for s in self.enabled() for p in [*([s.port] if s.port else []), *s.also_binds]]
        if len(set(ports)) != len(ports):
            raise ValueError(f"two services share a port: {ports}")
        if self.center != "default":
            centers = [s for s in self.enabled() if s.kind == "center"]
            lacking = [s.name for s in centers if self.center not in s.variants]
            if not centers or lacking:
                raise ValueError(f"center {self.center!r}: no such variant for {lacking or 'any'}")
        return self

    def base_config(self, service: ServiceSpec) -> Path | None:
        """The service's base settings file (a center's variant when one is chosen)."""
        if service.kind == "center" and self.center != "default":
            return service.variants[self.center]
        return service.config

    def enabled(self) -> list[ServiceSpec]:
        """The services that run: those enabled, and the trace store when it is used."""
        local = self.tracing == LOCAL_TRACES
        return [s for s in self.services if s.enabled or (local and s.kind == "traces")]

    def trace_store(self) -> ServiceSpec | None:
        """The topology's own trace store, when ``tracing`` is :data:`LOCAL_TRACES`."""
        if self.tracing != LOCAL_TRACES:
            return None
        return next(s for s in self.services if s.kind == "traces")

    def trace_endpoint(self) -> str | None:
        """Where routers, edges and the center export spans (OTLP/HTTP), if anywhere."""
        store = self.trace_store()
        if store is None:
            return self.tracing
        return f"{self.url(store)}/v1/traces"  # it has a port (validated)

    def proxied(self, service: ServiceSpec) -> bool:
        return (
            self.netem.enabled and service.kind in ("edge", "center") and service.port is not None
        )

    def url(self, service: ServiceSpec) -> str | None:
        return f"http://{self.host}:{service.port}" if service.port else None

    def advertise(self, service: ServiceSpec) -> str | None:
        if service.port is None:
            return None
        if self.proxied(service):
            return f"http://{self.host}:{service.port + self.netem.port_offset}"
        return self.url(service)

    def rtt_ms(self, service: ServiceSpec) -> float:
        """Round trip the router sees to ``service`` (0 when netem is off)."""
        if not self.proxied(service):
            return 0.0
        return self.rtt.rtt(self.router_region, service.region or self.router_region)

    def router(self) -> ServiceSpec | None:
        return next((s for s in self.enabled() if s.kind == "router"), None)


def with_services(topo: TopologySettings, names: Sequence[str]) -> TopologySettings:
    """``topo`` with the services ``names`` enabled too (``hybrid-llm up --with``);
    ``ValueError`` for a name it lacks or a clash (two services on one port)."""
    if not names:
        return topo
    unknown = sorted(set(names) - {s.name for s in topo.services})
    if unknown:
        raise ValueError(f"no such service: {', '.join(unknown)}")
    data = topo.model_dump()
    for service in data["services"]:
        service["enabled"] = service["enabled"] or service["name"] in names
    return TopologySettings.model_validate(data)


def service_token_path(state_dir: Path, tier: Tier = "edge") -> Path:
    """The file of ``tier``'s service token: ``service-token`` (edges), ``center-token``."""
    return state_dir / "secrets" / ("service-token" if tier == "edge" else f"{tier}-token")


def write_service_tokens(state_dir: Path) -> dict[Tier, Path]:
    """A new random token per tier under ``<state_dir>/secrets/`` (0600 each)."""
    written: dict[Tier, Path] = {}
    for tier in get_args(Tier):
        path = written[tier] = service_token_path(state_dir, tier)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(f"svc-{tier}-{secrets.token_urlsafe(32)}\n")
        os.replace(tmp, path)
    return written


def signing_key_paths(state_dir: Path) -> tuple[Path, Path]:
    """The local operator signing key and its public key: ``(private, public)``."""
    return state_dir / "secrets" / "operator.key", state_dir / "secrets" / "operator.pub"


def ensure_signing_key(state_dir: Path) -> Path:
    """Make the local operator key unless it exists; returns the public key's path.

    Kept across runs: versions signed with it stay valid after a restart.
    """
    private, public = signing_key_paths(state_dir)
    private.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if private.is_file():
        if not public.is_file():
            key = SigningKey.from_pem(private.read_text(encoding="utf-8"))
            public.write_text(public_key_text(key.public) + "\n", encoding="utf-8")
        return public
    public.unlink(missing_ok=True)  # a public key without its private half is of no use
    return generate_keypair(private.parent, private.stem)[1]


def service_token(state_dir: Path = Path("var"), tier: Tier = "edge") -> str | None:
    """The token the local topology's ``tier`` accepts, for calling it directly.

    ``$HYBRID_LLM_SERVICE_TOKEN`` if set, else the one ``hybrid-llm up`` wrote.
    """
    token = os.environ.get(SERVICE_TOKEN_ENV)
    if not token:
        try:
            token = service_token_path(state_dir, tier).read_text(encoding="utf-8").strip()
        except OSError:
            return None
    return token or None


def service_headers(state_dir: Path = Path("var"), tier: Tier = "edge") -> dict[str, str]:
    """``Authorization`` with :func:`service_token` (empty when there is none)."""
    token = service_token(state_dir, tier)
    return {"Authorization": f"Bearer {token}"} if token else {}


def _render(value: Any, variables: dict[str, Any]) -> Any:
    if isinstance(value, str):
        whole = (
            variables.get(value[1:-1]) if value.startswith("{") and value.endswith("}") else None
        )
        if isinstance(whole, int):
            return whole  # "{port}" stays a number in the rendered YAML
        return value.format_map(variables)
    if isinstance(value, list):
        return [_render(v, variables) for v in value]
    if isinstance(value, dict):
        return {k: _render(v, variables) for k, v in value.items()}
    return value


def _python(service: ServiceSpec, root: Path) -> str:
    """The interpreter ``service`` runs under; :class:`TopologyError` if it is missing."""
    if service.python is None:
        return sys.executable
    path = root / service.python
    if not path.exists():
        how = f"; install it with `{service.setup}`" if service.setup else ""
        raise TopologyError(f"service {service.name}: {service.python} is missing{how}")
    return str(path)


def build_specs(topo: TopologySettings, root: Path) -> list[ProcessSpec]:
    """Process specs in start order: delay proxies, the trace store (so the first
    spans find it), then services as listed."""
    state = root / topo.state_dir
    rendered_dir = state / "topology"
    rendered_dir.mkdir(parents=True, exist_ok=True)
    write_service_tokens(state)
    ensure_signing_key(state)
    token_file = service_token_path(topo.state_dir)  # as the services see it (cwd=root)
    center_token_file = service_token_path(topo.state_dir, "center")
    trusted_keys_file = signing_key_paths(topo.state_dir)[1]
    store = topo.trace_store()
    services = sorted(topo.enabled(), key=lambda s: s is not store)  # stable: listed order
    endpoint = topo.trace_endpoint()
    url_of = {s.name: topo.url(s) or "" for s in services}
    advertise_of = {s.name: topo.advertise(s) or "" for s in services}
    pythonpath = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
    env_base = {"PYTHONPATH": pythonpath, "HYBRID_LLM_REGISTRY": str(root / topo.registry)}
    specs: list[ProcessSpec] = []
    proxied = [(s, s.port) for s in services if topo.proxied(s) and s.port is not None]
    routes = [
        f"{port + topo.netem.port_offset}={topo.host}:{port}@{topo.rtt_ms(s):g}"
        for s, port in proxied
    ]
    if routes:
        argv = [sys.executable, "-m", "hybrid_llm", "netem"]
        for route in routes:
            argv += ["--route", route]
        # Ready once every proxy listens: the proxy process takes a second to
        # import, longer than a small service takes to answer /ready, and a
        # service that is up behind a proxy that is not yet is refused.
        listen = tuple(port + topo.netem.port_offset for _, port in proxied)
        specs.append(
            ProcessSpec(
                "netem",
                argv,
                env=env_base,
                cwd=root,
                labels={"kind": "netem", "url": "-"},
                ready_ports=listen,
                ports=listen,
            )
        )
    for s in services:
        config_path = rendered_dir / f"{s.name}.yaml"
        variables: dict[str, Any] = {
            "name": s.name,
            "port": s.port or "",
            "region": s.region or "",
            "host": topo.host,
            "registry": str(topo.registry),
            "state_dir": str(topo.state_dir),
            "config": str(config_path),
            "url": url_of[s.name],
            "advertise": advertise_of[s.name],
            "url_of": url_of,
            "advertise_of": advertise_of,
            "service_token_file": str(token_file),
            "center_token_file": str(center_token_file),
            "trusted_keys_file": str(trusted_keys_file),
        }
        base: dict[str, Any] = {}
        base_config = topo.base_config(s)
        if base_config is not None:
            try:
                loaded = yaml.safe_load((root / base_config).read_text(encoding="utf-8"))
            except (OSError, yaml.YAMLError) as exc:
                raise TopologyError(
                    f"service {s.name}: base settings {base_config}: {exc}"
                ) from None
            base = loaded if isinstance(loaded, dict) else {}
        traced = endpoint is not None and s.kind in _TRACED
        if base_config is not None or s.settings or traced:
            merged = deep_merge(base, _render(s.settings, variables))
            if traced:
                on = {"enabled": True, "endpoint": endpoint, "service_name": s.name}
                merged = deep_merge(merged, {"tracing": on})
            config_path.write_text(yaml.safe_dump(merged, sort_keys=False), encoding="utf-8")
        url = url_of[s.name]
        specs.append(
            ProcessSpec(
                name=s.name,
                argv=[_python(s, root), "-m", s.module, *map(str, _render(s.args, variables))],
                env={**env_base, **{k: str(v) for k, v in _render(s.env, variables).items()}},
                cwd=root,
                ready_url=url + s.ready_path if url and s.ready_path else None,
                ready_timeout=s.ready_timeout_s,
                ports=(*([s.port] if s.port else []), *s.also_binds),
                labels={
                    "kind": s.kind,
                    "region": s.region or "-",
                    "url": url or "-",
                    "rtt_ms": f"{topo.rtt_ms(s):g}" if topo.proxied(s) else "-",
                },
            )
        )
    return specs
