"""common/ops/cluster.py on the real redis-server: the backlog of each priority level's stream."""
from __future__ import annotations

import time

import redis.asyncio as aioredis

from common.keys import GROUP, Keys
from common.ops.cluster import streams, workers
from common.settings import Settings


async def test_streams_count_waiting_jobs_at_every_level(redis_url: str) -> None:
    keys = Keys(f"cluster{time.time_ns()}")
    redis = aioredis.Redis.from_url(redis_url)
    for level, n in (("high", 2), ("interactive", 3), ("low", 4), ("batch", 1)):
        stream = keys.level_jobs("m", "CPU", level)
        await redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
        for _ in range(n):
            await redis.xadd(stream, {"job": "x"})
    await redis.xreadgroup(GROUP, "w", {keys.level_jobs("m", "CPU", "low"): ">"}, count=1)  # running
    [state] = await streams(redis, keys, Settings(), [("m", "CPU")])
    assert (state.high_waiting, state.waiting, state.low_waiting, state.batch_waiting) == (2, 3, 3, 1)
    await redis.aclose()


async def test_workers_show_the_admission_knee_their_heartbeat_carries(redis_url: str) -> None:
    keys = Keys(f"cluster{time.time_ns()}")
    redis = aioredis.Redis.from_url(redis_url)
    now = time.time()
    await redis.hset(keys.worker("w1"), mapping={"model": "m", "device": "CPU", "heartbeat": now,
                                                 "admission_knee": 24, "admission_limit": 16})
    await redis.zadd(keys.workers("m", "CPU"), {"w1": now})
    [worker] = await workers(redis, keys, Settings(), [("m", "CPU")])
    assert (worker.admission_knee, worker.admission_limit) == (24, 16)
    await redis.aclose()
