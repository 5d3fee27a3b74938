"""api/ops/refusals.py on the real redis-server: every API process's refusals add up in the stats windows."""
from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis

from api.ops.refusals import Refusals
from common.keys import Keys
from common.ops.stats import read


async def test_refusals_of_several_processes_add_up_once_a_second(redis_url: str) -> None:
    keys = Keys(f"refusals{time.time_ns()}")
    redis = aioredis.Redis.from_url(redis_url)
    processes = [Refusals(redis, keys, stats_ttl_s=60) for _ in range(2)]
    for tally in processes:
        for reason in ("deadline", "deadline", "quota", "queue_full"):
            tally.count("m", "CPU", reason)
    assert not await redis.keys(f"{keys.prefix}:*"), "counted in memory first, not one write per refusal"
    await asyncio.gather(*(tally._task for tally in processes if tally._task))
    [summary] = (await read(redis, keys, [("m", "CPU")])).values()
    assert summary.refused == {"deadline": 4, "quota": 2, "queue_full": 2}
    [key] = await redis.keys(f"{keys.prefix}:*")
    assert 0 < await redis.ttl(key) <= 60
    for tally in processes:
        await tally.stop()
    await redis.aclose()


async def test_counts_wait_for_redis_when_it_is_away() -> None:
    redis = aioredis.Redis(port=1, socket_connect_timeout=0.2)  # nothing listens there
    tally = Refusals(redis, Keys("away"), stats_ttl_s=60)
    tally.count("m", "CPU", "quota")
    await tally.flush()
    assert tally.pending == {("m", "CPU", "quota"): 1}, "kept for the next try"
    await redis.aclose()
