"""Reclaim passes on the real redis-server, built from what they read (no worker): what a dead worker left pending
comes back as what to do with it, and dead consumers are forgotten."""
from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from common.jobs import Job
from common.keys import GROUP, Keys
from common.settings import Settings
from workers.queue.reclaim import Reclaimer
from workers.vitals import Member

TTL_S = 0.05  # workers silent this long are dead; entries idle this long are theirs to take over


@pytest.fixture()
async def dead_worker(redis_url: str):
    """A worker "dead" that read three jobs and stopped; "w1" is the one reclaiming."""
    keys = Keys(f"rc{time.time_ns()}")
    redis = aioredis.Redis.from_url(redis_url)
    member = Member("w1", "m", "CPU", keys.jobs("m", "CPU"), keys.batch_jobs("m", "CPU"), started=time.time())
    for stream in member.streams:
        await redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
    jobs = [Job(model="m", device="CPU", kind="completion", prompt="x", reply_to="api-1") for _ in range(3)]
    ids = [await redis.xadd(member.stream, job.to_fields()) for job in jobs]
    await redis.xreadgroup(GROUP, "dead", {member.stream: ">"}, count=3)
    yield redis, keys, member, jobs, ids
    await redis.aclose()


def reclaimer(redis: aioredis.Redis, keys: Keys, member: Member, room: int = 10) -> Reclaimer:
    return Reclaimer(redis, keys, Settings(worker_ttl_s=TTL_S, max_deliveries=3), member, lambda: room)


async def test_a_pass_says_what_to_rerun_fail_and_dead_letter(dead_worker) -> None:
    redis, keys, member, (fresh, streamed, retried), ids = dead_worker
    await redis.hset(keys.job(streamed.id), "streamed", "1")
    await redis.xclaim(member.stream, GROUP, "dead", 0, [ids[2]], retrycount=5)
    await asyncio.sleep(TTL_S * 3)
    reclaim = reclaimer(redis, keys, member)
    [takeover] = await reclaim.reclaim_once()
    assert takeover.stream == member.stream and reclaim.reclaimed == 3
    assert [entry_id for entry_id, _ in takeover.rerun] == [ids[0]]
    assert [Job.from_fields(fields).id for fields in takeover.dead] == [retried.id]
    assert {job: values["status"] for job, values in takeover.outbox.status.items()} == \
        {streamed.id: "error", retried.id: "error"}
    assert sorted(takeover.outbox.acks) == sorted([(member.stream, ids[1]), (member.stream, ids[2])])
    assert [e["job"] for e in takeover.outbox.events["api-1"]] == [streamed.id, retried.id]
    # Claimed: now w1's, so no other worker takes them over too; the dead consumer holds nothing and is forgotten.
    pending = await redis.xpending_range(member.stream, GROUP, "-", "+", count=10)
    assert {p["consumer"] for p in pending} == {b"w1"}
    assert [c["name"] for c in await redis.xinfo_consumers(member.stream, GROUP)] == [b"w1"]


async def test_a_pass_takes_only_what_there_is_room_for_and_leaves_the_living_alone(dead_worker) -> None:
    redis, keys, member, _, ids = dead_worker
    await asyncio.sleep(TTL_S * 3)
    assert await reclaimer(redis, keys, member, room=0).reclaim_once() == []
    [takeover] = await reclaimer(redis, keys, member, room=2).reclaim_once()
    assert [entry_id for entry_id, _ in takeover.rerun] == ids[:2]
    await redis.zadd(keys.workers("m", "CPU"), {"dead": time.time() + 60, "w1": time.time() + 60})  # both beat
    assert await reclaimer(redis, keys, member).reclaim_once() == []


async def test_a_job_that_had_streamed_is_continued_where_the_worker_can(dead_worker) -> None:
    """With its record of generated ids and its prompt tokens: to continue, if this worker can (else an error)."""
    redis, keys, member, (recorded, unrecorded, _), ids = dead_worker
    for job in (recorded, unrecorded):
        await redis.hset(keys.job(job.id), mapping={"streamed": "1", "prompt_tokens": "12"})
    await redis.set(keys.generated(recorded.id), b"ids")
    await asyncio.sleep(TTL_S * 3)
    settings = Settings(worker_ttl_s=TTL_S, max_deliveries=3)
    [takeover] = await Reclaimer(redis, keys, settings, member, lambda: 10, lambda job: True).reclaim_once()
    assert [(c.entry_id, c.generated, c.prompt_tokens) for c in takeover.continued] == [(ids[0], b"ids", 12)]
    assert {job: values["status"] for job, values in takeover.outbox.status.items()} == {unrecorded.id: "error"}
    assert [entry_id for entry_id, _ in takeover.rerun] == [ids[2]]


