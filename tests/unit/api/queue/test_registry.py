"""Routing and enqueueing: one Lua script on the real redis-server (fakeredis has no Lua here)."""
from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis

from api.queue.registry import Registry
from common.errors import OvqError
from common.jobs import Job, SamplingParams
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
    yield redis, keys, Registry(redis, keys, Settings(max_queue_depth=3), expected=["expected"])
    await redis.aclose()


async def test_unknown_model_is_404_and_expected_but_unserved_is_503(setup) -> None:
    _, _, reg = setup
    with pytest.raises(OvqError) as caught:
        await reg.servable("nope")
    assert caught.value.status == 404
    with pytest.raises(OvqError) as caught:
        await reg.servable("expected")
    assert caught.value.status == 503


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
    assert [await reg.enqueue(servable, job()) for _ in range(3)] == ["GPU", "CPU", "GPU"]
    first = job()
    assert await reg.enqueue(servable, first) == "CPU"  # GPU 2, CPU 1 waiting
    assert first.device == "CPU"
    entries = await redis.xrange(keys.jobs("m", "CPU"))
    assert Job.from_fields(entries[-1][1]).device == "CPU"
    assert await redis.hget(keys.job(first.id), "status") == b"queued"
    assert 0 < await redis.ttl(keys.job(first.id))


async def test_full_backlog_is_429_and_no_live_worker_is_503(setup) -> None:
    redis, keys, reg = setup
    await redis.hset(keys.model("m"), "CPU", card("CPU"))
    servable = await reg.servable("m")
    with pytest.raises(OvqError) as caught:
        await reg.enqueue(servable, job())
    assert caught.value.status == 503
    await redis.zadd(keys.workers("m", "CPU"), {"c": time.time()})
    for _ in range(3):
        await reg.enqueue(servable, job())
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
    assert [await reg.enqueue(servable, b) for b in batch] == ["CPU", "GPU", "CPU"]  # fewest jobs of either kind
    assert (await redis.xlen(keys.batch_jobs("m", "CPU")), await redis.xlen(keys.jobs("m", "CPU"))) == (2, 0)
    entry = (await redis.xrange(keys.batch_jobs("m", "CPU")))[0]
    assert Job.from_fields(entry[1]).priority == "batch"
    # Interactive jobs see only interactive backlogs: CPU (2 batch lines waiting) is still the first choice.
    assert await reg.enqueue(servable, job()) == "CPU"
    # A full batch backlog refuses batch lines, not interactive jobs.
    for _ in range(2):  # both devices then have 3 jobs of either kind, the limit
        assert await reg.enqueue(servable, job().model_copy(update={"priority": "batch"})) == "GPU"
    with pytest.raises(OvqError) as caught:
        await reg.enqueue(servable, job().model_copy(update={"priority": "batch"}))
    assert caught.value.status == 429
    assert await reg.enqueue(servable, job()) == "GPU"
