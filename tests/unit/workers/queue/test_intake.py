"""A worker's reads on the real redis-server: interactive jobs first, batch lines only when none waits."""
from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from common.keys import GROUP, Keys
from common.redis.client import is_nogroup
from workers.queue.intake import Intake


@pytest.fixture()
async def streams(redis_url: str):
    keys = Keys(f"intake{time.time_ns()}")
    redis = aioredis.Redis.from_url(redis_url)
    interactive, batch = keys.jobs("m", "CPU"), keys.batch_jobs("m", "CPU")
    for stream in (interactive, batch):
        await redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
    yield redis, interactive, batch, Intake(redis, "w1", interactive, batch)
    await redis.aclose()


def jobs(reply: list) -> list[tuple[str, bytes]]:
    return [(stream, fields[b"job"]) for stream, entries in reply for _, fields in entries]


async def test_interactive_jobs_are_read_before_batch_lines_queued_earlier(streams) -> None:
    redis, interactive, batch, intake = streams
    for i in range(3):
        await redis.xadd(batch, {"job": f"b{i}"})
    await redis.xadd(interactive, {"job": "i0"})
    await redis.xadd(interactive, {"job": "i1"})
    assert jobs(await intake.read(1, block_ms=100)) == [(interactive, b"i0")]
    assert jobs(await intake.read(5, block_ms=100)) == [(interactive, b"i1")]  # never a mix: batch waits
    assert jobs(await intake.read(2, block_ms=100)) == [(batch, b"b0"), (batch, b"b1")]
    await redis.xadd(interactive, {"job": "i2"})
    assert jobs(await intake.read(2, block_ms=100)) == [(interactive, b"i2")]
    assert jobs(await intake.read(2, block_ms=100)) == [(batch, b"b2")]
    assert await intake.read(2, block_ms=50) == []


@pytest.mark.parametrize("which", ["interactive", "batch"])
async def test_an_idle_worker_wakes_for_either_stream(streams, which: str) -> None:
    redis, interactive, batch, intake = streams
    target = interactive if which == "interactive" else batch
    reading = asyncio.create_task(intake.read(4, block_ms=5000))
    await asyncio.sleep(0.2)
    assert not reading.done()
    await redis.xadd(target, {"job": "x"})
    assert jobs(await asyncio.wait_for(reading, 3)) == [(target, b"x")]


async def test_a_lost_group_is_reported_as_nogroup(streams) -> None:
    """The worker recreates both groups when Redis lost them: it recognises the error (`is_nogroup`)."""
    redis, _, batch, intake = streams
    await redis.delete(batch)
    with pytest.raises(ResponseError) as lost:
        await intake.read(1, block_ms=10)
    assert is_nogroup(lost.value)
