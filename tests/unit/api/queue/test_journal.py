"""A resumable job's journal read back: every event in order up to the terminal one; a gap or a journal that
stays quiet ends the read with an error instead of a wrong answer."""
from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis

from api.http.sse import Last
from api.queue.journal import Journal, JournalBroken, paced
from common.events import delta, pack
from common.keys import Keys


@pytest.fixture()
async def journal(redis_url: str):
    redis = aioredis.Redis.from_url(redis_url)
    keys = Keys(f"jr{time.time_ns()}")
    yield redis, keys, Journal(redis, keys)
    await redis.aclose()


async def test_follow_replays_then_ends_at_the_terminal_event(journal) -> None:
    redis, keys, reader = journal
    key = keys.journal("j")
    await redis.xadd(key, {"e": pack([{"type": "accepted", "job": "j", "seq": 1}, delta("j", 2, 0, "a", 1)])})
    await redis.xadd(key, {"e": pack([delta("j", 3, 0, "b", 1), {"type": "cancelled", "job": "j", "seq": 4}])})
    await redis.xadd(key, {"e": pack([delta("j", 5, 0, "never", 1)])})
    seen = [event["seq"] async for events in reader.follow("j", stall_s=30) for event in events]
    assert seen == [1, 2, 3, 4]
    events, last = await reader.read("j")
    assert len(events) == 5 and last is not None


async def test_a_gap_in_the_journal_is_an_error(journal) -> None:
    redis, keys, reader = journal
    await redis.xadd(keys.journal("j"), {"e": pack([{"type": "accepted", "job": "j", "seq": 1}])})
    await redis.xadd(keys.journal("j"), {"e": pack([delta("j", 3, 0, "b", 1)])})
    with pytest.raises(JournalBroken, match="lost events"):
        async for _ in reader.follow("j", stall_s=30):
            pass


async def test_an_entry_written_twice_is_read_once(journal) -> None:
    """A worker's round trip applied by Redis, its reply lost with the connection, and sent again."""
    redis, keys, reader = journal
    key = keys.journal("j")
    twice = pack([delta("j", 2, 0, "a", 1), delta("j", 3, 0, "b", 1)])
    await redis.xadd(key, {"e": pack([{"type": "accepted", "job": "j", "seq": 1}])})
    await redis.xadd(key, {"e": twice})
    await redis.xadd(key, {"e": twice})
    await redis.xadd(key, {"e": pack([{"type": "cancelled", "job": "j", "seq": 4}])})
    seen = [event["seq"] async for events in reader.follow("j", stall_s=30) for event in events]
    assert seen == [1, 2, 3, 4]
    assert [event["seq"] for event in (await reader.read("j"))[0]] == [1, 2, 3, 4]


async def test_a_journal_that_gains_nothing_is_given_up_on(journal) -> None:
    _, _, reader = journal
    with pytest.raises(JournalBroken, match="No progress"):
        async for _ in reader.follow("nothing", stall_s=0.5):
            pass


async def test_paced_renders_each_batch_and_ends_with_the_last_frames(journal) -> None:
    redis, keys, reader = journal
    key = keys.journal("j")
    await redis.xadd(key, {"e": pack([{"type": "accepted", "job": "j", "seq": 1}, delta("j", 2, 0, "a", 1)])})
    await redis.xadd(key, {"e": pack([delta("j", 3, 0, "b", 1), {"type": "cancelled", "job": "j", "seq": 4}])})
    seen: list[str] = []

    def render(events: list) -> bytes:
        seen.extend(event["type"] for event in events)
        return b"".join(b"%d," % event["seq"] for event in events)

    async def here() -> bool:
        return False

    out = [frame async for frame in paced(reader, "j", 30, render, lambda: "cancelled" in seen, here)]
    assert out == [b"1,2,", b"3,4,"] and type(out[-1]) is Last and type(out[0]) is not Last


async def test_paced_stops_when_the_client_is_gone(journal) -> None:
    redis, keys, reader = journal
    await redis.xadd(keys.journal("j"), {"e": pack([{"type": "accepted", "job": "j", "seq": 1}])})
    await redis.xadd(keys.journal("j"), {"e": pack([delta("j", 2, 0, "a", 1)])})

    async def gone() -> bool:
        return True

    out = [frame async for frame in paced(reader, "j", 30, lambda events: b"x", lambda: False, gone)]
    assert out == [b"x"]  # the first batch went out; then the client was gone
