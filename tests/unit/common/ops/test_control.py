"""Operator controls on a real redis-server: the background responses listed with their jobs' status, and
cancelled by their response id."""
from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis

from common.jobs import Job
from common.keys import Keys
from common.ops import control
from common.settings import Settings


@pytest.fixture()
async def ops(redis_url: str):
    redis = aioredis.Redis.from_url(redis_url)
    keys = Keys(f"ctl{time.time_ns()}")
    for n, (rid, status) in enumerate((("resp_a", None), ("resp_b", "running"), ("resp_c", "done"))):
        owner = {"owner": "alpha"} if rid != "resp_a" else {}  # resp_a: recorded before owners were
        await redis.hset(keys.background(rid), mapping={"job": f"job-{rid}", "model": "m", **owner})
        await redis.zadd(keys.backgrounds, {rid: 100 + n})
        if status:
            await redis.hset(keys.job(f"job-{rid}"), "status", status)
    await redis.zadd(keys.backgrounds, {"resp_expired": 99})
    yield redis, keys
    await redis.aclose()


async def test_background_responses_are_listed_newest_first_with_their_status(ops) -> None:
    redis, keys = ops
    listed = await control.background_responses(redis, keys)
    assert [(b.id, b.status, b.owner) for b in listed] == [
        ("resp_c", "done", "alpha"), ("resp_b", "running", "alpha"), ("resp_a", "queued", "(before owners)")]


async def test_an_operator_cancels_a_running_background_response_not_an_ended_one(ops, redis_url: str) -> None:
    redis, keys = ops
    settings = Settings(redis_url=redis_url)
    assert await control.cancel_background(redis, keys, settings, "resp_b") == "job-resp_b"
    assert await redis.exists(keys.cancel("job-resp_b"))
    with pytest.raises(control.Refused):
        await control.cancel_background(redis, keys, settings, "resp_c")
    with pytest.raises(control.NotFound):
        await control.cancel_background(redis, keys, settings, "resp_expired")


async def test_a_dead_letter_retried_goes_back_on_its_models_stream_once(redis_url: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    keys = Keys(f"ctl{time.time_ns()}")
    job = Job(model="m", device="CPU", kind="completion", prompt="hi", reply_to="api1")
    entry = (await redis.xadd(keys.dead, job.to_fields())).decode()
    await redis.hset(keys.job(job.id), mapping={"status": "failed", "error": "boom"})
    retried = await control.retry(redis, keys, Settings(redis_url=redis_url), entry)
    assert retried.id == job.id and retried.reply_to == control.RETRY_REPLY_TO
    assert await redis.xlen(keys.dead) == 0
    [(_, fields)] = await redis.xrange(keys.jobs("m", "CPU"))
    assert Job.from_fields(fields).id == job.id
    state = await redis.hgetall(keys.job(job.id))
    assert state[b"status"] == b"queued" and b"error" not in state and state[b"retries"] == b"1"
    with pytest.raises(control.NotFound):
        await control.retry(redis, keys, Settings(redis_url=redis_url), entry)
    await redis.aclose()
