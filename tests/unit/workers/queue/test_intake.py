"""A worker's reads on the real redis-server: interactive jobs first, batch lines only when none waits."""
from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from api.queue.registry import Registry, Servable
from common.jobs import LEVELS, Job, Share
from common.keys import GROUP, Keys
from common.modelcard import ModelCard
from common.ops.stats import window_of
from common.redis.client import is_nogroup
from common.servable import ServableType
from common.settings import Settings
from workers.queue.intake import FairKeys, Intake


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


async def test_a_read_comes_back_whole_whatever_bytes_its_entries_hold(streams) -> None:
    """The read's packed reply (PACK) is cut by lengths: spaces, newlines, empty and non-UTF-8 values survive."""
    redis, interactive, _, intake = streams
    odd = {b"job": b"a b\nc \n\xff\x00", b"": b"", b"two words": b" "}
    first = await redis.xadd(interactive, odd)
    second = await redis.xadd(interactive, {"job": "plain"})
    [(stream, entries)] = await intake.read(5, block_ms=100)
    assert stream == interactive
    assert entries == [(first, odd), (second, {b"job": b"plain"})]


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


# ---- fair shares per tenant (common/fairness.py): the API's enqueue parks, this read takes in fair order -------
CARD = ModelCard(name="m", device="CPU", servable_type=ServableType.LM_CB, context_length=64, chat_template="x",
                 created=0)


@pytest.fixture()
async def fair(redis_url: str):
    keys = Keys(f"fair{time.time_ns()}")
    redis = aioredis.Redis.from_url(redis_url)
    streams = [keys.level_jobs("m", "CPU", level) for level in LEVELS]
    fair_keys = FairKeys.of(keys, "m", "CPU", LEVELS)
    for stream in (*streams, fair_keys.bell):  # as the worker's ensure_group
        await redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
    await redis.zadd(keys.workers("m", "CPU"), {"w1": time.time()})
    registry = Registry(redis, keys, Settings(max_queue_depth=1000), expected=[])
    servable = Servable("m", {"CPU": CARD})
    intake = Intake(redis, "w1", *streams, fair=fair_keys)

    async def enqueue(name: str, tenant: str | None = None, weight: float = 1.0, cost: int = 10,
                      priority: str = "interactive"):
        job = Job(id=name, model="m", device="", kind="completion", prompt="x", reply_to="api", priority=priority,
                  share=Share(tenant=tenant, weight=weight, cost=cost) if tenant else None)
        return await registry.enqueue(servable, job)

    async def read(count: int = 1, block_ms: int = 50) -> list[str]:
        return [Job.from_fields(fields).id for _, entries in await intake.read(count, block_ms)
                for _, fields in entries]

    yield redis, keys, registry, intake, enqueue, read
    await intake.close()
    await registry.close()
    await redis.aclose()


async def test_a_tenant_arriving_during_a_flood_is_served_next_not_behind_it(fair) -> None:
    redis, keys, _, _, enqueue, read = fair
    for n in range(20):
        await enqueue(f"a{n}", "A")
    assert await redis.xlen(keys.jobs("m", "CPU")) == 20, "parked jobs stay in the stream: backlog, KEDA count them"
    assert await read() == ["a0"]
    await enqueue("b0", "B")
    assert await read() == ["b0"], "B waits behind no A job that had not started"
    assert await read(3) == ["a1", "a2", "a3"]
    await enqueue("b1", "B")
    await enqueue("plain")  # no tenant: read as before, ahead of the parked ones
    assert await read() == ["plain"]
    assert await read(2) == ["b1", "a4"]
    assert await redis.hget(keys.fair_clock("m", "CPU", "interactive"), "n:A") == b"15"
    assert await read(100) == [f"a{n}" for n in range(5, 20)]
    assert await read() == []
    assert not await redis.zcard(keys.fair_order("m", "CPU", "interactive"))


async def test_batches_of_two_owners_share_the_batch_level_fairly(fair) -> None:
    """Batch API lines run as their batch's owner's (api/batch/lines.py) carry the owner: a big batch queued first
    does not hold a later tenant's batch behind all of its lines."""
    redis, keys, _, _, enqueue, read = fair
    for n in range(8):
        await enqueue(f"a{n}", "A", priority="batch")
    assert await read() == ["a0"]
    await enqueue("b0", "B", priority="batch")
    assert await read(2) == ["b0", "a1"]
    assert await redis.hget(keys.fair_clock("m", "CPU", "batch"), "n:A") == b"6"


