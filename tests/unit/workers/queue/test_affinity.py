"""Prefix affinity's worker half on the real redis-server: its own stream first (below high), stealing others'
jobs only once they waited the threshold, a blocking read that wakes for its own stream, and the served record."""
from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from common.jobs import LEVELS, Job, SamplingParams
from common.keys import GROUP, Keys
from common.settings import Settings
from workers.queue.affinity import AffineIntake, Affinity
from workers.vitals import Member


def member(keys: Keys, worker: str) -> Member:
    levels = tuple((level, keys.level_jobs("m", "CPU", level)) for level in LEVELS)
    return Member(worker, "m", "CPU", keys.jobs("m", "CPU"), keys.batch_jobs("m", "CPU"), 0.0, levels)


@pytest.fixture()
async def fleet(redis_url: str):
    keys = Keys(f"affw{time.time_ns()}")
    redis = aioredis.Redis.from_url(redis_url)
    settings = Settings(affinity=True, affinity_steal_ms=5000)
    made = {}
    for worker in ("w1", "w2"):
        m = member(keys, worker)
        affinity = Affinity(redis, keys, settings, m)
        for stream in (*m.streams, affinity.stream) if worker == "w1" else (affinity.stream,):
            await redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
        made[worker] = AffineIntake(redis, worker, *(s for _, s in m.levels), affinity=affinity)
    for _ in range(2):  # the second round: each has heard of the other
        for intake in made.values():
            await intake.affinity.beat()
    yield redis, keys, made
    for intake in made.values():
        await intake.close()
    await redis.aclose()


def jobs(reply: list) -> list[tuple[str, bytes]]:
    return [(stream, fields[b"job"]) for stream, entries in reply for _, fields in entries]


async def test_its_affinity_jobs_come_before_shared_interactive_ones_but_not_before_high(fleet) -> None:
    redis, keys, made = fleet
    w1 = made["w1"]
    own, interactive, high = w1.affinity.stream, keys.jobs("m", "CPU"), keys.level_jobs("m", "CPU", "high")
    await redis.xadd(interactive, {"job": "shared"})
    await redis.xadd(own, {"job": "mine"})
    await redis.xadd(high, {"job": "urgent"})
    assert jobs(await w1.read(4, block_ms=100)) == [(high, b"urgent")]
    assert jobs(await w1.read(4, block_ms=100)) == [(own, b"mine")]
    assert jobs(await w1.read(4, block_ms=100)) == [(interactive, b"shared")]
    assert w1.affinity.others == [made["w2"].affinity.stream]


async def test_another_workers_jobs_are_stolen_only_once_they_waited_the_threshold(fleet) -> None:
    redis, keys, made = fleet
    w1, w2 = made["w1"], made["w2"]
    victim, high, batch = w2.affinity.stream, keys.level_jobs("m", "CPU", "high"), keys.batch_jobs("m", "CPU")
    old_ms = int(time.time() * 1000) - 10_000
    await redis.xadd(victim, {"job": "old1"}, id=f"{old_ms}-0")
    await redis.xadd(victim, {"job": "old2"}, id=f"{old_ms}-1")
    await redis.xadd(victim, {"job": "new"})
    await redis.xadd(batch, {"job": "line"})
    await redis.xadd(high, {"job": "urgent"})
    assert jobs(await w1.read(8, block_ms=50)) == [(high, b"urgent")]  # a higher level first, stolen or not
    assert jobs(await w1.read(8, block_ms=50)) == [(victim, b"old1"), (victim, b"old2")]  # before batch lines
    assert jobs(await w1.read(8, block_ms=50)) == [(batch, b"line")]
    assert await w1.read(8, block_ms=50) == []  # the new one has not waited 5 s: w2 may still take it
    assert 0 < w1.affinity.next_steal_ms <= 5000  # an idle thief blocks no longer than that
    pending = await redis.xpending_range(victim, GROUP, "-", "+", 10)
    assert [p["consumer"] for p in pending] == [b"w1", b"w1"]  # reclaimed from there if w1 dies
    assert jobs(await w2.read(8, block_ms=50)) == [(victim, b"new")]


async def test_an_idle_worker_wakes_for_its_affinity_stream(fleet) -> None:
    redis, _, made = fleet
    w1 = made["w1"]
    reading = asyncio.create_task(w1.read(4, block_ms=5000))
    await asyncio.sleep(0.3)
    assert not reading.done()
    await redis.xadd(w1.affinity.stream, {"job": "x"})
    assert jobs(await asyncio.wait_for(reading, 3)) == [(w1.affinity.stream, b"x")]


async def test_served_jobs_are_counted_by_origin_and_their_prefixes_recorded_with_a_ttl(fleet) -> None:
    redis, keys, made = fleet
    affinity = made["w1"].affinity

    def job(affinity_of: str | None, prefixes: list[str] | None) -> Job:
        return Job(model="m", device="CPU", kind="chat", prompt="p", params=SamplingParams(), reply_to="api",
                   affinity=affinity_of, prefixes=prefixes)

    affinity.served([job("w1", ["a1", "a0"]), job("w2", ["b0"]), job(None, None)])
    assert (affinity.hits, affinity.steals, affinity.recorded) == (1, 1, 2)
    await asyncio.gather(*affinity._tasks)
    for digest in ("a1", "a0", "b0"):
        key = keys.prefix_owner("m", digest)
        assert await redis.get(key) == b"CPU|w1" and 0 < await redis.ttl(key) <= 600


async def test_a_draining_worker_hands_its_waiting_jobs_to_the_shared_stream_and_records_no_prefixes(fleet) -> None:
    redis, keys, made = fleet
    w1, w2 = made["w1"], made["w2"]
    own, shared = w2.affinity.stream, keys.jobs("m", "CPU")

    def job(n: int) -> Job:
        return Job(id=f"j{n}", model="m", device="CPU", kind="chat", prompt="p", params=SamplingParams(),
                   reply_to="api", affinity="w2", prefixes=["d"])

    for n in range(3):
        await redis.xadd(own, {"job": job(n).model_dump_json()})
    [(_, [(_, running)])] = await redis.xreadgroup(GROUP, "w2", {own: ">"}, count=1)  # one runs: it stays
    assert await w2.affinity.drain() == 2
    assert await redis.xlen(own) == 1 and Job.from_fields(running).id == "j0"
    moved = [Job.from_fields(fields) for _, fields in await redis.xrange(shared)]
    assert [(j.id, j.affinity, j.prefixes) for j in moved] == [("j1", None, ["d"]), ("j2", None, ["d"])]
    assert await redis.zscore(keys.affinity_draining("m", "CPU"), "w2") is not None
    assert 0 < await redis.ttl(keys.affinity_draining("m", "CPU"))
    assert [stream for stream, _ in await w1.read(8, block_ms=50)] == [shared]  # at once, not after 5 s
    w2.affinity.served([job(3)])
    assert not w2.affinity._tasks and await redis.get(keys.prefix_owner("m", "d")) is None
