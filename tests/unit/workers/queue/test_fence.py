"""The fence on the real redis-server: after Redis was out of reach, the jobs another worker claimed meanwhile are
found in one round trip and nothing of them is published; the worker's own entries are kept (their idle time
starts again, so no reclaim pass takes them for a worker TTL)."""
from __future__ import annotations

import asyncio
import time

import orjson
import redis.asyncio as aioredis

from common.events import Delta
from common.keys import GROUP, Keys
from common.redis.lane import Lane
from workers.queue.fence import Fence
from workers.queue.publisher import Outbox, Publisher


async def two_jobs(redis: aioredis.Redis, keys: Keys) -> tuple[str, list[bytes]]:
    """Two stream entries read by worker "a"; the second then claimed by worker "b" (a reclaim pass)."""
    stream = keys.jobs("m", "CPU")
    await redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
    ids = [await redis.xadd(stream, {"job": b"{}"}) for _ in range(2)]
    await redis.xreadgroup(GROUP, "a", {stream: ">"})
    await asyncio.sleep(0.02)
    await redis.xclaim(stream, GROUP, "b", 10, [ids[1]])
    return stream, ids


async def test_the_check_finds_the_entries_another_worker_claimed_and_keeps_its_own(redis_url: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    keys = Keys(f"fe{time.time_ns()}")
    stream, (mine, taken) = await two_jobs(redis, keys)
    fence = Fence("a")
    fence.hold(mine, stream, "j1")
    fence.hold(taken, stream, "j2")
    fence.due = True
    await asyncio.sleep(0.2)
    [before] = await redis.xpending_range(stream, GROUP, "-", "+", 10, consumername="a")
    lane = Lane(redis)
    assert fence.lost(await lane.execute(fence.commands())) == {taken: "j2"}
    assert not fence.due and fence.held == {mine: (stream, "j1")}
    [pending] = await redis.xpending_range(stream, GROUP, "-", "+", 10, consumername="a")
    assert pending["message_id"] == mine and pending["times_delivered"] == 1
    assert pending["time_since_delivered"] < before["time_since_delivered"]  # idle again from the check
    await lane.close()
    await redis.aclose()


async def test_after_a_failure_nothing_of_a_job_taken_over_is_sent(redis_url: str) -> None:
    """A batch held through an outage: the taken-over job's events, hash fields, record and ack are dropped, and
    the worker is told to stop it; another job's go out as they were."""
    redis = aioredis.Redis.from_url(redis_url)
    keys = Keys(f"fe{time.time_ns()}")
    stream, (mine, taken) = await two_jobs(redis, keys)
    pubsub = redis.pubsub()
    await pubsub.subscribe(keys.events("api1"))
    await pubsub.get_message(timeout=1)
    publisher = Publisher(redis, keys, stream, job_ttl=60)
    fence, stopped = Fence("a"), []
    fence.hold(mine, stream, "j1")
    fence.hold(taken, stream, "j2")
    publisher.guard(fence, stopped.append)
    fence.due = True  # as after a failed round trip or heartbeat
    publisher.start()
    outbox = Outbox()
    for job, entry in (("j1", mine), ("j2", taken)):
        outbox.publish("api1", Delta(job=job, seq=3, text=job, tokens=1))
        outbox.set_status(job, status="done")
        outbox.record(job, [b"ids"], first=True)
        outbox.ack(entry)
    outbox.forget("j2")
    publisher.put(outbox)
    later = Outbox()  # queued behind: the job's events are dropped from it too
    later.publish("api1", Delta(job="j2", seq=4, text="late", tokens=1))
    publisher.put(later)
    await publisher.drain()
    await publisher.stop()
    message = await pubsub.get_message(timeout=1)
    assert [e["job"] for e in orjson.loads(message["data"])["events"]] == ["j1"]
    assert await pubsub.get_message(timeout=0.2) is None
    assert stopped == [{"j2"}]
    assert await redis.hget(keys.job("j1"), "status") == b"done" and not await redis.exists(keys.job("j2"))
    assert await redis.get(keys.generated("j1")) == b"ids" and not await redis.exists(keys.generated("j2"))
    [pending] = await redis.xpending_range(stream, GROUP, "-", "+", 10)  # the other worker's, still pending
    assert pending["message_id"] == taken and pending["consumer"] == b"b"
    await pubsub.aclose()
    await redis.aclose()


async def test_without_an_outage_there_is_no_check(redis_url: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    keys = Keys(f"fe{time.time_ns()}")
    publisher = Publisher(redis, keys, keys.jobs("m", "CPU"), job_ttl=60)
    fence = Fence("a")
    fence.hold(b"1-0", keys.jobs("m", "CPU"), "j1")
    publisher.guard(fence, lambda jobs: None)
    sent = []
    publisher.lane.execute = lambda commands, run=publisher.lane.execute, **kw: sent.append(commands) or run(commands,
                                                                                                             **kw)
    publisher.start()
    outbox = Outbox()
    outbox.publish("api1", Delta(job="j1", seq=1, text="x", tokens=1))
    publisher.put(outbox)
    await publisher.drain()
    await publisher.stop()
    assert [[c[0] for c in commands] for commands in sent] == [["PUBLISH"]]
    await redis.aclose()
