"""`ovq webhooks`: what became of webhook deliveries (counts by outcome, what waits, the latest attempts), and
`ovq webhooks secret`: a new endpoint secret for the key file."""
from __future__ import annotations

import argparse
import time

import redis.asyncio as aioredis
from rich.table import Table

from cli.console import console, print_json, run
from common.keys import Keys
from common.webhooks.endpoints import new_secret
from common.webhooks.log import summary


async def _show(redis: aioredis.Redis, keys: Keys, limit: int, as_json: bool) -> int:
    found = await summary(redis, keys, limit)
    if as_json:
        print_json(found.model_dump(mode="json"))
        return 0
    counts = ", ".join(f"{n} {outcome.replace('_', ' ')}" for outcome, n in found.counts.items())
    console().print(f"{counts}; {found.waiting} in the stream, {found.retrying} waiting to retry")
    table = Table(box=None)
    for column in ("when", "event", "type", "tenant", "endpoint", "attempt", "outcome", "why"):
        table.add_column(column)
    for a in found.recent:
        why = (a.error or "") + (f" (next in {a.next_s:.1f} s)" if a.next_s is not None else "")
        table.add_row(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(a.at)), a.event, a.type,
                      a.tenant or "(keys off)", a.url, str(a.attempt), a.outcome.replace("_", " "), why)
    console().print(table if found.recent else "no delivery yet")
    return 0


def show(args: argparse.Namespace) -> int:
    return run(lambda redis, keys, settings: _show(redis, keys, args.limit, args.json))


def secret(args: argparse.Namespace) -> int:
    print(new_secret())
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("webhooks", help="webhook deliveries: counts, what waits, the latest attempts")
    p.add_argument("--limit", type=int, default=50, help="how many of the latest attempts to show")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=show)
    actions = p.add_subparsers(dest="webhooks_command")
    s = actions.add_parser("secret", help="print a new endpoint secret (whsec_...) for the key file's webhooks")
    s.set_defaults(func=secret)
