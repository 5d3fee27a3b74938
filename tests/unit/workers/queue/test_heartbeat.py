"""A heartbeat on the real redis-server, built from what it reads (no worker): it announces the worker and its
card, and brings back the steering the worker acts on."""
from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest
import redis.asyncio as aioredis

from common.keys import Keys
from common.modelcard import ModelCard
from common.servable import ServableType
from common.settings import Settings
from workers.queue.heartbeat import Heartbeat, Rate, gone_apis
from workers.vitals import Member, Vitals

MEMBER = Member("w1", "m", "CPU", "s:jobs", "s:batch", started=1.0)
VITALS = Vitals(card=ModelCard(name="m", device="CPU", servable_type=ServableType.LM_CB, created=1),
                capacity=4, running=1, draining=False, engine_alive=True, engine=[3, 2, 25.0, 0], jobs_taken=7,
                reclaimed=0, tokens_generated=100, engine_restarts=0, listeners=frozenset(), port=0, redis_silent_s=0.0)


@pytest.fixture()
async def beat(redis_url: str):
    keys = Keys(f"hb{time.time_ns()}")
    redis = aioredis.Redis.from_url(redis_url)
    now = [VITALS]
    heartbeat = Heartbeat(redis, keys, Settings(redis_url=redis_url, api_ttl_s=5), MEMBER, lambda: now[0])
    yield redis, keys, heartbeat, now
    await redis.aclose()


async def test_a_beat_announces_the_worker_and_its_card(beat) -> None:
    redis, keys, heartbeat, _ = beat
    steering = await heartbeat.beat()
    assert not steering.drain and steering.gone == set()
    worker = await redis.hgetall(keys.worker("w1"))
    assert (worker[b"model"], worker[b"capacity"], worker[b"running"], worker[b"kv_cache_usage"]) == \
        (b"m", b"4", b"1", b"0.25")
    assert await redis.zscore(keys.workers("m", "CPU"), "w1") is not None
    assert 0 < await redis.ttl(keys.workers("m", "CPU")) <= 10 * heartbeat.settings.worker_ttl_s + 1
    assert ModelCard.model_validate_json(await redis.hget(keys.model("m"), "CPU")).servable_type is ServableType.LM_CB
    await heartbeat.leave()
    assert not await redis.exists(keys.worker("w1")) and await redis.zscore(keys.workers("m", "CPU"), "w1") is None


async def test_a_beat_tells_the_admission_knee_the_worker_learned(beat) -> None:
    redis, keys, heartbeat, now = beat
    now[0] = replace(VITALS, admission_knee=53, admission_limit=21)
    await heartbeat.beat()
    assert await redis.hmget(keys.worker("w1"), "admission_knee", "admission_limit") == [b"53", b"21"]


async def test_a_beat_brings_back_a_drain_request_and_the_gone_apis(beat) -> None:
    redis, keys, heartbeat, now = beat
    await redis.set(keys.drain("w1"), 1)
    await redis.zadd(keys.apis, {"api-old": time.time() - 60, "api-live": time.time()})
    now[0] = replace(VITALS, listeners=frozenset({"api-old", "api-live", "api-unheard"}))
    steering = await heartbeat.beat()
    assert steering.drain and steering.gone == {"api-old"}


async def test_beats_yield_each_beat(beat) -> None:
    _, _, heartbeat, _ = beat
    beats = heartbeat.beats()
    before = heartbeat.last_ok
    assert not (await anext(beats)).drain
    assert heartbeat.last_ok >= before
    await beats.aclose()


def test_an_api_never_heard_of_is_not_gone() -> None:
    assert gone_apis(["old", "new", "unheard"], [time.time() - 10, time.time(), None], api_ttl_s=5) == {"old"}


def test_rate_over_the_window() -> None:
    rate = Rate()
    assert rate.update(0.0, 0) == 0.0
    assert rate.update(2.0, 20) == 10.0
    assert rate.update(30.0, 20) == 0.0  # the first sample left the window: nothing generated since 2.0


async def test_a_beat_brings_back_the_resumable_jobs_nobody_reads(beat) -> None:
    redis, keys, heartbeat, now = beat
    now[0] = replace(VITALS, followed=frozenset({"read", "left"}))
    await redis.set(keys.reader("read"), "api1", ex=30)
    assert (await heartbeat.beat()).unread == {"left"}


async def test_stale_heartbeats_say_nothing_until_redis_answered_a_whole_ttl(beat) -> None:
    """After an outage every worker's heartbeat is stale; the reclaimer may judge them only once this worker's
    own beats have gone through for a TTL (a live one has beaten again by then)."""
    redis, keys, _, now = beat
    settings = Settings(worker_ttl_s=0.2, heartbeat_s=0.01)
    heartbeat = Heartbeat(redis, keys, settings, MEMBER, lambda: now[0])
    assert not heartbeat.steady(), "a worker just started has not seen Redis for a TTL"
    await asyncio.sleep(0.25)
    assert heartbeat.steady()
    real, fails = heartbeat.beat, [2]

    async def flaky():
        if fails[0]:
            fails[0] -= 1
            raise ConnectionError("Redis is away")
        return await real()

    heartbeat.beat = flaky  # type: ignore[method-assign]
    beats = heartbeat.beats()
    await anext(beats)  # through two failed beats
    assert not heartbeat.steady(), "Redis just came back"
    await asyncio.sleep(0.25)
    assert heartbeat.steady()
    await beats.aclose()


async def test_a_stale_api_heartbeat_says_nothing_until_redis_answered_a_whole_api_ttl(beat) -> None:
    """After a Redis outage or failover every API process's score is stale until it beats again: a worker that
    judged at once would cancel the running jobs of live API processes (seen in benchmarks/chaos.py's failover)."""
    redis, keys, _, now = beat
    heartbeat = Heartbeat(redis, keys, Settings(api_ttl_s=0.2, heartbeat_s=0.01), MEMBER, lambda: now[0])
    await redis.zadd(keys.apis, {"api-stale": time.time() - 60})
    now[0] = replace(VITALS, listeners=frozenset({"api-stale"}))
    real, fails = heartbeat.beat, [1]

    async def flaky():
        if fails[0]:
            fails[0] -= 1
            raise ConnectionError("Redis is away")
        return await real()

    heartbeat.beat = flaky  # type: ignore[method-assign]
    beats = heartbeat.beats()
    assert (await anext(beats)).gone == set(), "Redis just came back: the API may not have beaten yet"
    assert not heartbeat.judges_apis()
    await asyncio.sleep(0.25)
    assert (await anext(beats)).gone == {"api-stale"}
    await beats.aclose()
