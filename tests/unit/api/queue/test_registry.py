"""Routing and enqueueing: one Lua script on the real redis-server (fakeredis has no Lua here)."""
from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from api.queue.registry import Registry
from common.errors import OvqError
from common.jobs import Job, JobHash, SamplingParams
from common.keys import Keys
from common.modelcard import ModelCard
from common.servable import ServableType
from common.settings import Settings


def card(device: str, preference: int = 0) -> str:
    return ModelCard(name="m", device=device, servable_type=ServableType.LM_CB, context_length=64,
                     chat_template="x", created=0, preference=preference).model_dump_json()


def job() -> Job:
    return Job(model="m", device="", kind="completion", prompt="x", add_special_tokens=True,
               params=SamplingParams(), reply_to="api")


@pytest.fixture()
async def setup(redis_url: str):
    keys = Keys(f"unit{time.time_ns()}")
    redis = aioredis.Redis.from_url(redis_url)
    settings = Settings(max_queue_depth=3, queue_timeout_s=1)
    yield redis, keys, Registry(redis, keys, settings, expected=["expected"], devices={"expected": ["GPU", "CPU"]})
    await redis.aclose()


async def test_unknown_model_is_404_and_expected_one_with_no_card_waits_for_it_then_503(setup) -> None:
    redis, keys, reg = setup
    with pytest.raises(OvqError) as caught:
        await reg.servable("nope")
    assert caught.value.status == 404
    with pytest.raises(OvqError) as caught:
        await reg.servable("expected")  # nobody announces it within queue_timeout_s
    assert caught.value.status == 503 and "`expected`" in caught.value.body.message
    assert "queue_timeout_s" in caught.value.body.message

    awaiting = keys.awaiting("expected", "GPU")  # its first device in the models file
    assert not await redis.exists(awaiting), "the wait that timed out left nothing behind"

    async def announce() -> None:
        await asyncio.sleep(0.2)
        # While the request waits for a card it counts where a scaler watching the model's workers sees it.
        assert await redis.llen(awaiting) == 1 and 0 < await redis.ttl(awaiting) <= 61
        await redis.hset(keys.model("expected"), "CPU", card("CPU"))

    announcing = asyncio.ensure_future(announce())
    servable = await reg.servable("expected")  # its worker announces while the request waits
    await announcing
    assert list(servable.cards) == ["CPU"]
    assert not await redis.exists(awaiting)


async def test_shortest_backlog_among_live_devices_wins(setup) -> None:
    redis, keys, reg = setup
    cards = {"CPU": card("CPU", 1), "NPU": card("NPU", 2), "GPU": card("GPU", 0)}
    await redis.hset(keys.model("m"), mapping=cards)
    now = time.time()
    await redis.zadd(keys.workers("m", "GPU"), {"g": now})
    await redis.zadd(keys.workers("m", "CPU"), {"c": now})
    await redis.zadd(keys.workers("m", "NPU"), {"n": now - 600})  # dead: its empty backlog does not count
    servable = await reg.servable("m")
    assert list(servable.cards) == ["GPU", "CPU", "NPU"]  # the models file's order of preference
    assert [(await reg.enqueue(servable, job())).device for _ in range(3)] == ["GPU", "CPU", "GPU"]
    first = job()
    assert (await reg.enqueue(servable, first)).device == "CPU"  # GPU 2, CPU 1 waiting
    assert first.device == "CPU"
    entries = await redis.xrange(keys.jobs("m", "CPU"))
    assert Job.from_fields(entries[-1][1]).device == "CPU"
    assert await redis.hget(keys.job(first.id), "status") == b"queued"
    assert 0 < await redis.ttl(keys.job(first.id))


async def test_full_backlog_is_429_and_with_no_live_worker_the_job_waits_until_withdrawn(setup) -> None:
    redis, keys, reg = setup
    await redis.hset(keys.model("m"), "CPU", card("CPU"))
    servable = await reg.servable("m")
    waiting = job()
    queued = await reg.enqueue(servable, waiting)
    assert (queued.device, queued.live, queued.stream) == ("CPU", False, keys.jobs("m", "CPU"))
    assert await redis.xlen(keys.jobs("m", "CPU")) == 1  # what wakes a scaler watching the stream
    assert await reg.withdraw(queued, waiting.id)  # its wait timed out: nobody runs it later
    assert await redis.xlen(keys.jobs("m", "CPU")) == 0
    assert await redis.hget(keys.job(waiting.id), "status") == b"cancelled"
    await redis.zadd(keys.workers("m", "CPU"), {"c": time.time()})
    for _ in range(3):
        assert (await reg.enqueue(servable, job())).live
    with pytest.raises(OvqError) as caught:
        await reg.enqueue(servable, job())
    assert caught.value.status == 429
    assert await redis.xlen(keys.jobs("m", "CPU")) == 3


