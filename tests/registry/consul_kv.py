"""The Consul double's KV store and sessions (one datacenter's servers).

:class:`KVAndSessions` is mixed into :class:`~tests.registry.consul_state.ConsulState`,
which holds the fields it uses.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass
from typing import Any

from tests.registry.consul_wire import NODE, HTTPError, go_string, norm, parse_duration

__all__ = ["KVAndSessions", "KVItem", "SessionItem"]


@dataclass
class KVItem:
    key: str
    value: bytes | None
    flags: int = 0
    lock_index: int = 0
    session: str | None = None
    create_index: int = 0
    modify_index: int = 0


@dataclass
class SessionItem:
    id: str
    name: str
    ttl_text: str
    ttl_s: float
    behavior: str
    lock_delay_s: float
    expires: float | None
    create_index: int = 0
    modify_index: int = 0
    node: str = NODE


class KVAndSessions:
    """KV (``cas``, ``acquire``/``release``, tombstones) and sessions."""

    kv: dict[str, KVItem]
    tombstones: dict[str, int]
    kvs_index: int
    sessions: dict[str, SessionItem]
    lock_delays: dict[str, float]
    session_ttl_min_s: float
    index: int

    def bump(self) -> int:
        self.index += 1
        return self.index

    # -- KV ---------------------------------------------------------------

    def kv_read(self, key: str, recurse: bool) -> tuple[int, list[KVItem]]:
        if not recurse:
            entry = self.kv.get(key)
            return (entry.modify_index if entry else self.kvs_index), [entry] if entry else []
        entries = [e for k, e in sorted(self.kv.items()) if k.startswith(key)]
        idx = max(
            [e.modify_index for e in entries]
            + [i for k, i in self.tombstones.items() if k.startswith(key)],
            default=0,
        )
        return idx or self.kvs_index, entries

    def _write_kv(self, key: str, value: bytes | None, flags: int | None) -> KVItem:
        idx = self.bump()
        self.kvs_index = idx
        entry = self.kv.get(key)
        if entry is None:
            entry = KVItem(key, value, create_index=idx)
            self.kv[key] = entry
            self.tombstones.pop(key, None)
        entry.value, entry.modify_index = value, idx
        if flags is not None:
            entry.flags = flags
        return entry

    def kv_put(self, key: str, value: bytes | None, params: dict[str, str], now: float) -> bool:
        entry = self.kv.get(key)
        if "cas" in params:
            cas = int(params["cas"])
            if (cas == 0 and entry is not None) or (
                cas != 0 and (entry is None or entry.modify_index != cas)
            ):
                return False
        flags = int(params["flags"]) if "flags" in params else None
        if acquire := params.get("acquire"):
            if acquire not in self.sessions:
                raise HTTPError(500, f'invalid session "{acquire}"')
            if now < self.lock_delays.get(key, 0.0):
                return False
            if entry is not None and entry.session not in (None, acquire):
                return False
            fresh = entry is None or entry.session != acquire
            entry = self._write_kv(key, value, flags)
            if fresh:
                entry.session, entry.lock_index = acquire, entry.lock_index + 1
            return True
        if release := params.get("release"):
            if entry is None or entry.session != release:
                return False
            entry = self._write_kv(key, value, flags)
            entry.session = None
            return True
        self._write_kv(key, value, flags)
        return True

    def kv_delete(self, key: str, recurse: bool, cas: int | None) -> bool:
        keys = [k for k in self.kv if k.startswith(key)] if recurse else [key]
        if cas is not None:
            entry = self.kv.get(key)
            if cas == 0 or entry is None or entry.modify_index != cas:
                return False
        idx = self.bump()
        for k in keys:
            if self.kv.pop(k, None) is not None:
                self.tombstones[k] = idx
                self.kvs_index = idx
        return True

    @staticmethod
    def kv_json(e: KVItem) -> dict[str, Any]:
        out: dict[str, Any] = {
            "LockIndex": e.lock_index,
            "Key": e.key,
            "Flags": e.flags,
            "Value": base64.b64encode(e.value).decode() if e.value else None,
            "CreateIndex": e.create_index,
            "ModifyIndex": e.modify_index,
        }
        if e.session:
            out["Session"] = e.session
        return out

    # -- sessions ---------------------------------------------------------

    def session_create(self, body: dict[str, Any], now: float, node: str = NODE) -> str:
        b = norm(body)
        ttl_text = b.get("ttl") or ""
        ttl = parse_duration(ttl_text) if ttl_text else 0.0
        if ttl and not self.session_ttl_min_s <= ttl <= 86400:
            raise HTTPError(
                500,
                f"Invalid Session TTL '{int(ttl * 1e9)}', must be between"
                f" [{go_string(self.session_ttl_min_s)}=24h0m0s]",
            )
        behavior = b.get("behavior") or "release"
        if behavior not in ("release", "delete"):
            raise HTTPError(400, f"Invalid Behavior setting '{behavior}'")
        delay: Any = b.get("lockdelay", "15s")
        if isinstance(delay, str):
            delay_s = parse_duration(delay)
        else:
            delay_s = float(delay) if delay < 1000 else float(delay) / 1e9
        idx = self.bump()
        sid = str(uuid.uuid4())
        self.sessions[sid] = SessionItem(
            sid, b.get("name") or "", ttl_text, ttl, behavior, delay_s,
            now + 2 * ttl if ttl else None, idx, idx, node,
        )  # fmt: skip
        return sid

    def session_renew(self, sid: str, now: float) -> dict[str, Any]:
        sess = self.sessions.get(sid)
        if sess is None:
            raise HTTPError(404, f"Session id '{sid}' not found")
        if sess.ttl_s:
            sess.expires = now + 2 * sess.ttl_s
        return self.session_json(sess)

    def invalidate(self, sid: str, now: float) -> None:
        sess = self.sessions.pop(sid, None)
        if sess is None:
            return
        for entry in [e for e in self.kv.values() if e.session == sid]:
            if sess.behavior == "delete":
                self.kv_delete(entry.key, False, None)
            else:
                idx = self.bump()
                entry.session, entry.modify_index, self.kvs_index = None, idx, idx
            if sess.lock_delay_s:
                self.lock_delays[entry.key] = now + sess.lock_delay_s

    @staticmethod
    def session_json(s: SessionItem) -> dict[str, Any]:
        return {
            "ID": s.id, "Name": s.name, "Node": s.node, "LockDelay": int(s.lock_delay_s * 1e9),
            "Behavior": s.behavior, "TTL": s.ttl_text, "NodeChecks": ["serfHealth"],
            "ServiceChecks": None, "CreateIndex": s.create_index, "ModifyIndex": s.modify_index,
        }  # fmt: skip
