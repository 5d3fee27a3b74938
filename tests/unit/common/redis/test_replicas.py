"""WAIT in the enqueue's round trip, on the real redis-server: asked only for replicas the primary has."""
from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from common.redis.lane import Lane, Script
from common.redis.replicas import ReplicaWait

SET = Script("redis.call('SET', KEYS[1], ARGV[1]) return 7")


@pytest.fixture()
async def lane(redis_url: str) -> AsyncIterator[Lane]:
    client = aioredis.Redis.from_url(redis_url)
    made = Lane(client)
    yield made
    await made.close()
    await client.aclose()


async def test_a_primary_without_replicas_is_waited_for_once_then_not_at_all(lane: Lane) -> None:
    wait = ReplicaWait(wanted=1, timeout_ms=50)
    assert await wait.run(lane, SET, ["replicas:a"], ["1"]) == 7
    assert wait.short == 1 and wait.connected == 0  # WAIT ran out; INFO said: no replica
    assert await wait.run(lane, SET, ["replicas:a"], ["2"]) == 7
    assert wait.short == 1  # no WAIT asked for a replica that is not there


async def test_a_script_redis_forgot_is_loaded_and_still_waited_for(lane: Lane) -> None:
    script = Script(f"return '{id(lane)}'")  # one this Redis has never seen
    wait = ReplicaWait(wanted=1, timeout_ms=20)
    wait._info_at = 1e18  # noqa: SLF001 - INFO not asked: the replica is assumed there
    assert await wait.run(lane, script, [], []) == str(id(lane)).encode()
    assert wait.short == 1


async def test_commands_before_the_script_run_ahead_of_it_and_its_reply_is_still_the_answer(lane: Lane) -> None:
    wait = ReplicaWait(wanted=1, timeout_ms=20)
    get = Script("return redis.call('GET', KEYS[1])")
    assert await wait.run(lane, get, ["replicas:b"], [], before=[["SET", "replicas:b", "lease"]]) == b"lease"
    assert await wait.run(lane, get, ["replicas:b"], [], before=[["SET", "replicas:b", "again"]]) == b"again"