async def test_batch_jobs_go_to_the_batch_stream_and_never_count_against_interactive_ones(setup) -> None:
    redis, keys, reg = setup
    await redis.hset(keys.model("m"), mapping={"CPU": card("CPU", 0), "GPU": card("GPU", 1)})
    now = time.time()
    await redis.zadd(keys.workers("m", "CPU"), {"c": now})
    await redis.zadd(keys.workers("m", "GPU"), {"g": now})
    servable = await reg.servable("m")
    batch = [job().model_copy(update={"priority": "batch"}) for _ in range(3)]
    # Each to the device with the fewest jobs of either kind.
    assert [(await reg.enqueue(servable, b)).device for b in batch] == ["CPU", "GPU", "CPU"]
    assert (await redis.xlen(keys.batch_jobs("m", "CPU")), await redis.xlen(keys.jobs("m", "CPU"))) == (2, 0)
    entry = (await redis.xrange(keys.batch_jobs("m", "CPU")))[0]
    assert Job.from_fields(entry[1]).priority == "batch"
    # Interactive jobs see only interactive backlogs: CPU (2 batch lines waiting) is still the first choice.
    assert (await reg.enqueue(servable, job())).device == "CPU"
    # A full batch backlog refuses batch lines, not interactive jobs.
    for _ in range(2):  # both devices then have 3 jobs of either kind, the limit
        assert (await reg.enqueue(servable, job().model_copy(update={"priority": "batch"}))).device == "GPU"
    with pytest.raises(OvqError) as caught:
        await reg.enqueue(servable, job().model_copy(update={"priority": "batch"}))
    assert caught.value.status == 429
    assert (await reg.enqueue(servable, job())).device == "GPU"


async def test_with_no_live_worker_a_job_waits_on_the_device_with_the_shortest_backlog(setup) -> None:
    redis, keys, reg = setup
    await redis.hset(keys.model("m"), mapping={"CPU": card("CPU", 1), "GPU": card("GPU", 0)})
    servable = await reg.servable("m")
    placed = [await reg.enqueue(servable, job()) for _ in range(3)]
    assert [(q.device, q.live) for q in placed] == [("GPU", False), ("CPU", False), ("GPU", False)]
    taken = job()
    queued = await reg.enqueue(servable, taken)
    await redis.hset(keys.job(taken.id), "status", "running")  # a worker took it meanwhile: it stays
    assert not await reg.withdraw(queued, taken.id)
    assert await redis.xlen(keys.jobs("m", queued.device)) == 2


async def test_wait_estimate_is_the_jobs_waiting_ahead_over_the_recent_finishing_rate(setup) -> None:
    from common.keys import GROUP
    from common.ops.stats import WINDOW_S, window_of

    redis, keys, reg = setup
    reg.settings.max_queue_depth = 100
    await redis.hset(keys.model("m"), mapping={"CPU": card("CPU")})
    await redis.zadd(keys.workers("m", "CPU"), {"w": time.time()})
    servable = await reg.servable("m")
    stream = keys.jobs("m", "CPU")
    await redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
    await redis.xgroup_create(keys.batch_jobs("m", "CPU"), GROUP, id="0", mkstream=True)
    assert await reg.wait_estimate(servable, "interactive") == 0.0  # nothing waits
    for _ in range(7):
        await reg.enqueue(servable, job())
    await redis.xreadgroup(GROUP, "w", {stream: ">"}, count=1)  # one running: not waiting
    batch = job()
    batch.priority = "batch"
    await reg.enqueue(servable, batch)
    reg._estimates.clear()
    assert await reg.wait_estimate(servable, "interactive") is None  # jobs wait, nothing finished lately: unknown
    now = time.time()
    await redis.hset(keys.stats("m", "CPU", window_of(now)), mapping={"done": 8, "error": 2})
    await redis.hset(keys.stats("m", "CPU", window_of(now) - WINDOW_S), mapping={"cancelled": 2})
    reg._estimates.clear()
    seconds = 2 * WINDOW_S + max(now - window_of(now), 1.0)
    interactive = await reg.wait_estimate(servable, "interactive")
    assert interactive is not None and abs(interactive - 6 * seconds / 12) < 0.5
    reg._estimates.clear()
    lowest = await reg.wait_estimate(servable, "batch")  # the interactive jobs wait ahead of a batch one
    assert lowest is not None and abs(lowest - 7 * seconds / 12) < 0.5


async def test_a_resumable_streams_job_is_queued_with_its_reader_lease_and_no_other_job_is(setup) -> None:
    redis, keys, reg = setup
    await redis.hset(keys.model("m"), mapping={"CPU": card("CPU")})
    await redis.zadd(keys.workers("m", "CPU"), {"c": time.time()})
    servable = await reg.servable("m")
    plain, resumable, background = job(), job(), job()
    resumable.journal = background.journal = background.background = True
    for each in (plain, resumable, background):
        await reg.enqueue(servable, each, "alpha")
    assert await redis.get(keys.reader(resumable.id, "m")) == b"api"  # the API process that streams it
    assert 0 < await redis.ttl(keys.reader(resumable.id, "m")) <= round(reg.settings.resume_grace_s)
    assert not await redis.exists(keys.reader(plain.id, "m"), keys.reader(background.id, "m"))
    # Its owner, who alone may resume it, is in its hash with the job's TTL (a background response's is in its own
    # record: api/openai/responses/background.py).
    assert await redis.hget(keys.job(resumable.id, "m"), JobHash.OWNER) == b"alpha"
    assert 0 < await redis.ttl(keys.job(resumable.id, "m")) <= reg.settings.job_ttl_s
    assert await redis.hget(keys.job(plain.id, "m"), JobHash.OWNER) is None
