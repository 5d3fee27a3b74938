"""`ovq worker drain ID`: the worker stops taking jobs, finishes its running ones and exits (read at its next
heartbeat, so within a second or so)."""
from __future__ import annotations

import argparse
import asyncio
import time

import redis.asyncio as aioredis

from cli.console import error, run
from common.keys import Keys
from common.ops import control
from common.settings import Settings


async def _drain(redis: aioredis.Redis, keys: Keys, settings: Settings, worker_id: str, wait: bool) -> int:
    try:
        await control.drain(redis, keys, worker_id)
    except control.NotFound as exc:
        error(f"{exc} (ovq status lists them)")
        return 1
    print(f"worker {worker_id}: drain requested")
    if not wait:
        return 0
    deadline = time.monotonic() + settings.shutdown_grace_s + 30
    while await redis.exists(keys.worker(worker_id)):
        if time.monotonic() > deadline:
            error(f"worker {worker_id} is still there after {settings.shutdown_grace_s + 30:.0f}s")
            return 1
        await asyncio.sleep(0.5)
    print(f"worker {worker_id}: gone")
    return 0


def drain(args: argparse.Namespace) -> int:
    return run(lambda redis, keys, settings: _drain(redis, keys, settings, args.id, args.wait))


def add_parsers(worker: argparse.ArgumentParser) -> None:
    """Actions on a running worker, under `ovq worker` (which without one runs a worker)."""
    actions = worker.add_subparsers(dest="worker_command", metavar="{drain}")
    p = actions.add_parser("drain", help="stop taking jobs, finish the running ones, exit")
    p.add_argument("id", help="the worker id (ovq status lists them)")
    p.add_argument("--wait", action="store_true", help="return once the worker has gone")
    p.set_defaults(func=drain)
