"""A connection of one's own, on the real redis-server: shared round trips, errors in place, stale connections,
blocking reads given up, scripts Redis forgot."""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from common.keys import GROUP
from common.redis.lane import RETRIED, Lane, Script


@pytest.fixture()
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    redis = aioredis.Redis.from_url(redis_url)
    yield redis
    await redis.aclose()


def counting(lane: Lane) -> list[int]:
    """The size of each write the lane makes, in commands."""
    sizes: list[int] = []
    write = lane._write

    def counted(replies: object, pending: list) -> None:
        sizes.append(sum(call.count for _, call in pending))
        write(replies, pending)  # type: ignore[arg-type]

    lane._write = counted  # type: ignore[method-assign]
    return sizes


async def test_calls_of_one_loop_turn_share_a_round_trip_and_so_do_calls_made_during_one(
        client: aioredis.Redis) -> None:
    lane = Lane(client)
    key, stream = f"lane{time.time_ns()}", f"lane-stream{time.time_ns()}"
    sizes = counting(lane)
    replies = await asyncio.gather(*[lane.execute([["INCRBY", key, i], ["GET", key]]) for i in range(1, 21)])
    assert [r[0] for r in replies] == [sum(range(1, i + 1)) for i in range(1, 21)]  # in the order handed over
    assert all(int(get) == incr for incr, get in replies)
    assert sizes == [40]
    await client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    slow = asyncio.ensure_future(lane.execute(
        [["XREADGROUP", "GROUP", GROUP, "w1", "COUNT", 1, "BLOCK", 300, "STREAMS", stream, ">"]], blocks_s=0.3))
    await asyncio.sleep(0.1)  # that round trip is in flight
    later = [asyncio.ensure_future(lane.execute([["INCR", key]])) for _ in range(5)]
    assert await slow == [None]
    assert sorted(r for [r] in await asyncio.gather(*later)) == [211, 212, 213, 214, 215]
    assert sizes == [40, 1, 5]
    await lane.close()


async def test_a_refused_command_answers_its_error_in_its_place(client: aioredis.Redis) -> None:
    lane = Lane(client)
    key = f"lane{time.time_ns()}"
    ok, refused, after = await lane.execute([["SET", key, "text"], ["INCR", key], ["GET", key]])
    assert ok is True or ok == b"OK"
    assert isinstance(refused, ResponseError) and "not an integer" in str(refused)
    assert after == b"text"
    assert await lane.execute([["GET", key]]) == [b"text"]  # and the connection is still in step
    await lane.close()


BUSY = """local start = redis.call('TIME')
repeat local now = redis.call('TIME') until (now[1] - start[1]) * 1000000 + now[2] - start[2] > 150000
return 'busy'"""


async def test_a_caller_that_gives_up_leaves_the_replies_of_the_others_in_step(client: aioredis.Redis) -> None:
    lane = Lane(client)
    key = f"lane{time.time_ns()}"
    await lane.execute([["SET", key, "mine"]])
    with pytest.raises(asyncio.TimeoutError):  # its reply comes after its caller left
        await asyncio.wait_for(lane.execute([["EVAL", BUSY, 0]]), 0.05)
    assert await lane.execute([["GET", key], ["INCR", f"{key}n"]]) == [b"mine", 1]
    await lane.close()


async def test_a_value_redis_cannot_take_fails_only_its_own_caller(client: aioredis.Redis) -> None:
    lane = Lane(client)
    key = f"lane{time.time_ns()}"
    sizes = counting(lane)
    good = asyncio.ensure_future(lane.execute([["SET", key, "é"], ["GET", key]]))
    with pytest.raises(redis.DataError):
        await lane.execute([["SET", key, None]])
    assert await good == [b"OK", "é".encode()]
    assert sizes == [2]  # the bad command never reached the connection
    await lane.close()


async def test_a_connection_dropped_under_it_is_replaced_without_an_error(client: aioredis.Redis) -> None:
    """A Redis restart leaves a stale connection behind: one retry on a fresh one, as the pooled clients do."""
    lane = Lane(client)
    await lane.execute([["CLIENT", "SETNAME", "the-lane"]])
    killed = await client.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    assert killed >= 1
    assert await lane.execute([["ECHO", "again"]]) == [b"again"]
    await lane.close()


