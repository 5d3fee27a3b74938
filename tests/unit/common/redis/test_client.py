"""What every tier shares about Redis: its errors told apart, the message for a request it left, the backoff."""
from __future__ import annotations

import logging
import time

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from common.redis.client import (
    Backoff,
    RedisRefused,
    RedisURLError,
    SentinelURL,
    describe,
    is_busygroup,
    is_nogroup,
    is_sentinel,
    keys_for,
    redis_away,
    redis_url,
    replicas_wanted,
    wait_until_up,
)
from common.settings import Settings


async def test_a_lost_and_an_existing_group_are_told_apart(redis_url: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    stream = f"client{time.time_ns()}"
    try:
        await redis.xgroup_create(stream, "g", id="0", mkstream=True)
        with pytest.raises(ResponseError) as exists:
            await redis.xgroup_create(stream, "g", id="0", mkstream=True)
        await redis.delete(stream)
        with pytest.raises(ResponseError) as lost:
            await redis.xreadgroup("g", "c", {stream: ">"}, count=1)
    finally:
        await redis.aclose()
    assert is_busygroup(exists.value) and not is_nogroup(exists.value)
    assert is_nogroup(lost.value) and not is_busygroup(lost.value)
    assert not is_nogroup(ConnectionError("NOGROUP No such key"))  # only Redis's own answer
    assert not is_nogroup(ResponseError("ERR no such key 'NOGROUP x'"))


def test_redis_away_is_a_503_to_retry() -> None:
    error = redis_away()
    assert (error.status, error.body.type, error.body.code) == (503, "service_unavailable", "service_unavailable")
    assert redis_away() is not error  # raised from many requests at once: each gets its own


def test_backoff_doubles_to_its_cap_and_starts_over_after_a_reset() -> None:
    backoff = Backoff(first=0.1, cap=0.5)
    assert [backoff.next() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    assert backoff.failures == 5
    backoff.reset()
    assert (backoff.next(), backoff.failures) == (0.1, 1)


async def test_backoff_waits_quietly_or_says_so_once_per_attempt(caplog: pytest.LogCaptureFixture) -> None:
    backoff = Backoff(first=0.001, cap=0.002)
    await backoff.wait()
    assert backoff.delay == 0.002 and not caplog.records
    log = logging.getLogger("test.backoff")
    assert backoff.failed(log, "reader", ConnectionError("Connection refused")) == 0.002
    backoff.succeeded(log, "reader")
    assert [r.getMessage() for r in caplog.records] == [
        "reader: Redis unavailable (connection refused); retry 2 in 0.0s", "reader: Redis is back after 2 retries"]
    assert (backoff.delay, backoff.failures) == (0.001, 0)


def test_a_sentinel_url_names_its_sentinels_service_db_and_credentials() -> None:
    url = "rediss+sentinel://app:s%40cret@h1:26379,h2,[::1]:26380/mymaster/2?sentinel_password=sp&ssl_ca_certs=/ca.pem"
    target = SentinelURL.parse(url)
    assert target.sentinels == [("h1", 26379), ("h2", 26379), ("::1", 26380)]
    assert (target.service, target.db, target.username, target.password, target.ssl) == ("mymaster", 2, "app",
                                                                                         "s@cret", True)
    assert target.sentinel_auth == {"password": "sp"}
    assert target.node_kwargs()["ssl_ca_certs"] == target.sentinel_kwargs(1.0)["ssl_ca_certs"] == "/ca.pem"
    assert (target.sentinel_kwargs(1.0)["password"], target.node_kwargs()["password"]) == ("sp", "s@cret")
    assert is_sentinel(url) and "s@cret" not in describe(url) and "mymaster" in describe(url)


@pytest.mark.parametrize("url", ["redis+sentinel://h1:26379", "redis+sentinel://h1:x/m", "redis+sentinel:///m",
                                 "redis+sentinel://h1/m/0/extra"])
def test_a_malformed_sentinel_url_is_refused_in_one_line(url: str) -> None:
    with pytest.raises(RedisURLError):
        redis_url(Settings(REDIS_URL=url))


def test_enqueues_wait_for_a_replica_by_default_with_sentinel_only() -> None:
    assert replicas_wanted(Settings(REDIS_URL="redis+sentinel://h:26379/m")) == 1
    assert replicas_wanted(Settings(REDIS_URL="redis://h:6379/0")) == 0
    assert replicas_wanted(Settings(REDIS_URL="redis://h:6379/0", redis_wait_replicas=2)) == 2


def test_a_cluster_url_is_taken_and_names_tagged_keys() -> None:
    settings = Settings(REDIS_URL="redis+cluster://h1:7000,h2:7001")
    assert redis_url(settings) == "redis+cluster://h1:7000,h2:7001"
    assert keys_for(settings).cluster and not keys_for(Settings(REDIS_URL="redis://h:6379/0")).cluster
    assert replicas_wanted(settings) == 1  # an enqueue waits for the model's master's replica
    assert describe("redis+cluster://u:secret@h1:7000,h2:7001") == "cluster via h1:7000,h2:7001"


@pytest.mark.parametrize("url", ["redis+cluster://", "redis+cluster://h1:x", "redis+cluster://h1:7000/0"])
def test_a_malformed_cluster_url_is_refused_in_one_line(url: str) -> None:
    with pytest.raises(RedisURLError, match="redis\\+cluster://"):
        redis_url(Settings(REDIS_URL=url))


async def test_a_redis_that_refuses_the_first_command_is_one_clear_error_not_a_wait(redis_url: str) -> None:
    user = f"noping{time.time_ns()}"
    admin = aioredis.Redis.from_url(redis_url)
    await admin.execute_command("ACL", "SETUSER", user, "on", ">pw", "~*", "-@all", "+auth", "+hello",
                                "+client|setname", "+select")
    host, port = redis_url.split("//")[1].split("/")[0].split(":")
    client = aioredis.Redis(host=host, port=int(port), username=user, password="pw")
    try:
        with pytest.raises(RedisRefused, match="refused ovq worker's first commands"):
            await wait_until_up(client, redis_url, 30, "ovq worker")
    finally:
        await client.aclose()
        await admin.execute_command("ACL", "DELUSER", user)
        await admin.aclose()
