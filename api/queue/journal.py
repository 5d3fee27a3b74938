"""A resumable job's events as any API process reads them back: its journal (`Keys.journal`), a Redis stream the
worker's publisher appends one entry to per round trip (the same events it publishes).

`follow` replays the journal from the start and then waits for more (XREAD, blocking at most a second at a time)
until the job's terminal event: a stream resumed on another API process, or a background response folded into its
`Response`, sees exactly the events the worker sent, in order (`paced`: the same read as a client's SSE frames, with
keep-alives, for both). Each event's `seq` runs 1, 2, 3, ... per job (an event read twice counts once): a gap
(entries trimmed past the cap, or lost with a Redis that restarted without them) ends the read with an error
rather than a wrong answer, and so does a journal that gains nothing for `stall_s`.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import redis.asyncio as aioredis

from api.http.sse import PING, Last
from common.errors import OvqError
from common.events import TERMINAL, EventDict, read_batch
from common.keys import Keys
from common.redis.client import UNAVAILABLE, Backoff

BLOCK_MS = 1000
PING_S = 15.0  # a paced reader's client gets a keep-alive after this long without a frame


class JournalBroken(OvqError):
    """The journal cannot tell the rest of the job: events missing, or nothing new for too long."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message, 500, "server_error", code=code)


class Journal:
    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self.redis, self.keys = redis, keys

    async def exists(self, job_id: str, model: str = "") -> bool:
        """(`model`, here and below: the job's, which names its keys on a Cluster.)"""
        return bool(await self.redis.exists(self.keys.journal(job_id, model)))

    async def read(self, job_id: str, model: str = "") -> tuple[list[EventDict], float | None]:
        """Everything journaled so far (checked for gaps), and when the last entry was written (unix s)."""
        entries = await self.redis.xrange(self.keys.journal(job_id, model))
        events = _checked(entries, 0)
        last = int(entries[-1][0].split(b"-")[0]) / 1000 if entries else None
        return events, last

    async def follow(self, job_id: str, stall_s: float, lease: tuple[str, str, float] | None = None,
                     block: bool = True, model: str = "") -> AsyncIterator[list[EventDict]]:
        """The job's events from its first, a batch per entry (an empty one after a quiet second), until its
        terminal event. `block`: wait for new entries in Redis (a pooled connection held up to a second at a
        time: for a client's stream), else poll once a second (for a background keeper, which nobody waits on).
        `lease`: (key, value,
        ttl_s) of a reader lease renewed every third of its TTL while this reads (`Keys.reader`)."""
        key, cursor, seq = self.keys.journal(job_id, model), b"0-0", 0
        heard = renewed = time.monotonic()
        backoff = Backoff()
        if lease is not None:
            await self.redis.set(lease[0], lease[1], ex=max(1, round(lease[2])))
        while True:
            now = time.monotonic()
            if lease is not None and now - renewed >= lease[2] / 3:
                renewed = now
                try:
                    await self.redis.set(lease[0], lease[1], ex=max(1, round(lease[2])))
                except UNAVAILABLE:
                    pass
            if now - heard > stall_s:
                raise JournalBroken(f"No progress for {stall_s:.0f}s (background_stall_s): the job was not "
                                    "taken by any worker, or its events were lost", "stalled")
            try:
                reply = await self.redis.xread({key: cursor}, count=1000, block=BLOCK_MS if block else None)
            except UNAVAILABLE:
                await backoff.wait()
                continue
            backoff.reset()
            if not reply:
                if not block:
                    await asyncio.sleep(BLOCK_MS / 1000)
                yield []  # a quiet second: the reader may ping its client
                continue
            entries = reply[0][1]
            cursor = entries[-1][0]
            heard = time.monotonic()
            for entry_id, fields in entries:
                events = _checked([(entry_id, fields)], seq)
                if events:
                    seq = events[-1]["seq"]
                yield events
                if any(event["type"] in TERMINAL for event in events):
                    return


async def paced(journal: Journal, job_id: str, stall_s: float, render: Callable[[list[EventDict]], bytes],
                ended: Callable[[], bool], gone: Callable[[], Awaitable[bool]],
                lease: tuple[str, str, float] | None = None, model: str = "") -> AsyncIterator[bytes]:
    """A client's stream of the job from its journal (`Journal.follow`): each batch of events as `render` makes
    them into SSE frames, a PING after `PING_S` without any, until `ended()` says the job's stream is over (its
    last frames come as `Last`) or the client is `gone()`. `JournalBroken` goes to the caller."""
    last = time.monotonic()
    async for events in journal.follow(job_id, stall_s, lease, model=model):
        out = render(events)
        if ended():
            yield Last(out)
            return
        now = time.monotonic()
        if out:
            last = now
            yield out
        elif now - last >= PING_S:
            last = now
            yield PING
        if await gone():
            return


def _checked(entries: list[tuple[bytes, dict[bytes, bytes]]], seq: int) -> list[EventDict]:
    """The entries' events, each the one after `seq`: one numbered as an event already read is skipped (a worker's
    round trip that reached Redis twice: its connection was lost after Redis had applied it, so it was sent again),
    a gap raises."""
    out: list[EventDict] = []
    for _, fields in entries:
        for event in read_batch(fields[b"e"]):
            if event["seq"] <= seq:
                continue
            if event["seq"] != seq + 1:
                raise JournalBroken(f"The job's journal lost events (after event {seq}, the next is "
                                    f"{event['seq']}): Redis restarted without them, or they were trimmed "
                                    "(journal_max_entries)", "events_lost")
            seq = event["seq"]
            out.append(event)
    return out
