"""``model-sync`` commands on rollouts: ``rollout`` starts one (and follows it
with ``--wait``), ``status`` shows it and every node, ``pause`` / ``resume`` /
``promote`` / ``abort`` steer it, ``rollback`` and ``history``; and
``controller``, the process that advances them."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal

from rich.console import Console
from rich.live import Live

from model_sync import ops, render
from model_sync.controller import Controller
from model_sync.gates import PrometheusGate
from model_sync.plan import build_plan
from model_sync.records import GateSettings
from model_sync.settings import ModelSyncSettings
from model_sync.status import fleet_status
from model_sync.store import SyncStore
from servekit.peers import async_client
from servekit.registry import Registry

__all__ = ["controller", "follow", "history", "rollback", "rollout", "status", "steer"]


async def rollout(args: argparse.Namespace, reg: Registry, store: SyncStore, c: Console) -> int:
    gate_args = {
        "max_error_rate": args.max_error_rate,
        "max_error_rate_increase": args.max_error_rate_increase,
        "max_ttft_p95_ratio": args.max_ttft_ratio,
        "min_requests": args.min_requests,
    }
    gates = GateSettings.model_validate({k: v for k, v in gate_args.items() if v is not None})
    plan = await build_plan(
        reg,
        store,
        args.model,
        args.version,
        canary=args.canary,
        waves=args.waves,
        bake_s=args.bake,
        gates=gates,
        converge_timeout_s=args.converge_timeout,
    )
    if not args.dry_run:
        await ops.start_rollout(store, plan)
    render.out(c, args.json, plan.model_dump(), render.plan_table(plan))
    if args.dry_run:
        return 0
    if not args.wait:
        if not args.json:
            c.print(f"started; the controller advances it (`model-sync status {args.model}`)")
        return 0
    return await follow(store, args.model, plan.id, c, quiet=args.json)


async def follow(store: SyncStore, model: str, rollout_id: str, c: Console, quiet: bool) -> int:
    """Print each history entry of the rollout until it ends; the exit code says how."""
    seen: set[str] = set()
    while True:
        state = await store.state(model)
        for entry in await store.history(model, limit=200):
            if entry.rollout_id == rollout_id and entry.id not in seen:
                seen.add(entry.id)
                if not quiet:
                    c.print(f"{render.when(entry.at)}  {entry.action}  {entry.detail}")
        if state is None or state.rollout_id != rollout_id or not state.active:
            break
        await asyncio.sleep(0.5)
    status = state.status if state else "unknown"
    if not quiet:
        c.print(
            f"rollout of {model} ended: {status}"
            + (f" ({state.reason})" if state and state.reason else "")
        )
    return 0 if status == "completed" else 3


async def status(args: argparse.Namespace, reg: Registry, store: SyncStore, c: Console) -> int:
    fleet = await fleet_status(reg, store, args.model)
    if args.json:
        render.out(c, args.json, fleet.to_dict())
    elif args.watch is None:
        c.print(render.status_view(fleet))
    else:
        with Live(render.status_view(fleet), console=c, auto_refresh=False) as live:
            while True:
                await asyncio.sleep(args.watch)
                fleet = await fleet_status(reg, store, args.model)
                live.update(render.status_view(fleet), refresh=True)
    return 0


async def steer(args: argparse.Namespace, reg: Registry, store: SyncStore, c: Console) -> None:
    if args.command == "pause":
        state = await ops.pause(store, args.model)
    elif args.command == "resume":
        state = await ops.resume(store, args.model)
    elif args.command == "promote":
        state = await ops.promote(store, args.model, full=args.full)
    else:
        state = await ops.abort(store, args.model, args.reason)
    render.out(
        c,
        args.json,
        state.model_dump(exclude={"outbox"}),
        f"{args.command}: {state.model} → {state.version} is now {state.status}",
    )


async def rollback(args: argparse.Namespace, reg: Registry, store: SyncStore, c: Console) -> None:
    version = await ops.rollback(store, args.model, args.to)
    render.out(
        c,
        args.json,
        {"model": args.model, "version": version},
        f"rolling {args.model} back to {version}",
    )


async def history(args: argparse.Namespace, reg: Registry, store: SyncStore, c: Console) -> None:
    entries = await store.history(args.model, args.limit)
    render.out(c, args.json, [e.model_dump() for e in entries], render.history_table(entries))


async def controller(
    args: argparse.Namespace, reg: Registry, store: SyncStore, c: Console, cfg: ModelSyncSettings
) -> None:
    settings = cfg.controller
    peer = settings.prometheus.client if settings.prometheus is not None else None
    async with async_client(peer, timeout=30.0) as client:
        prometheus = None
        if settings.prometheus is not None:
            p = settings.prometheus
            prometheus = PrometheusGate(p.url, p.error_rate_query, p.ttft_p95_query, client)
        running = Controller(
            reg,
            tick_s=args.tick or settings.tick_s,
            lock_ttl_s=settings.lock_ttl_s,
            prometheus=prometheus,
        )
        task = asyncio.ensure_future(running.run())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        c.print(f"[dim]controller {running.holder} running", highlight=False)
        with contextlib.suppress(asyncio.CancelledError):
            await task