async def test_a_worker_that_cannot_continue_a_job_ends_it_with_an_error(dead_worker) -> None:
    redis, keys, member, (job, _, _), ids = dead_worker
    await redis.hset(keys.job(job.id), mapping={"streamed": "1", "prompt_tokens": "12"})
    await redis.set(keys.generated(job.id), b"ids")
    await asyncio.sleep(TTL_S * 3)
    [takeover] = await reclaimer(redis, keys, member).reclaim_once()  # this worker continues nothing
    assert takeover.continued == [] and takeover.outbox.status[job.id]["status"] == "error"
    assert takeover.outbox.forgotten == {job.id}


async def test_no_pass_while_stale_heartbeats_may_be_an_outage(dead_worker) -> None:
    redis, keys, member, _, _ = dead_worker
    steady = [False]
    settings = Settings(worker_ttl_s=TTL_S, max_deliveries=3, reclaim_interval_s=0.01)
    reclaim = Reclaimer(redis, keys, settings, member, lambda: 10, steady=lambda: steady[0])
    await asyncio.sleep(TTL_S * 2)
    passes = reclaim.passes()
    first = asyncio.ensure_future(anext(passes))
    await asyncio.sleep(0.1)
    assert not first.done() and reclaim.reclaimed == 0, "the dead worker's jobs wait while Redis was away lately"
    steady[0] = True
    takeover = await asyncio.wait_for(first, 5)
    assert len(takeover.rerun) == 3
    await passes.aclose()


async def test_extra_streams_are_covered_and_one_gone_or_without_its_group_is_passed_over(dead_worker) -> None:
    """Prefix affinity's streams: a dead thief's job pending in another worker's affinity stream comes back."""
    redis, keys, member, jobs, _ = dead_worker
    affine, gone = keys.affinity_jobs("m", "CPU", "w2"), keys.affinity_jobs("m", "CPU", "w3")
    await redis.xgroup_create(affine, GROUP, id="0", mkstream=True)
    entry = await redis.xadd(affine, jobs[0].to_fields())
    await redis.xreadgroup(GROUP, "thief", {affine: ">"})
    await asyncio.sleep(TTL_S * 3)
    reclaim = Reclaimer(redis, keys, Settings(worker_ttl_s=TTL_S, max_deliveries=3), member, lambda: 10,
                        extra=lambda: (gone, affine))
    taken = await reclaim.reclaim_once()
    assert [(t.stream, [e for e, _ in t.rerun]) for t in taken][1:] == [(affine, [entry])]


async def test_parked_jobs_wait_they_are_not_a_dead_workers_and_do_not_hide_one(dead_worker) -> None:
    """Jobs parked for fair shares (common/fairness.py) are pending on the consumer PARK, idle for long: never
    claimed, and however many they are, a dead worker's jobs behind them are still found."""
    from common.fairness import PARK

    redis, keys, member, _, ids = dead_worker
    parked = [await redis.xadd(member.stream, {"job": b"{}"}) for _ in range(150)]
    await redis.xreadgroup(GROUP, PARK, {member.stream: ">"}, count=200)
    await asyncio.sleep(TTL_S * 3)
    [takeover] = await reclaimer(redis, keys, member).reclaim_once()
    assert [entry_id for entry_id, _ in takeover.rerun] == ids
    pending = await redis.xpending_range(member.stream, GROUP, "-", "+", count=500, consumername=PARK)
    assert [p["message_id"] for p in pending] == parked
    assert PARK.encode() in [c["name"] for c in await redis.xinfo_consumers(member.stream, GROUP)]


async def test_live_workers_take_turns_looking_for_dead_consumers(dead_worker) -> None:
    """One live worker per reclaim interval reads the groups' consumer lists, not every worker on every pass: the
    dead consumer (nothing pending) stays through the other's pass and goes in the one whose turn it is."""
    redis, keys, member, _, ids = dead_worker
    await redis.xack(member.stream, GROUP, *ids)  # the dead worker holds nothing: only its consumer is left
    other = Member("w2", "m", "CPU", member.stream, member.batch_stream, started=time.time())
    await redis.zadd(keys.workers("m", "CPU"), {"w1": time.time() + 3600, "w2": time.time() + 3600})
    settings = Settings(worker_ttl_s=TTL_S, reclaim_interval_s=3600)  # one turn for the whole test
    w1, w2 = (Reclaimer(redis, keys, settings, m, lambda: 10) for m in (member, other))
    await asyncio.sleep(TTL_S * 3)
    live, now = {"w1", "w2"}, time.time()
    assert [w1.sweeps(live, now), w2.sweeps(live, now)].count(True) == 1
    assert w1.sweeps(live, now + 3600) != w1.sweeps(live, now)  # the next interval, the other's turn
    idle, looking = (w2, w1) if w1.sweeps(live, now) else (w1, w2)
    await idle.reclaim_once()
    assert b"dead" in {c["name"] for c in await redis.xinfo_consumers(member.stream, GROUP)}
    await looking.reclaim_once()
    assert b"dead" not in {c["name"] for c in await redis.xinfo_consumers(member.stream, GROUP)}
