"""`ovq worker drain ID`: the worker stops taking jobs, finishes its running ones and exits; `ovq worker sleep ID`:
it releases its engine (weights, KV cache) once its running jobs end, keeping its process, and a job or `ovq worker
wake ID` starts the engine again. Each is read at the worker's next heartbeat, so within a second or so."""
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


async def _steer(redis: aioredis.Redis, keys: Keys, worker_id: str, command: str, wait: float | None) -> int:
    try:
        await control.steer(redis, keys, worker_id, command)
    except (control.NotFound, control.Refused) as exc:
        error(f"{exc} (ovq status lists them)")
        return 1
    print(f"worker {worker_id}: {command} requested")
    if wait is None:
        return 0
    wanted = "asleep" if command == "sleep" else "awake"
    deadline = time.monotonic() + wait
    while (state := await redis.hget(keys.worker(worker_id), "state")) != wanted.encode():
        if state is None:
            error(f"worker {worker_id} is gone")
            return 1
        if time.monotonic() > deadline:
            error(f"worker {worker_id} is {state.decode()} after {wait:.0f}s")
            return 1
        await asyncio.sleep(0.2)
    woke = await redis.hget(keys.worker(worker_id), "woke_in_s")
    print(f"worker {worker_id}: {wanted}" + (f" (its engine started in {float(woke):.2f}s)"
                                               if command == "wake" and woke else ""))
    return 0


def steer(args: argparse.Namespace) -> int:
    return run(lambda redis, keys, settings: _steer(redis, keys, args.id, args.worker_command, args.wait))


def drain(args: argparse.Namespace) -> int:
    return run(lambda redis, keys, settings: _drain(redis, keys, settings, args.id, args.wait))


def add_parsers(worker: argparse.ArgumentParser) -> None:
    """Actions on a running worker, under `ovq worker` (which without one runs a worker)."""
    actions = worker.add_subparsers(dest="worker_command", metavar="{drain,sleep,wake}")
    p = actions.add_parser("drain", help="stop taking jobs, finish the running ones, exit")
    p.add_argument("id", help="the worker id (ovq status lists them)")
    p.add_argument("--wait", action="store_true", help="return once the worker has gone")
    p.set_defaults(func=drain)
    for command, what in (("sleep", "release the engine (weights, KV cache) once idle; a job wakes it"),
                          ("wake", "start a sleeping worker's engine again")):
        p = actions.add_parser(command, help=what)
        p.add_argument("id", help="the worker id (ovq status lists them)")
        p.add_argument("--wait", type=float, metavar="SECONDS", nargs="?", const=120.0,
                       help=f"return once it is {'asleep' if command == 'sleep' else 'awake'} (at most SECONDS)")
        p.set_defaults(func=steer)
