"""Prefix affinity's worker half on the real redis-server: its own stream first (below high), stealing others'
jobs only once they waited the threshold, a blocking read that wakes for its own stream, and the served record."""
from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from api.queue.affinity import prefix_digests
from api.queue.registry import Registry, Servable
from common.jobs import LEVELS, Job, SamplingParams, Share
from common.keys import GROUP, Keys
from common.modelcard import ModelCard
from common.servable import ServableType
from common.settings import Settings
from workers.queue.affinity import AffineIntake, Affinity
from workers.queue.intake import FairKeys
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


# ---- priorities and fair shares on affinity streams: the API's enqueue (tags, order) and the worker's reads --------
CARD = ModelCard(name="m", device="CPU", servable_type=ServableType.LM_CB, context_length=64, chat_template="x",
                 created=0)


@pytest.fixture()
async def tenants(redis_url: str):
    """Two live workers with fair shares and aging (1 s) on the real redis-server, and the API's registry."""
    keys = Keys(f"afft{time.time_ns()}")
    redis = aioredis.Redis.from_url(redis_url)
    settings = Settings(affinity=True, affinity_steal_ms=5000, affinity_max_waiting=4, max_queue_depth=1000)
    fair = FairKeys.of(keys, "m", "CPU", LEVELS)
    made = {}
    for worker in ("w1", "w2"):
        m = member(keys, worker)
        affinity = Affinity(redis, keys, settings, m)
        for stream in (*m.streams, *(s for _, s in m.levels), fair.bell, affinity.stream):
            with contextlib.suppress(ResponseError):  # BUSYGROUP: the other worker made it
                await redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
        made[worker] = AffineIntake(redis, worker, *(s for _, s in m.levels), aging_s=1.0, fair=fair,
                                    affinity=affinity)
        await redis.zadd(keys.workers("m", "CPU"), {worker: time.time()})
    for _ in range(2):
        for intake in made.values():
            await intake.affinity.beat()
    registry = Registry(redis, keys, settings, expected=[])
    servable = Servable("m", {"CPU": CARD})

    async def enqueue(name: str, tenant: str, pinned_to: str | None = None, priority: str = "interactive"):
        prefixes = prefix_digests("p", 256, key=f"conversation {name}")
        if pinned_to:  # the worker that served this conversation last
            await redis.set(keys.prefix_owner("m", prefixes[0]), f"CPU|{pinned_to}")
        job = Job(id=name, model="m", device="", kind="chat", prompt="p", params=SamplingParams(max_tokens=10),
                  reply_to="api", priority=priority, prefixes=prefixes,
                  share=Share(tenant=tenant, weight=1.0, cost=10))
        return await registry.enqueue(servable, job)

    async def read(worker: str, count: int = 1) -> list[str]:
        return [Job.from_fields(fields).id for _, entries in await made[worker].read(count, block_ms=50)
                for _, fields in entries]

    yield redis, keys, made, enqueue, read
    for intake in made.values():
        await intake.close()
    await registry.close()
    await redis.aclose()


async def test_a_flood_pinned_to_a_worker_does_not_pass_another_tenants_jobs_there(tenants) -> None:
    """Tenant A's conversation pins its flood to w1 (`prompt_cache_key`); B's jobs, pinned there too or not, wait
    behind no A job that had not started: on w1, and on w2, which takes the shared stream's in fair order."""
    redis, keys, made, enqueue, read = tenants
    w1_stream = made["w1"].affinity.stream
    queued = [await enqueue(f"a{n}", "A", pinned_to="w1") for n in range(12)]
    assert [q.stream for q in queued].count(w1_stream) == 4  # OVQ_AFFINITY_MAX_WAITING, then the shared stream
    tags = [float(fields[b"s"]) for _, fields in await redis.xrange(w1_stream)]
    assert tags == [0.0, 10.0, 20.0, 30.0], "each tagged with its virtual start, as a parked job is"
    assert await read("w1") == ["a0"]
    b0 = await enqueue("b0", "B", pinned_to="w1")
    assert b0.stream == keys.jobs("m", "CPU"), "it would run before jobs waiting in w1's stream: not behind them"
    assert await read("w1") == ["b0"], "B's job passes A's pinned ones on A's worker"
    assert await read("w1", 3) == ["a1", "a2", "a3"]
    await enqueue("b1", "B")  # not pinned: parked in the shared stream
    assert await read("w2") == ["b1"], "the other worker too: fair order, not A's backlog first"
    assert await read("w1", 2) == ["a4", "a5"], "A's shared jobs in their order, after its pinned ones"
    assert await redis.hget(keys.fair_clock("m", "CPU", "interactive"), "v") == b"50"


async def test_a_parked_high_job_and_an_aged_low_one_go_before_a_workers_affinity_jobs(tenants) -> None:
    redis, keys, made, enqueue, read = tenants
    for n in range(3):
        await enqueue(f"a{n}", "A", pinned_to="w1")
    await enqueue("urgent", "B", priority="high")  # parked: no undelivered entry in the high stream
    assert await read("w1") == ["urgent"]
    low = Job(id="low", model="m", device="CPU", kind="chat", prompt="p", params=SamplingParams(), reply_to="api",
              priority="low")
    old_ms = int(time.time() * 1000) - 3_000  # waited 3 s: aged two levels (1 s each) past the affinity jobs
    await redis.xadd(keys.level_jobs("m", "CPU", "low"), {"job": low.model_dump_json()}, id=f"{old_ms}-0")
    assert await read("w1") == ["low"]
    assert await read("w1", 4) == ["a0", "a1", "a2"]


async def test_a_thief_takes_a_tenants_earlier_shared_job_before_anothers_pinned_backlog(tenants) -> None:
    redis, keys, made, enqueue, read = tenants
    made["w2"].affinity.settings = Settings(affinity=True, affinity_steal_ms=0)
    for n in range(3):
        await enqueue(f"a{n}", "A", pinned_to="w1")
    assert await read("w2") == ["a0"]  # nothing else waits: stolen
    await enqueue("b0", "B")
    assert await read("w2") == ["b0"]
    assert await read("w2", 4) == ["a1", "a2"]
    assert made["w2"].affinity.steals == 0 and await redis.xlen(made["w1"].affinity.stream) == 3
