"""Issue 26's findings tried as a tenant (and a careless operator) would, against a
running ``hybrid-llm up``: what was sent, what came back, closed or still open.

    flock /tmp/bench.lock .venv/bin/python -m studies.attack [--router URL] [--key KEY]
        [--tenant-key KEY] [--patience S]

Needs the local topology up (``scripts/run.sh`` or ``hybrid-llm up``; the router
on 127.0.0.1:8080 with the example key ``sk-local-dev``). The artifact-server
and Consul-policy rows run on their own (a throw-away ``model-sync
serve-artifacts`` and the rendered policy), as do the rows on the rendered
topology's tokens and the router's choice of URL. Each row is one finding:
``closed`` when the answer is the hardened one, ``OPEN`` for findings this
branch does not close yet (listed so the gap stays visible), ``REGRESSED``
when a closed one answers the old way. The exit status is 1 on any regression. The test suite runs
:func:`run` against a small real topology (``tests/test_attack.py``: one edge
agent on the real model and the router), so a closed row that opens again
fails CI. Results: ``studies/attack.results.md``.

``--key`` is an operator's key; ``--tenant-key`` another tenant's (none: the
anonymous caller). ``--patience`` is how long the connection rows wait for
the server to cut a slow client off (its ``server.header_timeout_s``).
"""

from __future__ import annotations

import argparse
import json
import secrets
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from hybrid_llm.local.servers import REPO, free_port
from model_sync import keys
from model_sync.consul_policy import allowed, render_node_policy, rules

CHAT: dict[str, Any] = {"model": "auto", "messages": [{"role": "user", "content": "Say hi."}]}


@dataclass
class Row:
    finding: str
    tried: str
    got: str
    closed: bool | None  # None: a finding this branch leaves open


Check = Callable[[httpx.Client], Row]


def _err(r: httpx.Response) -> str:
    try:
        code = r.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = None
    return f"{r.status_code} {code}" if code else str(r.status_code)


def deep_json(c: httpx.Client) -> Row:
    depth = 100_000
    raw = b'{"model": "auto", "messages": ' + b"[" * depth + b"]" * depth + b"}"
    r = c.post("/v1/chat/completions", content=raw)
    return Row("hostile JSON: depth", f"body nested {depth:,} deep", _err(r), r.status_code == 400)


def nan_json(c: httpx.Client) -> Row:
    raw = json.dumps(CHAT)[:-1] + ', "temperature": NaN}'
    r = c.post("/v1/chat/completions", content=raw.encode())
    return Row("hostile JSON: NaN", '"temperature": NaN', _err(r), r.status_code == 400)


def long_number(c: httpx.Client) -> Row:
    raw = json.dumps(CHAT)[:-1] + ', "seed": 1' + "0" * 4000 + "}"
    r = c.post("/v1/chat/completions", content=raw.encode())
    return Row("hostile JSON: number", "a 4,001-digit seed", _err(r), r.status_code == 400)


def big_body(c: httpx.Client) -> Row:
    body = {**CHAT, "messages": [{"role": "user", "content": "x" * (8 << 20)}]}
    r = c.post("/v1/chat/completions", json=body)
    return Row("body size", "an 8 MiB message", _err(r), r.status_code == 413)


def engine_fields(c: httpx.Client) -> list[Row]:
    out = []
    for field, value in (
        ("ignore_eos", True),
        ("min_tokens", 200),
        ("guided_regex", "(a+)+$"),
        ("chat_template", "{{ 7 * 7 }}"),
        ("priority", -100),
        ("cache_salt", "victim"),
        ("kv_transfer_params", {"remote_host": "10.0.0.1"}),
    ):
        r = c.post("/v1/chat/completions", json={**CHAT, field: value, "max_tokens": 4})
        ok = r.status_code == 400 and _err(r).endswith("unknown_parameter")
        out.append(Row("engine-native field", f"{field}: {json.dumps(value)}", _err(r), ok))
    return out


def default_output(c: httpx.Client) -> Row:
    body = {**CHAT, "messages": [{"role": "user", "content": "Write a very long story."}]}
    r = c.post("/v1/chat/completions", json=body)
    got = r.json().get("usage", {}).get("completion_tokens") if r.status_code == 200 else None
    ok = isinstance(got, int) and got <= 256
    return Row("output budget", "no max_tokens (default 256)", f"{r.status_code}, {got} tokens", ok)


def request_id(c: httpx.Client) -> list[Row]:
    r = c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2},
               headers={"X-Request-Id": "victim-123"})  # fmt: skip
    rid, echoed = r.headers.get("x-request-id"), r.headers.get("x-client-request-id")
    rows = [
        Row(
            "client request id",
            "X-Request-Id: victim-123",
            f"X-Request-Id {rid}, X-Client-Request-Id {echoed}",
            rid != "victim-123" and echoed == "victim-123",
        )
    ]
    ids = [
        c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 1}).headers.get(
            "x-request-id", ""
        )
        for _ in range(2)
    ]
    shared = len(_common_prefix(*ids))
    rows.append(
        Row(
            "request id leaks volume",
            "two ids in a row",
            f"{ids[0]} / {ids[1]} (common prefix {shared})",
            shared <= len("req-") + 2,
        )
    )
    return rows


