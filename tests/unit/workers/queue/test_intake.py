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


async def test_low_priority_job_ages_in_ahead_of_a_steady_flow_of_higher_ones(redis_url: str) -> None:
    keys = Keys(f"aging{time.time_ns()}")
    redis = aioredis.Redis.from_url(redis_url)
    streams = [keys.level_jobs("m", "CPU", level) for level in ("high", "interactive", "low", "batch")]
    for stream in streams:
        await redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
    intake = Intake(redis, "w1", *streams, aging_s=1.0)
    high, interactive, low, batch = streams
    for stream, job in ((batch, "b0"), (low, "l0"), (low, "l1"), (interactive, "i0")):
        await redis.xadd(stream, {"job": job})
        await asyncio.sleep(0.01)  # enqueue times a few ms apart
    for n in range(6):
        await redis.xadd(high, {"job": f"h{n}"})

    async def read(count: int = 1) -> list[str]:
        return [job.decode() for _, job in jobs(await intake.read(count, block_ms=50))]

    assert await read() == ["h0"], "the highest level first while nothing has aged"
    await asyncio.sleep(1.1)
    # Everything waited one aging period: every level rose by one, so the levels still hold.
    assert await read(2) == ["h1", "h2"]
    assert await read(4) == ["h3", "h4", "h5"]
    await asyncio.sleep(2.0)
    # Fresh high work comes; the low jobs waited 3 periods (rank 3 - 3 < 1 - 0): aged in, one per read, before
    # it, the interactive one (2 - 3) first.
    await redis.xadd(high, {"job": "h7"})
    assert [await read(4) for _ in range(4)] == [["i0"], ["l0"], ["l1"], ["h7"]]
    assert await read(4) == ["b0"], "batch never ages in: it runs when nothing else waits"
    await intake.close()
    await redis.aclose()
