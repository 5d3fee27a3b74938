"""Everything a worker tells Redis about its jobs goes through here: one pipelined round trip per batch, on
a connection of the publisher's own (`common.redis.lane`).

Batches are sent strictly in order by one task, so a job's events reach the API in sequence; when Redis is
slower than the engine, the batches waiting are merged into one round trip.

A streaming text job's generated ids (`Outbox.record`) are appended to its `Keys.generated` in the same round trip,
just before the events whose text they made, so another worker can continue the job if this one dies.

After Redis was out of reach, the first round trip waits for the fence's check (`workers/queue/fence.py`): the jobs
another worker took over meanwhile are dropped from everything this publisher still sends.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from common.events import TERMINAL, pack
from common.jobs import JobHash, JobStatus
from common.keys import GROUP, Keys
from common.ops.stats import observe
from common.redis.client import UNAVAILABLE, Backoff, reason
from common.redis.cluster import open_lane
from common.redis.lane import Command
from workers.queue.accounting import STATS_EVERY_S, Accounting
from workers.queue.fence import Fence

log = logging.getLogger("ovq.publisher")
RENEW_EVERY = 256  # a journal's TTL is renewed with its first entry, every this many entries, and its last
ENDED = frozenset({JobStatus.DONE, JobStatus.ERROR, JobStatus.CANCELLED})
RENEWALS_KEPT = 65_536  # jobs whose hash TTL this worker set lately (a job that ends elsewhere leaves its entry)
# How long what a fenced-off job still sends is dropped: its worker stops it at once, but a kind of worker whose
# job ends at its next step (speech, images) may still send its end that long after.
STALE_S = 60.0


@dataclass
class Outbox:
    events: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    status: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Hash fields that wait for the job's next write of its hash (`later`).
    held: dict[str, dict[str, Any]] = field(default_factory=dict)
    # (stream, entry id); stream None: the worker's own (interactive) stream.
    acks: list[tuple[str | None, bytes]] = field(default_factory=list)
    # Counts for the model's stats window (`common/ops/stats.py` fields), added up in memory over a step.
    stats: Counter[str] = field(default_factory=Counter)
    # Called once this outbox's round trip has gone through (a traced job's publish span ends there).
    sent: list[Callable[[], None]] = field(default_factory=list)
    # Packed records of generated ids to append to each job's `Keys.generated` (`workers/text/progress.py`), the
    # jobs whose TTL this worker sets with them (its first), and the jobs whose record ended (deleted).
    records: dict[str, list[bytes]] = field(default_factory=dict)
    fresh: set[str] = field(default_factory=set)
    forgotten: set[str] = field(default_factory=set)
    # Jobs whose events from now on also go to their journal (`Job.journal`): set before their first event.
    journaled: set[str] = field(default_factory=set)
    # Further commands for the round trip (a tenant's fair-share correction when its job ends, common/fairness.py).
    commands: list[Command] = field(default_factory=list)

    def publish(self, reply_to: str, event: Any) -> None:
        self.events[reply_to].append(event if type(event) is dict else event.model_dump(mode="json"))

    def set_status(self, job: str, **values: Any) -> None:
        """Fields of the job's hash, named as `common.jobs.JobHash` names them (a value None: left as it is)."""
        self.status.setdefault(job, {}).update(values)

    def later(self, job: str, **values: Any) -> None:
        """Fields of the job's hash that only say what happened (when it left its stream): they go with the job's
        next write of its hash (it starts, or ends), not in a write of their own: an HSET and an EXPIRE a job
        less. A worker that dies first leaves them unwritten, and nobody decides anything by them."""
        self.held.setdefault(job, {}).update(values)

    def journal(self, job: str) -> None:
        """The job is resumable: its events go to its journal too (`Keys.journal`), from this outbox on."""
        self.journaled.add(job)

    def ack(self, entry_id: bytes, stream: str | None = None) -> None:
        self.acks.append((stream, entry_id))

    def record(self, job: str, records: list[bytes], first: bool = False) -> None:
        """Append `records` to the job's record of generated ids (`first`: this worker's first: it sets the TTL).
        The list is the outbox's from now on."""
        held = self.records.get(job)
        if held is None:
            self.records[job] = records
        else:
            held.extend(records)
        if first:
            self.fresh.add(job)

    def forget(self, job: str) -> None:
        """The job ended: its record of generated ids goes."""
        self.forgotten.add(job)

    def count(self, name: str, n: int = 1) -> None:
        self.stats[name] += n

    def observe(self, histogram: str, ms: float, n: int = 1) -> None:
        observe(self.stats, histogram, ms, n)

    def merge(self, other: Outbox) -> None:
        for reply_to, events in other.events.items():
            self.events[reply_to].extend(events)
        for job, values in other.status.items():
            self.set_status(job, **values)
        for job, values in other.held.items():
            self.later(job, **values)
        self.acks.extend(other.acks)
        self.stats.update(other.stats)
        self.sent.extend(other.sent)
        for job, records in other.records.items():
            self.records.setdefault(job, []).extend(records)
        self.fresh |= other.fresh
        self.forgotten |= other.forgotten
        self.journaled |= other.journaled
        self.commands += other.commands

    def __bool__(self) -> bool:
        return bool(self.events or self.status or self.held or self.acks or self.stats or self.records or self.forgotten
                    or self.journaled or self.commands)