def cache_probe(c: httpx.Client) -> Row:
    r = c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 1})
    header = r.headers.get("x-route-cached-tokens")
    # The engine's own usage.prompt_tokens_details.cached_tokens (and the TTFT) are
    # cache_probe_engine's row: per-tenant cache scopes (cache_salt) close them.
    return Row("cross-tenant cache probe", "a tenant reads X-Route-Cached-Tokens",
               f"{r.status_code}, header {header!r}", header is None)  # fmt: skip


def _memo() -> str:
    return f"Memo {secrets.token_hex(8)}: " + "the Northwind merger closes on Friday. " * 12


def _cached_tokens(c: httpx.Client, text: str) -> tuple[int, int, int]:
    """(status, cached prompt tokens, prompt tokens) of ``text`` sent by ``c``."""
    body = {**CHAT, "max_tokens": 1, "messages": [{"role": "user", "content": text}]}
    r = c.post("/v1/chat/completions", json=body)
    usage = r.json().get("usage", {}) if r.status_code == 200 else {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return r.status_code, int(cached), int(usage.get("prompt_tokens", 0))


def cache_probe_engine(victim: httpx.Client, tenant: httpx.Client) -> Row:
    # The victim (the operator's key) sends a text nobody could guess by chance; another
    # tenant sends it again word for word. Shared caches answer with cached_tokens for
    # nearly all of it; a tenant's own scope holds only what it sent itself (the chat
    # template's opening, "Memo "), as a fresh text of its own shows.
    victim_status, _, _ = _cached_tokens(victim, secret := _memo())
    _, own, _ = _cached_tokens(tenant, _memo())
    status, cached, prompt = _cached_tokens(tenant, secret)
    got = f"{status}, cached_tokens {cached} of {prompt} (a fresh text of its own: {own})"
    tried = "another tenant's text again: usage.cached_tokens"
    closed = victim_status == status == 200 and cached < prompt // 2
    return Row("cross-tenant cache probe", tried, got, closed)


def explain_unlimited(c: httpx.Client) -> Row:
    r = c.post("/v1/route/explain", json=CHAT)
    urls = "url" in r.text or "http://" in r.text
    return Row("explain: no rate limit, internals", "a tenant POSTs /v1/route/explain",
               f"{r.status_code}, internal URLs shown: {urls}", r.status_code == 403)  # fmt: skip


def artifact_server_open() -> Row:
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "model_sync", "serve-artifacts", tmp,
                "--host", "0.0.0.0", "--port", str(free_port())]  # fmt: skip
        try:
            done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=30)
            got = f"exit {done.returncode}"
            ok = done.returncode == 2
        except subprocess.TimeoutExpired:
            got, ok = "served (still running after 30 s)", False
    return Row("artifact server", "serve-artifacts on 0.0.0.0, no tokens", got, ok)


def artifact_dotfiles() -> Row:
    from model_sync.artifacts import resolve_artifact

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / ".git").mkdir()
        (root / ".git" / "config").write_text("token")
        found = resolve_artifact(root, ".git/config")
    return Row("artifact server", "GET /.git/config", "served" if found else "404", found is None)


def consul_policy() -> Row:
    policy = rules(render_node_policy("edge-a", "edge-a"))
    other = keys.desired_key("edge-b")
    can = allowed(policy, "key", other, "write")
    return Row("compromised node", f"edge-a's token writes {other}", "allowed" if can else "denied",
               not can)  # fmt: skip


def tier_tokens() -> Row:
    """The center as ``hybrid-llm up`` renders it (in a scratch state directory): does
    it take the token every edge holds?"""
    from central.settings import CentralSettings
    from hybrid_llm.local.topology import TopologySettings, build_specs, service_token
    from servekit.config import load_settings
    from servekit.service_auth import hash_token

    with tempfile.TemporaryDirectory() as tmp:
        topo = load_settings(TopologySettings, REPO / "configs" / "local.yaml", state_dir=tmp)
        build_specs(topo, REPO)
        center = load_settings(CentralSettings, Path(tmp) / "topology" / "center.yaml")
        edge_token = service_token(Path(tmp), "edge") or ""
    taken = hash_token(edge_token) in center.server.auth.digests()
    return Row("compromised node", "edge-a's token at the center (as up renders it)",
               "accepted" if taken else "refused: not among its tokens", not taken)  # fmt: skip


