"""``model-sync`` commands on version records: ``push`` hashes and registers
one, ``sign`` signs registered ones, ``list`` shows them; ``keygen`` makes the
operator key they are signed with."""

from __future__ import annotations

import argparse

import httpx
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from model_sync import ops, render
from model_sync.keys import InvalidName
from model_sync.settings import ModelSyncSettings
from model_sync.store import SyncStore
from servekit.config import ConfigError
from servekit.peers import async_client
from servekit.registry import Registry
from servekit.secrets import redact_url

__all__ = ["keygen", "list_versions", "push", "sign"]


async def push(
    args: argparse.Namespace, reg: Registry, store: SyncStore, c: Console, cfg: ModelSyncSettings
) -> None:
    signer = cfg.signing.signing_key()
    client = async_client(cfg.artifacts, timeout=httpx.Timeout(30.0, connect=10.0))
    progress = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=Console(stderr=True),
        transient=True,
        disable=args.json,
    )
    async with client:
        with progress:
            task = progress.add_task(f"hashing {redact_url(args.source)}", total=None)
            record = await ops.push(
                store,
                args.source,
                model=args.model,
                version=args.version,
                fmt=args.format,
                tier=args.tier,
                notes=args.notes,
                filename=args.filename,
                url=args.url,
                progress=lambda done, total: progress.update(task, completed=done, total=total),
                client=client,
                signer=signer,
            )
    if signer is None and not args.json:
        Console(stderr=True).print(
            "[yellow]warning:[/] not signed (no signing key): edges that list "
            "model_sync.trusted_keys will refuse this version",
            highlight=False,
        )
    render.out(
        c,
        args.json,
        record.model_dump(),
        f"registered {record.name} {record.version} "
        f"({render.size(record.size)}, sha256 {record.sha256[:12]}) from {record.uri}",
    )


async def sign(
    args: argparse.Namespace, reg: Registry, store: SyncStore, c: Console, cfg: ModelSyncSettings
) -> None:
    signer = cfg.signing.signing_key()
    if signer is None:
        raise ConfigError("sign needs a key: --signing-key-file, or signing.key_file in --config")
    records = await ops.sign(store, signer, args.model, args.versions or None)
    render.out(
        c,
        args.json,
        [r.model_dump() for r in records],
        "\n".join(
            f"signed {r.name} {r.version} (sha256 {r.sha256[:12]}, {r.uri}) with key {r.signed_by}"
            for r in records
        ),
    )


async def list_versions(
    args: argparse.Namespace, reg: Registry, store: SyncStore, c: Console
) -> None:
    records = await store.artifacts(args.model)
    names = sorted({r.name for r in records})
    aliases = {n: await store.aliases(n) for n in names}
    shares = {n: (await store.traffic(n)).shares for n in names}
    data = [
        r.model_dump() | {"aliases": aliases[r.name], "traffic": shares[r.name]} for r in records
    ]
    render.out(c, args.json, data, render.versions_table(records, aliases, shares))


def keygen(args: argparse.Namespace, console: Console, err: Console) -> int:
    from model_sync.signing import generate_keypair

    try:
        private, public = generate_keypair(args.out, args.name)
    except (OSError, InvalidName) as exc:
        err.print(f"[red]error:[/] {exc}", highlight=False)
        return 1
    text = public.read_text(encoding="utf-8").strip()
    render.out(
        console,
        args.json,
        {"private_key_file": str(private), "public_key_file": str(public), "public_key": text},
        f"private key: {private} (mode 0600; keep it off the nodes)\n"
        f"public key:  {public}\n"
        f"edges trust it with model_sync.trusted_keys: [{text}]",
    )
    return 0