class Publisher:
    def __init__(self, redis: aioredis.Redis, keys: Keys, stream: str, job_ttl: int,
                 accounting: Accounting | None = None, journal_ttl: int = 3600,
                 journal_max: int = 100_000, model: str = "") -> None:
        """`model`: the worker's, which names its jobs' keys on a Cluster."""
        self.keys, self.stream, self.job_ttl, self.model = keys, stream, job_ttl, model
        self.journal_ttl, self.journal_max = journal_ttl, journal_max
        self._journaled: dict[str, int] = {}  # resumable jobs running -> entries written to their journal
        self._renewed: dict[str, float] = {}  # job -> when (monotonic) this worker last set its hash's TTL
        self._held: dict[str, dict[str, Any]] = {}  # job -> hash fields for its next write (`Outbox.later`)
        self.accounting = accounting
        self.lane = open_lane(redis)  # one round trip per engine step: no pool checkout, no pipeline object
        self._queue: asyncio.Queue[Outbox] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._publish = "SPUBLISH" if keys.cluster else "PUBLISH"  # sharded on a Cluster: to its node only
        self.fence: Fence | None = None
        self._fenced_off: Callable[[set[str]], None] = lambda jobs: None
        # Jobs (and their entries) another worker took over: what they still send is dropped, until the instant.
        self._stale: dict[str, float] = {}
        self._stale_entries: dict[bytes, float] = {}

    def guard(self, fence: Fence, fenced_off: Callable[[set[str]], None]) -> None:
        """Check `fence` after Redis was out of reach; `fenced_off` stops the jobs it finds taken over."""
        self.fence, self._fenced_off = fence, fenced_off

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="publisher")
        self._ticker = asyncio.create_task(self._tick(), name="publisher-stats")

    def put(self, outbox: Outbox) -> None:
        if outbox:
            self._queue.put_nowait(outbox)

    async def drain(self) -> None:
        await self._queue.join()

    async def stop(self) -> None:
        """After the caller's (bounded) drain: the counts still pending, in one short try (Redis may be stopping
        too: they are operators' counts, not anyone's answer), then the tasks and the connection."""
        for task in (self._task, self._ticker):
            if task:
                task.cancel()
        if self.accounting is not None and self.accounting.pending:
            try:
                await asyncio.wait_for(self._send(Outbox(), [], everything=True), timeout=2)
                self.accounting.written(True)
            except (asyncio.TimeoutError, *UNAVAILABLE) as exc:
                log.warning("the last second's stats counts were not written (%s)", reason(exc))
        await self.lane.close()

    async def _tick(self) -> None:
        """Counts pending on an idle worker go out within a second or so too."""
        while True:
            await asyncio.sleep(STATS_EVERY_S)
            if self.accounting is not None and self._queue.empty() and self.accounting.due(time.time()):
                self._queue.put_nowait(Outbox())

    async def _run(self) -> None:
        while True:
            batch = await self._queue.get()
            merged = 1
            while not self._queue.empty():
                batch.merge(self._queue.get_nowait())
                merged += 1
            if self._stale:
                self._strip(batch)
            try:
                await self._send_until_sent(batch)
            finally:
                for _ in range(merged):
                    self._queue.task_done()

    async def _send_until_sent(self, batch: Outbox) -> None:
        """Redis away for a moment must not lose a terminal event: retry, newest batches wait behind."""
        failures = self.accounting.settle(batch.status, batch.stats) if self.accounting is not None else []
        backoff = Backoff()
        fence = self.fence
        while True:
            try:
                if fence is not None and fence.due:
                    await self._check(fence, batch)
                await self._send(batch, failures)
                if fence is not None and batch.acks:
                    fence.acked(batch.acks)
                if self.accounting is not None:
                    self.accounting.written(True)
                for done in batch.sent:
                    done()
                return
            except UNAVAILABLE as exc:
                if fence is not None:
                    fence.due = True
                if self.accounting is not None:
                    self.accounting.written(False)
                if not (batch.events or batch.status or batch.acks or batch.records or batch.forgotten or failures):
                    return  # only counts (the ticker's): pending again, for the next round trip
                if not backoff.failures:
                    log.warning("publishing to Redis failed (%s); retrying until it is back", reason(exc))
                await backoff.wait()

    async def _check(self, fence: Fence, batch: Outbox) -> None:
        """One round trip: which of this worker's jobs another worker took over while Redis was out of reach. Those
        are stopped here (`fenced_off`) and nothing more of them goes out, from `batch` on."""
        commands = fence.commands()
        lost = fence.lost(await self.lane.execute(commands) if commands else [])
        if not lost:
            return
        jobs = set(lost.values())
        log.warning("fenced off %d job(s) another worker took over while this one could not reach Redis; dropping "
                    "what they had still to send: %s", len(jobs), ", ".join(sorted(jobs)))
        until = time.monotonic() + STALE_S
        self._stale.update(dict.fromkeys(jobs, until))
        self._stale_entries.update(dict.fromkeys(lost, until))
        self._fenced_off(jobs)
        self._strip(batch)

    def _strip(self, batch: Outbox) -> None:
        """Drop from `batch` everything of the jobs fenced off (their events, hash fields, records, acks)."""
        now = time.monotonic()
        self._stale = stale = {job: until for job, until in self._stale.items() if until > now}
        self._stale_entries = {entry: until for entry, until in self._stale_entries.items() if until > now}
        for reply_to, events in list(batch.events.items()):
            kept = [event for event in events if event["job"] not in stale]
            if kept:
                batch.events[reply_to] = kept
            else:
                del batch.events[reply_to]
        for job in stale:
            batch.status.pop(job, None)
            batch.held.pop(job, None)
            self._held.pop(job, None)
            batch.records.pop(job, None)
            self._journaled.pop(job, None)
        batch.fresh -= stale.keys()
        batch.forgotten -= stale.keys()
        batch.journaled -= stale.keys()
        batch.acks = [(stream, entry) for stream, entry in batch.acks if entry not in self._stale_entries]

    async def _send(self, batch: Outbox, failures: list[bytes], everything: bool = False) -> None:
        commands: list[Command] = []
        if batch.held or self._held:
            self._hold(batch)
        for job, values in batch.status.items():
            values[JobHash.UPDATED] = time.time()
            key = self.keys.job(job, self.model)
            fields = [part for k, v in values.items() if v is not None
                      for part in (k, v if isinstance(v, (str, int, float)) else orjson.dumps(v))]
            commands.append(["HSET", key, *fields])
            if self._renews(job, values.get(JobHash.STATUS)):
                commands.append(["EXPIRE", key, self.job_ttl])
        # Before the events they match: a worker that dies after this round trip leaves ids and text agreeing.
        for job, records in batch.records.items():
            if job not in batch.forgotten:
                key = self.keys.generated(job, self.model)
                commands.append(["APPEND", key, records[0] if len(records) == 1 else b"".join(records)])
                if job in batch.fresh:
                    commands.append(["EXPIRE", key, self.job_ttl])
        for reply_to, events in batch.events.items():
            commands.append([self._publish, self.keys.events(reply_to, self.model), pack(events)])
        if batch.journaled:
            self._journaled.update(dict.fromkeys(batch.journaled - self._journaled.keys(), 0))
        ended = self._journal(batch, commands) if self._journaled else []  # plain jobs: this is all they cost
        by_stream: dict[str, list[bytes]] = defaultdict(list)
        for stream, entry_id in batch.acks:
            by_stream[stream or self.stream].append(entry_id)
        for stream, entry_ids in by_stream.items():
            commands += [["XACK", stream, GROUP, *entry_ids], ["XDEL", stream, *entry_ids]]
        commands += batch.commands
        if batch.forgotten:
            commands.append(["UNLINK", *(self.keys.generated(job, self.model) for job in batch.forgotten)])
        if self.accounting is not None:
            self.accounting.write(commands, failures, everything)
        if not commands:
            return
        # Not sent again by the lane on a fresh connection: after a lost one, the fence is checked first (the
        # jobs may be another worker's by then).
        for result in await self.lane.execute(commands, retry=False):
            # A command Redis refuses (NOGROUP after Redis lost its data) must not hold up the events behind it.
            if isinstance(result, ResponseError):
                log.warning("Redis refused a command while publishing: %s", result)
        for job in ended:  # only once sent: a retried round trip journals its terminal event again
            self._journaled.pop(job, None)

    def _hold(self, batch: Outbox) -> None:
        """The held fields of the jobs `batch` writes go into those writes; the rest wait for their job's next."""
        for job, values in batch.held.items():
            self._held.setdefault(job, {}).update(values)
        batch.held = {}
        for job in self._held.keys() & batch.status.keys():
            batch.status[job] = {**self._held.pop(job), **batch.status[job]}
        if len(self._held) > RENEWALS_KEPT:  # jobs that never wrote again here (taken over): the oldest go
            for job in list(self._held)[: len(self._held) - RENEWALS_KEPT]:
                del self._held[job]

    def _renews(self, job: str, status: Any) -> bool:
        """Whether this write of the job's hash sets its TTL again: its first write here, its last (the result is
        kept for the TTL from the job's end), and one every half TTL between, so a job running longer than the
        TTL keeps its hash. Not with every write: a short job's writes were half EXPIREs."""
        now = time.monotonic()
        if status in ENDED:
            self._renewed.pop(job, None)
            return True
        last = self._renewed.get(job)
        if last is not None and now - last < self.job_ttl / 2:
            return False
        if len(self._renewed) >= RENEWALS_KEPT:  # those due anyway go: the next write of each renews it
            self._renewed = {j: t for j, t in self._renewed.items() if now - t < self.job_ttl / 2}
        self._renewed[job] = now
        return True

    def _journal(self, batch: Outbox, commands: list[Command]) -> list[str]:
        """Each resumable job's events of this round trip as one entry of its journal, in the same round trip as
        the PUBLISH: a reader of the journal sees them no later than the API process the job answers to."""
        by_job: dict[str, list[dict[str, Any]]] = {}
        journaled = self._journaled
        for events in batch.events.values():
            for event in events:
                if event["job"] in journaled:
                    by_job.setdefault(event["job"], []).append(event)
        finished = []
        for job, events in by_job.items():
            key = self.keys.journal(job, self.model)
            commands.append(["XADD", key, "MAXLEN", "~", self.journal_max, "*", "e", pack(events)])
            written = journaled[job]
            ended = any(event["type"] in TERMINAL for event in events)
            if ended or written % RENEW_EVERY == 0:
                commands.append(["EXPIRE", key, self.journal_ttl])
            journaled[job] = written + 1
            if ended:
                finished.append(job)
        return finished