async def test_weights_share_the_worker_in_proportion(fair) -> None:
    _, _, _, _, enqueue, read = fair
    for n in range(10):
        await enqueue(f"a{n}", "A", weight=1)
        await enqueue(f"c{n}", "C", weight=2)
    taken = await read(9)
    assert (sum(j.startswith("a") for j in taken), sum(j.startswith("c") for j in taken)) == (3, 6)


async def test_an_idle_tenant_banks_no_credit(fair) -> None:
    _, _, _, _, enqueue, read = fair
    await enqueue("b0", "B")
    assert await read() == ["b0"]
    for n in range(6):
        await enqueue(f"a{n}", "A")
    assert await read(4) == ["a0", "a1", "a2", "a3"]
    for n in range(1, 4):  # B was idle while A ran: it restarts at the current virtual time, not before A's
        await enqueue(f"b{n}", "B")
    assert await read(4) == ["b1", "a4", "b2", "a5"]


async def test_an_idle_worker_wakes_for_a_parked_job(fair) -> None:
    _, _, _, intake, enqueue, _ = fair
    reading = asyncio.create_task(intake.read(4, block_ms=5000))
    await asyncio.sleep(0.2)
    assert not reading.done()
    await enqueue("a0", "A")
    got = await asyncio.wait_for(reading, 3)
    assert [fields[b"job"].count(b'"a0"') for _, entries in got for _, fields in entries] == [1]


async def test_a_withdrawn_parked_job_leaves_stream_order_and_counts(fair) -> None:
    redis, keys, registry, _, enqueue, read = fair
    queued = await enqueue("a0", "A")
    assert queued.parked is not None
    assert await registry.withdraw(queued, "a0")
    assert await redis.xlen(keys.jobs("m", "CPU")) == 0
    assert not await redis.zcard(keys.fair_order("m", "CPU", "interactive"))
    assert await redis.hget(keys.fair_clock("m", "CPU", "interactive"), "n:A") is None
    assert (await redis.xpending(keys.jobs("m", "CPU"), GROUP))["pending"] == 0
    assert await read() == []


async def test_the_wait_estimate_of_a_tenant_counts_only_what_starts_before_it(fair) -> None:
    redis, keys, registry, _, enqueue, _ = fair
    for n in range(20):
        await enqueue(f"a{n}", "A")
    await redis.hset(keys.stats("m", "CPU", window_of(time.time())), "done", 20)
    servable = Servable("m", {"CPU": CARD})
    everyone = await registry.wait_estimate(servable, "interactive")
    newcomer = await registry.wait_estimate(servable, "interactive", "B")
    flooder = await registry.wait_estimate(servable, "interactive", "A")
    assert everyone is not None and newcomer is not None and flooder is not None
    assert newcomer < everyone / 10, "B starts after A's first job, not after all twenty"
    assert flooder == pytest.approx(everyone, rel=0.01), "A's next job waits behind all of A's"


async def test_a_parked_low_priority_job_ages_in_too(fair) -> None:
    """Aging counts a level's oldest parked job as waiting since its enqueue, as it does a plain entry."""
    redis, keys, registry, _, _, _ = fair
    streams = [keys.level_jobs("m", "CPU", level) for level in LEVELS]
    fair_keys = FairKeys.of(keys, "m", "CPU", LEVELS)
    intake = Intake(redis, "w2", *streams, aging_s=0.5, fair=fair_keys)
    low = Job(id="l0", model="m", device="", kind="completion", prompt="x", reply_to="api", priority="low",
              share=Share(tenant="A"))
    assert (await registry.enqueue(Servable("m", {"CPU": CARD}), low)).parked is not None

    async def high(n: int) -> None:
        job = Job(id=f"h{n}", model="m", device="CPU", kind="completion", prompt="x", reply_to="api")
        await redis.xadd(streams[0], job.to_fields())

    async def read() -> list[str]:
        return [Job.from_fields(f).id for _, entries in await intake.read(1, 50) for _, f in entries]

    await high(0)
    assert await read() == ["h0"]
    await asyncio.sleep(1.7)  # three aging periods: low (3) - 3 ranks before fresh high work (1) - 0
    await high(1)
    assert await read() == ["l0"]
    assert await read() == ["h1"]
    await intake.close()
