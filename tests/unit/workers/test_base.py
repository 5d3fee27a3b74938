"""The worker's I/O half with no engine: deadlines act on jobs read too late and on running jobs past theirs."""
from __future__ import annotations

import asyncio
import time
from typing import Any

import redis.asyncio as aioredis

from common.jobs import Job
from common.models.config import ModelConfig
from common.redis.lane import Lane
from common.settings import Settings
from workers.base import BaseWorker
from workers.queue.heartbeat import Steering
from workers.queue.publisher import Outbox


class Collected:
    """Stands where the publisher would: keeps every outbox."""

    def __init__(self) -> None:
        self.outboxes: list[Outbox] = []

    def put(self, outbox: Outbox) -> None:
        self.outboxes.append(outbox)

    def events(self) -> list[dict[str, Any]]:
        return [e for o in self.outboxes for events in o.events.values() for e in events]


class Started(BaseWorker):
    capacity = 4

    def __init__(self, redis_url: str) -> None:
        super().__init__(Settings(redis_url=redis_url, key_prefix=f"base{time.time_ns()}"),
                         ModelConfig(name="m", path="/none"), "CPU")
        self.publisher = Collected()  # type: ignore[assignment]
        self.started_jobs: list[str] = []
        self.cancelled: list[str] = []

    def _start(self, entry_id: bytes, job: Job, outbox: Outbox) -> None:
        self.started_jobs.append(job.id)

    def cancel_running(self, job_id: str) -> None:
        self.cancelled.append(job_id)


def job(**fields: Any) -> Job:
    return Job(**{"model": "m", "device": "CPU", "kind": "completion", "prompt": "x", "reply_to": "api", **fields})


async def test_a_job_read_after_its_deadline_is_dropped_with_a_504_never_started(redis_url: str) -> None:
    worker = Started(redis_url)
    lane = Lane(aioredis.Redis.from_url(redis_url))
    late, timely, unbounded = job(start_by=time.time() - 1), job(start_by=time.time() + 60), job()
    await worker.admit_jobs([(b"1-1", late), (b"1-2", timely), (b"1-3", unbounded)], lane=lane)
    assert worker.started_jobs == [timely.id, unbounded.id]
    [error] = [e for e in worker.publisher.events() if e["job"] == late.id]
    assert error["type"] == "error" and error["status"] == 504 and error["error"]["code"] == "deadline_exceeded"
    acked = [entry for o in worker.publisher.outboxes for _, entry in o.acks]
    assert b"1-1" in acked, "it leaves the stream"
    assert worker.expired == 1
    await lane.close()
    await worker.redis.aclose()


async def test_a_running_job_past_its_deadline_is_cancelled_once(redis_url: str) -> None:
    worker = Started(redis_url)

    class State:
        def __init__(self, job: Job) -> None:
            self.job = job

    overdue, on_time, unbounded = job(deadline=time.time() - 0.1), job(deadline=time.time() + 60), job()
    worker.running = {j.id: State(j) for j in (overdue, on_time, unbounded)}
    worker.cancel_overdue(time.time())
    worker.cancel_overdue(time.time())
    assert worker.cancelled == [overdue.id]
    await worker.redis.aclose()


async def test_prefix_caching_without_a_sized_cache_is_warned_about(redis_url: str, caplog: Any) -> None:
    settings = Settings(redis_url=redis_url, key_prefix=f"base{time.time_ns()}")
    warned = []
    for cache_size in (0, 1):
        caplog.clear()
        worker = Started.__new__(Started)
        BaseWorker.__init__(worker, settings, ModelConfig(name="m", path="/none", enable_prefix_caching=True,
                                                          cache_size=cache_size), "CPU")
        warned.append(any("cache_size 0" in r.getMessage() for r in caplog.records))
        await worker.redis.aclose()
    assert warned == [True, False]


class _Lost:
    """A pub/sub whose connection uvloop closed under it: what redis-py's health check raised after a partition."""

    async def listen(self) -> Any:
        raise RuntimeError("unable to perform operation on <TCPTransport closed=True reading=False 0x1>; "
                           "the handler is closed")
        yield  # an async generator, as PubSub.listen is

    async def aclose(self) -> None:
        raise RuntimeError("unable to perform operation on <TCPTransport closed=True>; the handler is closed")


class _Heard:
    """A pub/sub that hears one cancel, then nothing."""

    async def listen(self) -> Any:
        yield {"type": "message", "data": b"job-1"}
        await asyncio.Event().wait()

    async def aclose(self) -> None:
        pass


async def test_the_cancel_loop_survives_a_connection_uvloop_closed(redis_url: str) -> None:
    """After a partition the pub/sub's transport is closed under it (a RuntimeError, not a ConnectionError): the
    loop subscribes again and hears the next cancel; before, the loop died of it and the worker stopped."""
    worker = Started(redis_url)
    subscriptions = iter([_Lost(), _Heard()])

    async def cancels() -> Any:
        return next(subscriptions)

    worker._cancels = cancels  # type: ignore[method-assign]
    heard: list[str] = []
    worker.cancel = heard.append  # type: ignore[method-assign]
    loop = asyncio.create_task(worker._cancel_loop())
    for _ in range(100):
        if heard or loop.done():
            break
        await asyncio.sleep(0.05)
    assert not loop.done(), loop.exception()
    assert heard == ["job-1"]
    loop.cancel()
    await worker.redis.aclose()


class Counting(Lane):
    """A lane that records each round trip's command names."""

    def __init__(self, redis: aioredis.Redis) -> None:
        super().__init__(redis)
        self.sent: list[list[str]] = []

    async def execute(self, commands: Any, *args: Any, **kwargs: Any) -> Any:
        self.sent.append([c[0] for c in commands])
        return await super().execute(commands, *args, **kwargs)


async def test_an_api_heartbeat_read_within_a_heartbeat_is_not_asked_for_again(redis_url: str) -> None:
    """One command less per job: a job's intake asks for its API's heartbeat only once a heartbeat (per API)."""
    worker = Started(redis_url)
    client = aioredis.Redis.from_url(redis_url)
    lane = Counting(client)
    await client.zadd(worker.keys.apis, {"api": time.time()})
    for _ in range(3):
        await worker.admit_jobs([(b"1-1", job())], lane=lane)
    assert [names.count("ZMSCORE") for names in lane.sent] == [1, 0, 0]
    worker._api_scores = {c: (score, at - worker.settings.heartbeat_s) for c, (score, at) in worker._api_scores.items()}
    await worker.admit_jobs([(b"1-2", job()), (b"1-3", job(reply_to="other"))], lane=lane)
    assert lane.sent[-1].count("ZMSCORE") == 1, "a heartbeat later: read again (the new API's with it)"
    worker._api_scores = {c: (score, at - worker.settings.heartbeat_s) for c, (score, at) in worker._api_scores.items()}
    worker.steer(Steering(api_scores={"api": time.time(), "other": None}))  # the worker's own beat read them
    await worker.admit_jobs([(b"1-4", job()), (b"1-5", job(reply_to="other"))], lane=lane)
    assert lane.sent[-1].count("ZMSCORE") == 0
    await lane.close()
    await worker.redis.aclose()