async def test_a_caller_that_asks_for_no_retry_gets_the_lost_connection(client: aioredis.Redis) -> None:
    """`retry=False` (the worker's publisher, which checks its fence first): a call whose connection is lost under
    it fails, and is not sent again on a fresh one; the next call connects afresh."""
    lane = Lane(client)
    key = f"lane-no-retry-{time.time_ns()}"
    blocked = asyncio.ensure_future(lane.execute([["BLPOP", key, 5]], blocks_s=5, retry=False))
    await asyncio.sleep(0.2)
    assert await client.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes") >= 1
    with pytest.raises(RETRIED):
        await blocked
    await client.rpush(key, b"x")
    await asyncio.sleep(0.1)
    assert await client.llen(key) == 1  # no BLPOP sent again took it
    assert await lane.execute([["LPOP", key]], retry=False) == [b"x"]
    await lane.close()


async def test_a_blocking_read_given_up_takes_no_entry(client: aioredis.Redis) -> None:
    """The worker stops reading (SIGTERM): a job queued afterwards must stay for the other workers."""
    stream = f"lane{time.time_ns()}"
    await client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    lane = Lane(client)
    read = ["XREADGROUP", "GROUP", GROUP, "w1", "COUNT", 1, "BLOCK", 3000, "STREAMS", stream, ">"]
    reading = asyncio.ensure_future(lane.execute([read], blocks_s=3))
    await asyncio.sleep(0.2)
    reading.cancel()
    await asyncio.sleep(0.2)
    await client.xadd(stream, {"job": "x"})
    await asyncio.sleep(0.2)
    assert (await client.xpending(stream, GROUP))["pending"] == 0
    assert await client.xreadgroup(GROUP, "w2", {stream: ">"}, count=1)
    assert await lane.execute([["ECHO", "still usable"]]) == [b"still usable"]
    await lane.close()


async def test_a_blocking_read_may_outlast_the_socket_timeout(client: aioredis.Redis, redis_url: str) -> None:
    quick = aioredis.Redis.from_url(redis_url, socket_timeout=0.3)
    stream = f"lane{time.time_ns()}"
    await client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    lane = Lane(quick)
    read = ["XREADGROUP", "GROUP", GROUP, "w1", "COUNT", 1, "BLOCK", 600, "STREAMS", stream, ">"]
    assert await lane.execute([read], blocks_s=0.6) == [None]
    blocked = asyncio.ensure_future(lane.execute([read], blocks_s=0.6))
    await asyncio.sleep(0.05)
    behind = lane.execute([["PING"]])  # written at once, answered after the read
    assert await asyncio.gather(blocked, behind) == [[None], [b"PONG"]]
    await lane.close()
    await quick.aclose()


async def test_a_script_redis_forgot_is_sent_again(client: aioredis.Redis) -> None:
    lane = Lane(client)
    script = Script("return tonumber(ARGV[1]) + 1")
    await client.script_flush()
    assert await script(lane, [], [41]) == 42
    assert await client.script_exists(script.sha) == [True]
    with pytest.raises(ResponseError):
        await Script("return redis.call('NOSUCHCOMMAND')")(lane, [], [])
    await lane.close()


async def test_a_redis_that_never_answers_fails_within_the_bound() -> None:
    """Connecting included: a server that accepts and stays silent costs the socket timeout per try, twice."""
    silent = await asyncio.start_server(lambda reader, writer: None, "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    client = aioredis.Redis(port=port, socket_timeout=0.3, socket_connect_timeout=0.3)
    lane = Lane(client)
    started = time.monotonic()
    with pytest.raises(redis.TimeoutError):
        await lane.execute([["PING"]])
    assert time.monotonic() - started < 3
    await lane.close()
    await client.aclose()
    silent.close()


async def test_commands_before_a_script_run_ahead_of_it_in_its_round_trip(client: aioredis.Redis) -> None:
    lane = Lane(client)
    key = f"lane{time.time_ns()}"
    sizes = counting(lane)
    script = Script("return redis.call('GET', KEYS[1])")
    assert await script(lane, [key], [], before=[["SET", key, "first"]]) == b"first"
    assert sizes[0] == 2  # one write: the SET, then the script that already sees it
    with pytest.raises(ResponseError):
        await script(lane, [key], [], before=[["INCR", key]])  # refused: raised, after the script ran
    await lane.close()
