from __future__ import annotations

import time

import orjson
import redis.asyncio as aioredis

from common.events import Cancelled, Delta, EventBatch, batch_adapter
from common.keys import GROUP, Keys
from workers.queue.publisher import Outbox, Publisher

KEYS = Keys("t")


def recording(redis: aioredis.Redis) -> tuple[Publisher, Keys, list[list]]:
    """A started publisher on keys of its own, and the list its round trips' commands are recorded in as sent."""
    keys = Keys(f"t{time.time_ns()}")
    publisher = Publisher(redis, keys, keys.jobs("m", "CPU"), job_ttl=60)
    publisher.start()
    sent: list[list] = []
    run = publisher.lane.execute
    publisher.lane.execute = lambda commands, **kw: sent.append(commands) or run(commands, **kw)  # type: ignore[method-assign]
    return publisher, keys, sent


def test_outboxes_merge_in_order() -> None:
    a, b = Outbox(), Outbox()
    a.publish("api1", Delta(job="j", seq=1, text="a", tokens=1))
    b.publish("api1", Delta(job="j", seq=2, text="b", tokens=1))
    b.publish("api2", Cancelled(job="k", seq=1))
    a.set_status("j", status="running")
    b.set_status("j", status="done")
    a.merge(b)
    assert [e["seq"] for e in a.events["api1"]] == [1, 2]
    assert a.status == {"j": {"status": "done"}}


async def test_one_round_trip_publishes_per_reply_channel_and_acks(redis_url: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)  # a real server: the publisher's lane reads its socket itself
    stream = KEYS.jobs(f"m{time.time_ns()}", "CPU")
    await redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
    entry = await redis.xadd(stream, {"job": b"{}"})
    await redis.xreadgroup(GROUP, "w", {stream: ">"})
    pubsub = redis.pubsub()
    await pubsub.subscribe(KEYS.events("api1"))
    await pubsub.get_message(timeout=1)
    publisher = Publisher(redis, KEYS, stream, job_ttl=60)
    publisher.start()
    outbox = Outbox()
    outbox.publish("api1", Delta(job="j", seq=1, text="hi", tokens=1))
    outbox.set_status("j", status="done", result={"x": 1})
    outbox.ack(entry)
    publisher.put(outbox)
    await publisher.drain()
    await publisher.stop()
    message = await pubsub.get_message(timeout=1)
    batch = batch_adapter.validate_json(message["data"])
    assert isinstance(batch, EventBatch) and batch.events[0].text == "hi"
    assert await redis.xlen(stream) == 0
    assert orjson.loads(await redis.hget(KEYS.job("j"), "result")) == {"x": 1}
    assert 0 < await redis.ttl(KEYS.job("j")) <= 60
    await redis.aclose()


async def test_a_jobs_hash_ttl_is_set_by_its_first_and_last_write_and_each_half_ttl_between(redis_url: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    publisher, keys, sent = recording(redis)

    async def write(**values: object) -> list[str]:
        outbox = Outbox()
        outbox.set_status("j", **values)
        publisher.put(outbox)
        await publisher.drain()
        return [c[0] for c in sent.pop()]

    assert await write(entry="1-0", taken=1.0) == ["HSET", "EXPIRE"]  # its first write here
    assert await write(status="running") == ["HSET"]
    assert await write(streamed=1) == ["HSET"]
    publisher._renewed["j"] -= 31  # half the TTL later: a long job keeps its hash
    assert await write(streamed=2) == ["HSET", "EXPIRE"]
    assert await write(streamed=3) == ["HSET"]
    assert await write(status="done", result="{}") == ["HSET", "EXPIRE"]  # the result is kept a TTL from its end
    assert 0 < await redis.ttl(keys.job("j")) <= 60 and "j" not in publisher._renewed
    await publisher.stop()
    await redis.aclose()


async def test_fields_held_for_later_go_with_the_jobs_next_write_of_its_hash(redis_url: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    publisher, keys, sent = recording(redis)
    taken, other = Outbox(), Outbox()
    taken.later("j", entry="1-0", taken=1.5)
    other.later("k", entry="2-0", taken=2.5)
    taken.merge(other)
    publisher.put(taken)
    await publisher.drain()
    assert sent == [] and await redis.exists(keys.job("j")) == 0  # nothing of their own
    running = Outbox()
    running.set_status("j", status="running")
    publisher.put(running)
    await publisher.drain()
    assert [c[0] for c in sent.pop()] == ["HSET", "EXPIRE"]  # one write, and the TTL with it
    written = await redis.hgetall(keys.job("j"))
    assert (written[b"entry"], written[b"taken"], written[b"status"]) == (b"1-0", b"1.5", b"running")
    assert await redis.exists(keys.job("k")) == 0 and list(publisher._held) == ["k"]  # k waits for its own
    publisher._fenced_off = lambda jobs: None
    publisher._stale = {"k": time.monotonic() + 60}
    late = Outbox()
    late.set_status("k", status="done")
    publisher._strip(late)
    assert publisher._held == {} and not late  # a job taken over meanwhile: its held fields go too
    await publisher.stop()
    await redis.aclose()


async def test_records_of_generated_ids_are_appended_before_their_events_and_go_with_their_job(
        redis_url: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    publisher, keys, sent = recording(redis)
    first, second = Outbox(), Outbox()
    first.record("j", [b"ab"], first=True)
    first.publish("api1", Delta(job="j", seq=1, text="hi", tokens=1))
    second.record("j", [b"cd"])
    first.merge(second)
    assert first.records == {"j": [b"ab", b"cd"]} and first.fresh == {"j"}
    publisher.put(first)
    await publisher.drain()
    assert [c[0] for c in sent[0]] == ["APPEND", "EXPIRE", "PUBLISH"]  # the ids before the text they match
    assert await redis.get(keys.generated("j")) == b"abcd" and 0 < await redis.ttl(keys.generated("j")) <= 60
    ended = Outbox()
    ended.record("j", [b"ef"])
    ended.forget("j")
    publisher.put(ended)
    await publisher.drain()
    await publisher.stop()
    assert await redis.exists(keys.generated("j")) == 0
async def test_a_journaled_jobs_events_go_to_its_journal_in_the_same_round_trip(redis_url: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    keys = Keys(f"j{time.time_ns()}")
    publisher = Publisher(redis, keys, keys.jobs("m", "CPU"), job_ttl=60, journal_ttl=120, journal_max=1000)
    publisher.start()
    first, second = Outbox(), Outbox()
    first.journal("r")
    first.publish("api1", Delta(job="r", seq=1, text="a", tokens=1))
    first.publish("api1", Delta(job="plain", seq=1, text="b", tokens=1))
    second.publish("api1", Delta(job="r", seq=2, text="c", tokens=1))
    second.publish("api1", Cancelled(job="r", seq=3))
    publisher.put(first)
    await publisher.drain()
    publisher.put(second)
    await publisher.drain()
    await publisher.stop()
    entries = await redis.xrange(keys.journal("r"))
    assert [[e["seq"] for e in orjson.loads(fields[b"e"])["events"]] for _, fields in entries] == [[1], [2, 3]]
    assert not await redis.exists(keys.journal("plain"))
    assert 0 < await redis.ttl(keys.journal("r")) <= 120
    assert publisher._journaled == {}  # its terminal event went out: nothing more is journaled for it
    await redis.aclose()
