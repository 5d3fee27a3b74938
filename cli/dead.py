"""`ovq dead list | retry ID | purge`: the dead-letter stream (jobs delivered too often, or unreadable)."""
from __future__ import annotations

import argparse
import time

import redis.asyncio as aioredis
from rich.table import Table

from cli.console import console, error, print_json, run
from common.keys import Keys
from common.ops import cluster, control
from common.settings import Settings


async def _list(redis: aioredis.Redis, keys: Keys, count: int, as_json: bool) -> int:
    total, letters = await cluster.dead_letters(redis, keys, count)
    if as_json:
        print_json({"total": total, "dead": [d.model_dump(mode="json") for d in letters]})
        return 0
    out = console()
    if not letters:
        out.print("No dead letters.")
        return 0
    table = Table(title=f"Dead letters: {total}" + (f" (newest {len(letters)})" if total > len(letters) else ""),
                  title_justify="left")
    for name in ("entry", "when", "job", "model", "device", "kind", "reason", "moved by"):
        table.add_column(name)
    for d in letters:
        table.add_row(d.id, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(d.time)), d.job or "?", d.model,
                      d.device, d.kind, d.reason, d.worker)
    out.print(table)
    return 0


async def _retry(redis: aioredis.Redis, keys: Keys, settings: Settings, entry_id: str) -> int:
    try:
        job = await control.retry(redis, keys, settings, entry_id)
    except (control.NotFound, control.Refused) as exc:
        error(str(exc))
        return 1
    print(f"job {job.id} queued again on {job.model} {job.device} (ovq jobs show {job.id})")
    return 0


async def _purge(redis: aioredis.Redis, keys: Keys) -> int:
    print(f"purged {await control.purge(redis, keys)} dead letters")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dead", help="dead letters: list, retry, purge")
    actions = p.add_subparsers(dest="dead_command", required=True)
    a = actions.add_parser("list", help="the newest dead letters")
    a.add_argument("--count", type=int, default=50, help="how many of the newest to list")
    a.add_argument("--json", action="store_true", help="print JSON instead of a table")
    a.set_defaults(func=lambda args: run(lambda r, k, s: _list(r, k, args.count, args.json)))
    a = actions.add_parser("retry", help="put a dead letter's job back on its model's stream")
    a.add_argument("id", help="the dead letter's entry id (first column of `ovq dead list`)")
    a.set_defaults(func=lambda args: run(lambda r, k, s: _retry(r, k, s, args.id)))
    a = actions.add_parser("purge", help="delete every dead letter")
    a.set_defaults(func=lambda args: run(lambda r, k, s: _purge(r, k)))
