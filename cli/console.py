"""What the operator commands share: a Redis client for one command, and a console that does not wrap tables
when the output is a pipe or a file."""
from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable

import orjson
import redis.asyncio as aioredis
from rich.console import Console

from common.keys import Keys
from common.redis.client import UNAVAILABLE, RedisURLError, connect, describe, keys_for, reason, redis_url
from common.settings import Settings

Action = Callable[[aioredis.Redis, Keys, Settings], Awaitable[int]]


def console() -> Console:
    return Console() if sys.stdout.isatty() else Console(width=240, soft_wrap=True)


def print_json(value: object) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


def error(message: str) -> None:
    print(f"ovq: {message}", file=sys.stderr)


def run(action: Action) -> int:
    """Run one command against the Redis of REDIS_URL and OVQ_KEY_PREFIX; one line, not a traceback, if it is
    unreachable."""
    settings = Settings()
    try:
        url = redis_url(settings)
    except RedisURLError as exc:
        error(str(exc))
        return 2

    async def go() -> int:
        redis = connect(settings, max_connections=2)
        try:
            return await action(redis, keys_for(settings), settings)
        finally:
            await redis.aclose()

    try:
        return asyncio.run(go())
    except UNAVAILABLE as exc:
        error(f"Redis at {describe(url)} is unreachable: {reason(exc)}")
        return 1