def registered_url() -> Row:
    """Where the router sends a registration whose own meta names another host."""
    from geo_router.scoring import instance_url
    from servekit.engine.protocol import LoadReport
    from servekit.registry.protocol import InstanceInfo, InstanceState

    meta = {"url": "http://10.9.9.9:8100"}
    info = InstanceInfo("edge-a", "center", "center", "127.0.0.1", 8101, "m", meta=meta)
    url = instance_url(InstanceState(info, LoadReport(), True, 0.0))
    return Row("compromised node", "registers meta.url http://10.9.9.9:8100",
               f"router sends to {url}", url == info.url)  # fmt: skip


def _connect(router: str) -> socket.socket:
    url = urlsplit(router)
    return socket.create_connection((url.hostname or "127.0.0.1", url.port or 80), timeout=10)


def _answer_then_close(sock: socket.socket, patience: float) -> str | None:
    """The status line the server sent before closing; None if still open after ``patience``."""
    sock.settimeout(patience)
    data = b""
    try:
        while part := sock.recv(65536):
            data += part
    except TimeoutError:
        return None
    except ConnectionResetError:  # closed with our bytes unread: the answer may be lost
        return "reset"
    return data.split(b"\r\n", 1)[0].decode("latin-1") or "closed, no answer"


def slow_head(router: str, patience: float) -> Row:
    with _connect(router) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: router\r\n")  # no end
        got = _answer_then_close(sock, patience)
    tried = "a request head that never ends (slowloris)"
    shown = got if got is not None else f"still open after {patience:g} s"
    return Row("slow request head", tried, shown, got is not None)


def huge_head(router: str, patience: float) -> Row:
    with _connect(router) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: router\r\nx-pad: " + b"a" * 200_000)
        got = _answer_then_close(sock, patience)
    shown = got if got is not None else f"still open after {patience:g} s"
    # 431, or a reset when the server closes before reading all of it; open: it waits on.
    return Row("request head size", "a 200 kB header that never ends", shown, got is not None)


def tenant_concurrency(c: httpx.Client) -> Row:
    body = {**CHAT, "max_tokens": 200, "stream": True}
    with c.stream("POST", "/v1/chat/completions", json=body) as held:
        r = c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 1})
        held.close()  # read nothing: the stream is the tenant's slot held open
    capped = r.status_code == 429 and _err(r).endswith("concurrency_limit_exceeded")
    tried = "a second request while a stream is open"
    # Allowed when the key sets no auth.keys[].max_streams: that is the key's setting.
    return Row("tenant concurrency", tried, f"{held.status_code}, then {_err(r)}",
               True if capped else None)  # fmt: skip


def run(router: str, key: str, tenant_key: str | None = None, patience: float = 15.0) -> list[Row]:
    """Every row against the router at ``router``: ``key`` an operator's, ``tenant_key``
    another tenant's (None: the anonymous caller)."""
    rows: list[Row] = []
    headers = {"Authorization": f"Bearer {key}"}
    as_tenant = {"Authorization": f"Bearer {tenant_key}"} if tenant_key is not None else {}
    with httpx.Client(base_url=router, headers=headers, timeout=120) as c:
        for check in (deep_json, nan_json, long_number, big_body):
            rows.append(check(c))
        rows += engine_fields(c)
        rows.append(default_output(c))
        rows += request_id(c)
    # A tenant's key, not the operator's: the routing internals are the operator's only.
    with (
        httpx.Client(base_url=router, headers=headers, timeout=120) as victim,
        httpx.Client(base_url=router, headers=as_tenant, timeout=120) as tenant,
    ):
        rows += [cache_probe(tenant), cache_probe_engine(victim, tenant)]
        rows.append(explain_unlimited(tenant))
        rows.append(tenant_concurrency(tenant))
    rows += [slow_head(router, patience), huge_head(router, patience)]
    rows += [artifact_server_open(), artifact_dotfiles(), consul_policy()]
    rows += [tier_tokens(), registered_url()]
    return rows


VERDICT = {True: "closed", False: "REGRESSED", None: "OPEN"}


def table(rows: list[Row]) -> str:
    """The rows as the study prints them: finding, what was tried, verdict, what came back."""
    lines = [f"{'finding':<34}{'tried':<58}{'verdict':<10}got"]
    for row in rows:
        lines.append(f"{row.finding:<34}{row.tried[:56]:<58}{VERDICT[row.closed]:<10}{row.got}")
    return "\n".join(lines)


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--router", default="http://127.0.0.1:8080")
    p.add_argument("--key", default="sk-local-dev", help="an operator's key")
    p.add_argument("--tenant-key", default=None, help="another tenant's (default: anonymous)")
    p.add_argument("--patience", type=float, default=15.0, help="seconds to wait for a cut-off")
    args = p.parse_args()
    rows = run(args.router, args.key, args.tenant_key, args.patience)
    print(table(rows))
    return 1 if any(row.closed is False for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
