"""The API's reply-channel subscription on its own protocol: messages from the data callback, a refused SUBSCRIBE,
a Redis that never answers, and one that goes silent after subscribing."""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio as aioredis

from api.queue.subscription import subscribe
from common.redis.client import NO_CLIENT_INFO


@pytest.fixture()
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    redis = aioredis.Redis.from_url(redis_url)
    yield redis
    await redis.aclose()


async def test_messages_reach_the_callback_and_one_that_fails_does_not_end_it(client: aioredis.Redis) -> None:
    got: list[bytes] = []

    def on_message(data: bytes) -> None:
        if data == b"bad":
            raise ValueError("a bug in dispatch")
        got.append(data)

    channel = f"sub{time.time_ns()}"
    subscription = await subscribe(client, channel, on_message, timeout_s=5)
    subscription.check(ping_s=0, timeout_s=5)  # a real Redis answers PING while subscribed
    for data in (b"one", b"bad", b"x" * 100_000, b"three"):
        assert await client.publish(channel, data) == 1
    for _ in range(100):
        if len(got) == 3:
            break
        await asyncio.sleep(0.01)
    assert got == [b"one", b"x" * 100_000, b"three"]
    subscription.check(ping_s=0, timeout_s=0)  # the PONG came: nothing unanswered
    assert not subscription.closed.done()
    await client.client_kill_filter(_type="pubsub")
    assert isinstance(await asyncio.wait_for(subscription.closed, 5), redis.ConnectionError)


async def test_a_subscribe_the_acl_refuses_is_a_response_error(client: aioredis.Redis, redis_url: str) -> None:
    user = f"nochannels{time.time_ns()}"
    await client.acl_setuser(user, enabled=True, passwords=["+secret"], keys=["*"], commands=["+@all"],
                             channels=[], reset_channels=True)
    try:
        limited = aioredis.Redis.from_url(redis_url, username=user, password="secret")
        with pytest.raises(redis.ResponseError, match="NOPERM"):
            await subscribe(limited, "ovq:events:x", lambda data: None, timeout_s=5)
        await limited.aclose()
    finally:
        await client.acl_deluser(user)


async def test_a_subscribe_never_answered_fails_within_the_bound() -> None:
    silent = await asyncio.start_server(lambda reader, writer: None, "127.0.0.1", 0)
    client = aioredis.Redis(port=silent.sockets[0].getsockname()[1])
    with pytest.raises(redis.TimeoutError):
        await subscribe(client, "ovq:events:x", lambda data: None, timeout_s=0.3)
    await client.aclose()
    silent.close()


async def test_a_redis_gone_silent_after_subscribing_is_dropped_after_an_unanswered_ping() -> None:
    heard: list[bytes] = []

    async def answers_subscribe_only(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heard.append(await reader.read(1000))
        writer.write(b"*3\r\n$9\r\nsubscribe\r\n$12\r\novq:events:x\r\n:1\r\n")
        while data := await reader.read(1000):  # then nothing more, PING included
            heard.append(data)

    server = await asyncio.start_server(answers_subscribe_only, "127.0.0.1", 0)
    client = aioredis.Redis(port=server.sockets[0].getsockname()[1], **NO_CLIENT_INFO)  # SUBSCRIBE comes first
    subscription = await subscribe(client, "ovq:events:x", lambda data: None, timeout_s=5)
    subscription.check(ping_s=0, timeout_s=0.2)
    await asyncio.sleep(0.1)
    assert heard[-1] == b"*1\r\n$4\r\nPING\r\n"
    subscription.check(ping_s=0, timeout_s=0.2)
    assert not subscription.closed.done()  # 0.1 s without an answer: not yet
    await asyncio.sleep(0.2)
    subscription.check(ping_s=0, timeout_s=0.2)
    assert isinstance(subscription.closed.result(), redis.TimeoutError)
    await client.aclose()
    server.close()
