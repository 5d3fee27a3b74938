"""How a worker process starts: its models file, Redis, its model prepared, then the worker (or the pool) runs
until it is stopped (`workers/__main__.py` holds the stop signals meanwhile)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys

import uvloop

from common.models.config import ConfigError
from common.models.prepare import prepare
from common.models.sources import configured_models, find_model
from common.redis.client import RedisRefused, RedisURLError, connect, redis_url, wait_until_up
from common.settings import Settings
from common.signals import EarlySignals
from workers.engine.continuous import error_message
from workers.kinds import worker_class


async def _wait_for_redis(settings: Settings, url: str) -> None:
    client = connect(settings, max_connections=1)
    try:
        await wait_until_up(client, url, settings.redis_wait_s, "ovq worker")
    finally:
        await client.aclose()


def main(signals: EarlySignals, argv: list[str] | None = None) -> int:
    """`signals` are handed over to the loop's handlers as the worker (or the pool) starts running."""
    parser = argparse.ArgumentParser(prog="ovq worker")
    parser.add_argument("--model")
    parser.add_argument("--pool", action="store_true", help="serve any model of the models file, as work waits")
    parser.add_argument("--device", default="CPU")
    parser.add_argument("--config", default=None, help="models file (YAML or JSON)")
    args = parser.parse_args(argv)
    if bool(args.model) == args.pool:
        print("ovq worker: give --model NAME or --pool", file=sys.stderr)
        return 2
    overrides = {"config": args.config} if args.config else {}
    settings = Settings(**overrides)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        models = configured_models(settings) if args.pool else [find_model(settings, args.model)]
    except KeyError:
        print(f"ovq worker: no model named {args.model!r} in the models file", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"ovq worker: {exc}", file=sys.stderr)
        return 2
    try:
        url = redis_url(settings)
    except RedisURLError as exc:
        print(f"ovq worker: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_wait_for_redis(settings, url))
    except TimeoutError as exc:
        print(f"ovq worker: {exc}; exiting", file=sys.stderr)
        return 1
    except RedisRefused as exc:
        print(f"ovq worker: {exc}", file=sys.stderr)
        return 2
    device = args.device.upper()
    if args.pool:
        from workers.pool.supervisor import Pool

        signals.hand_over()
        uvloop.run(Pool(settings, models, device).run())
        return 0
    model = models[0]
    prepare(model)
    signals.hand_over()
    try:
        uvloop.run(worker_class(model, device)(settings, model, device).run())
    except RuntimeError as exc:
        print(f"ovq worker: device {args.device} unavailable for {model.name}: {error_message(exc)}",
              file=sys.stderr)
        return 1
    return 0

