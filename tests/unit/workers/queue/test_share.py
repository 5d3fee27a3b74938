"""A tenant's fair-share correction at a job's end is made once per job, however often its round trip is sent."""
from __future__ import annotations

import time

import redis.asyncio as aioredis

from common.keys import Keys
from workers.queue.publisher import Outbox, Publisher
from workers.queue.share import correction


def _ended(keys: Keys, clock: str, job: str, tokens: float) -> Outbox:
    """What a worker's outbox carries when a job of tenant A ends: its status, then the correction."""
    outbox = Outbox()
    outbox.set_status(job, status="done", completion_tokens=3)
    outbox.commands.append(correction(clock, keys.job(job), "A", tokens, 60))
    return outbox


async def test_a_correction_sent_again_moves_the_tenant_once(redis_url: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    keys = Keys(f"share{time.time_ns()}")
    clock = keys.fair_clock("m", "CPU", "interactive")
    await redis.hset(clock, mapping={"v": 10, "f:A": 100})
    publisher = Publisher(redis, keys, keys.jobs("m", "CPU"), job_ttl=60)
    publisher.start()
    for _ in range(3):  # a retried round trip: the same batch again, after Redis applied it
        publisher.put(_ended(keys, clock, "j1", -5.5))
        await publisher.drain()
    publisher.put(_ended(keys, clock, "j1", -5.5))  # twice in one round trip (merged batches)
    publisher.put(_ended(keys, clock, "j1", -5.5))
    await publisher.drain()
    assert float(await redis.hget(clock, "f:A")) == 94.5
    publisher.put(_ended(keys, clock, "j2", 2.0))  # another job of the tenant: its own correction
    await publisher.drain()
    await publisher.stop()
    assert float(await redis.hget(clock, "f:A")) == 96.5
    assert 0 < await redis.ttl(clock) <= 60
    assert await redis.hget(keys.job("j1"), "fair") == b"-5.5"
    await redis.aclose()


async def test_a_job_whose_hash_is_gone_still_corrects_its_tenant(redis_url: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    keys = Keys(f"share{time.time_ns()}")
    clock = keys.fair_clock("m", "CPU", "low")
    await redis.execute_command(*correction(clock, keys.job("gone"), "A", 4.0, 60))
    assert float(await redis.hget(clock, "f:A")) == 4.0
    assert not await redis.exists(keys.job("gone")), "no hash without a TTL is left behind"
    await redis.aclose()
