#!/usr/bin/env python3
"""Conversations, measured: what appending a turn, reading a page and reading a turn's whole history cost Redis
as a conversation grows to 10, 100, 1,000 and 10,000 items.

The calls are the API's own (api/openai/conversations/store.py) on a private redis-server that nothing else uses, so
its `INFO commandstats` are the calls': the time Redis spent per call (µs), beside the wall time this process saw.
A turn appends two items (a question and its answer); a page is 20 items, newest first, or oldest first after an id
in the middle; the whole history is what a response with `conversation` reads.

  python benchmarks/conversations.py
  python benchmarks/conversations.py --sizes 10,100 --sample 20
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from api.openai.conversations.store import ConversationStore  # noqa: E402
from common.keys import Keys  # noqa: E402
from common.owner import Caller  # noqa: E402
from common.redis.server import EmbeddedRedis  # noqa: E402
from common.settings import Settings  # noqa: E402

OWNER = Caller("bench")


def item(n: int) -> dict[str, Any]:
    """A message of about 150 bytes, as a conversation stores it."""
    return {"type": "message", "id": f"msg_{n:08d}", "role": "user" if n % 2 == 0 else "assistant",
            "content": f"turn {n}: " + "lorem ipsum dolor sit amet " * 4, "status": "completed"}


async def timed(redis: aioredis.Redis, call: Callable[[], Awaitable[Any]], sample: int) -> tuple[float, float]:
    """Wall µs per call here, and µs per call Redis spent (its commandstats, reset first)."""
    await redis.config_resetstat()
    start = time.perf_counter()
    for _ in range(sample):
        await call()
    wall = (time.perf_counter() - start) / sample * 1e6
    stats = await redis.info("commandstats")
    return wall, sum(entry["usec"] for entry in stats.values()) / sample


async def row(store: ConversationStore, redis: aioredis.Redis, size: int, sample: int) -> list[tuple[float, float]]:
    conversation_id = f"conv_{size}"
    await store.create(conversation_id, [], None, OWNER.tenant)
    for start in range(0, size, 500):
        await store.append_turn(conversation_id, [item(n) for n in range(start, min(size, start + 500))])
    following = iter(range(size, size + 2 * sample + 2, 2))

    async def append() -> None:
        n = next(following)
        await store.append_turn(conversation_id, [item(n), item(n + 1)])

    middle = f"msg_{size // 2:08d}"
    return [await timed(redis, append, sample),
            await timed(redis, lambda: store.page(conversation_id, OWNER, 20, "desc"), sample),
            await timed(redis, lambda: store.page(conversation_id, OWNER, 20, "asc", middle), sample),
            await timed(redis, lambda: store.page(conversation_id, OWNER, None, "asc"), max(1, sample // 10))]


async def main(sizes: list[int], sample: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis", appendonly=False)
        url = server.start()
        try:
            redis = aioredis.from_url(url)
            settings = Settings(conversation_max_items=10 * max(sizes), conversation_max_bytes=1 << 31)
            store = ConversationStore(redis, Keys("bench"), settings)
            print("| items | append a turn (2 items) | page of 20, newest first | page of 20 after an id "
                  "| whole history |")
            print("| ---: | ---: | ---: | ---: | ---: |")
            for size in sizes:
                cells = [f"{redis_us:,.0f} µs ({wall:,.0f} µs wall)" for wall, redis_us in
                         await row(store, redis, size, sample)]
                print(f"| {size:,} | " + " | ".join(cells) + " |")
            await redis.aclose()
        finally:
            server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10,100,1000,10000", help="conversation sizes, comma-separated")
    parser.add_argument("--sample", type=int, default=50, help="calls measured per figure (a tenth for the history)")
    args = parser.parse_args()
    asyncio.run(main([int(n) for n in args.sizes.split(",")], args.sample))
