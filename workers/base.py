"""A worker's I/O half, whatever its pipeline: reads jobs from its stream (only as many as its engine can start
now), skips the cancelled, hears cancels, heartbeats, reclaims jobs of dead workers (runs them again, or continues
them where they had streamed), drains on SIGTERM, and rides out Redis outages (every loop backs off and goes on;
the engine is kept).

Subclasses say how a job runs: `start_backend`, `_start`, `cancel_running`, `stop_backend`, and `room`; and
which jobs that had streamed they can continue (`resumable`: then `_start` finds them in `_continuing`).
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
import uuid
from typing import Any, Protocol

import orjson
import redis
from redis.asyncio.client import PubSub
from redis.exceptions import ResponseError

from common import heap, tracing
from common.errors import ErrorBody, OvqError
from common.events import Cancelled, Error
from common.fairness import in_flight
from common.jobs import ENTRY_JOB, ENTRY_REASON, ENTRY_WORKER, LEVELS, Job, JobStatus
from common.keys import GROUP
from common.modelcard import ModelCard
from common.models.config import ModelConfig
from common.redis.client import UNAVAILABLE, Backoff, connect, is_busygroup, is_nogroup, keys_for
from common.redis.cluster import node_client
from common.redis.lane import Command, Lane
from common.redis.transport import lost_transport
from common.settings import Settings
from workers.ops.health import HealthServer
from workers.queue.accounting import Accounting
from workers.queue.affinity import AffineIntake, Affinity
from workers.queue.fence import Fence
from workers.queue.heartbeat import Heartbeat, Steering, gone_apis
from workers.queue.intake import FairKeys, Intake
from workers.queue.publisher import Outbox, Publisher
from workers.queue.reclaim import Continued, Reclaimer, Takeover
from workers.queue.share import correction
from workers.reload import Follower
from workers.vitals import Member, Vitals

log = logging.getLogger("ovq.worker")
API_SCORES_KEPT = 256  # API processes whose heartbeat scores a worker keeps before it forgets the stale ones


class JobState(Protocol):
    job: Job
    entry_id: bytes

    def next_seq(self) -> int: ...

    def summary(self) -> dict[str, float | int | None]: ...

    @property
    def streamed(self) -> bool: ...


class BaseWorker:
    card: ModelCard
    capacity: int

    def __init__(self, settings: Settings, model: ModelConfig, device: str) -> None:
        self.settings, self.model, self.device = settings, model, device
        self._api_scores: dict[str, tuple[float | None, float]] = {}  # reply_to -> (heartbeat, when read)
        self.id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        tracing.setup("worker", self.id, settings.tracing)
        self.keys = keys_for(settings)
        self.stream = self.keys.jobs(model.name, device)
        self.batch_stream = self.keys.batch_jobs(model.name, device)
        self.levels = tuple((level, self.keys.level_jobs(model.name, device, level)) for level in LEVELS)
        self.running: dict[str, Any] = {}
        self.jobs_taken = 0
        self.keep_alive_s: float | None = None  # the last started job's `keep_alive` (None: the setting's)
        self.pool = ""  # the pool worker hosting this one (workers/pool/), shown with its heartbeat
        self.serving = asyncio.Event()  # set once it reads jobs: its backend is up
        # Sleep and wake (`sleep`, `wake`): awake, sleeping (no new job; its backend stops once idle), asleep (the
        # backend released: weights and KV cache), waking. The last wake's seconds, for the ops page and `ovq status`.
        self.state = "awake"
        self.woke_in_s: float | None = None
        self._idle_since = time.monotonic()
        self.tokens_generated = 0
        self.engine_restarts = 0
        self.started = time.time()
        self._cancelled_early: dict[str, float] = {}
        # Jobs whose API process is not listening right now (reconnecting to Redis): started once it is.
        self._deferred: dict[str, tuple[bytes, Job, float]] = {}
        self._cancels_heard_ms: int | None = None
        self._slot_free = asyncio.Event()
        self._stopping = asyncio.Event()
        self.draining = False
        self.reconfiguring = False  # restarting its backend for a changed models-file entry: takes no job
        self.redis = connect(settings, max_connections=32)
        accounting = Accounting(self.keys, model.name, device, self.id, settings)
        self.publisher = Publisher(self.redis, self.keys, self.stream, settings.job_ttl_s, accounting,
                                   settings.journal_ttl_s, settings.journal_max_entries, model.name)
        # The stream entries of the jobs it took: checked after Redis was out of reach (workers/queue/fence.py).
        self.fence = Fence(self.id)
        self.publisher.guard(self.fence, self.fence_off)
        fair = FairKeys.of(self.keys, model.name, device, (level for level, _ in self.levels))
        self.intake = Intake(self.redis, self.id, *(s for _, s in self.levels), aging_s=settings.priority_aging_s,
                             fair=fair)
        self._orphaned: set[str] = set()  # running jobs cancelled because their API process is gone
        self._overdue: set[str] = set()  # running jobs cancelled because their deadline passed
        self.expired = 0  # jobs dropped unrun: read after their deadline
        # Jobs of dead workers to continue from what they had streamed, by id, until `_start` takes them.
        self._continuing: dict[str, Continued] = {}
        self.member = Member(self.id, model.name, device, self.stream, self.batch_stream, self.started, self.levels)
        # Prefix affinity: its own stream read first, others' stolen from when idle (workers/queue/affinity.py).
        # OVQ_AFFINITY=auto: only where the engine caches prefixes (the card says so to the API).
        on = settings.affinity_on(model.enable_prefix_caching)
        self.affinity = Affinity(self.redis, self.keys, settings, self.member) if on else None
        if model.enable_prefix_caching and not model.cache_size:
            # Measured: 4 conversations interleaved on one engine, each next turn found only the system prompt.
            log.warning("%s: prefix caching with cache_size 0 keeps only what running sequences needed: set a "
                        "cache_size (GB) to keep prefixes between requests", model.name)
        if self.affinity is not None:
            self.intake = AffineIntake(self.redis, self.id, *(s for _, s in self.levels),
                                       aging_s=settings.priority_aging_s, fair=fair, affinity=self.affinity)
        self.heartbeat = Heartbeat(self.redis, self.keys, settings, self.member, self.vitals, self.fence)
        self.reclaimer = Reclaimer(self.redis, self.keys, settings, self.member, self._room, self.resumable,
                                   self.heartbeat.steady, self._affinity_streams)
        self.health = HealthServer(self.member, self.vitals, settings.heartbeat_s, settings.worker_host,
                                   settings.worker_port) if settings.worker_port is not None else None

    # ---- what a kind of worker provides -----------------------------------------------------------------
    def configure(self, model: ModelConfig) -> None:
        """Build what the model's options decide (card, capacity, the backend's settings): at start, and again
        when a reload changed them (`reconfigure`)."""
        raise NotImplementedError

    def can_carry(self, state: Any) -> bool:
        """Whether a running job can go on on a replaced backend (`reconfigure` waits for those that cannot)."""
        return False

    def carry_on(self, left: list[Any]) -> None:
        """Go on with jobs that were running when the backend was replaced (`can_carry` said they could)."""

    async def start_backend(self) -> None:
        raise NotImplementedError

    async def stop_backend(self) -> None:
        raise NotImplementedError

    @property
    def backend_alive(self) -> bool:
        return True

    def room(self) -> int:
        """How many more jobs to take from the stream now."""
        return max(0, self.capacity - len(self.running))

    def _room(self) -> int:
        """`room`, and none while it is not awake (its jobs wait in the stream, where a job wakes it) or while it
        replaces its backend for a changed models-file entry (`reconfigure`)."""
        return self.room() if self.state == "awake" and not self.reconfiguring else 0

    @property
    def can_sleep(self) -> bool:
        """Whether its backend can be released and started again in this process (`sleep`)."""
        return False

    def resumable(self, job: Job) -> bool:
        """Whether this worker can continue `job` from what another worker had streamed of it (none can here)."""
        return False

    def engine_stats(self) -> list[float] | None:
        """The engine's last [requests, scheduled, KV cache %, prompt tokens waiting], where it reports them."""
        return None

    def admission_limits(self) -> tuple[int, int]:
        """The learned knee and the limit admitted to now, in sequences; (0, 0) where admission learns none."""
        return 0, 0

    def _start(self, entry_id: bytes, job: Job, outbox: Outbox) -> None:
        raise NotImplementedError

    def cancel_running(self, job_id: str) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        return self.card.servable_type.value

    def vitals(self) -> Vitals:
        """This moment's state, for the heartbeat, the probes and the metrics."""
        knee, limit = self.admission_limits()
        return Vitals(
            card=self.card, capacity=self.capacity, running=len(self.running), draining=self.draining,
            engine_alive=self.backend_alive, engine=self.engine_stats(), jobs_taken=self.jobs_taken,
            reclaimed=self.reclaimer.reclaimed, tokens_generated=self.tokens_generated,
            engine_restarts=self.engine_restarts,
            listeners=frozenset(state.job.reply_to for state in self.running.values()),
            port=self.health.port if self.health else 0, redis_silent_s=time.monotonic() - self.heartbeat.last_ok,
            followed=frozenset(s.job.id for s in self.running.values() if s.job.journal and not s.job.background),
            admission_knee=knee, admission_limit=limit,
            affinity_hits=self.affinity.hits if self.affinity is not None else 0,
            affinity_steals=self.affinity.steals if self.affinity is not None else 0, pool=self.pool,
            state=self.state, woke_in_s=self.woke_in_s, can_sleep=self.can_sleep)

    # ---- lifecycle -------------------------------------------------------------------------------------
    async def run(self, signals: bool = True) -> None:
        """`signals`: SIGTERM and SIGINT drain it (off for a worker a pool hosts: the pool stops its workers)."""
        await self.ensure_group()
        await self.start_backend()
        if self.health is not None:
            await self.health.start()
        self.publisher.start()
        heap.settle()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT) if signals else ():
            loop.add_signal_handler(sig, self.stop, sig.name)
        log.info("worker %s serving %s on %s (%s)", self.id, self.model.name, self.device, self.describe())
        tasks = [
            asyncio.create_task(self._read_loop(), name="read"),
            asyncio.create_task(self._cancel_loop(), name="cancel"),
            asyncio.create_task(self._heartbeat_loop(), name="heartbeat"),
            asyncio.create_task(self._reclaim_loop(), name="reclaim"),
            asyncio.create_task(self._deferred_loop(), name="deferred"),
            asyncio.create_task(self._sleep_loop(), name="sleep"),
        ]
        follower = Follower(self.redis, self.keys, self.settings, self.id, self.model, self.device, self.reconfigure,
                            self._idle, self.stop)
        if follower.enabled:
            tasks.append(asyncio.create_task(follower.run(), name="config"))
        stopper = asyncio.create_task(self._stopping.wait())
        self.serving.set()
        done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not stopper and task.exception():
                log.error("worker task %s failed", task.get_name(), exc_info=task.exception())
        await self._shutdown(tasks)

    def stop(self, why: str) -> None:
        """Drain: take no new job, let the running ones finish within the grace period, then exit."""
        if not self._stopping.is_set():
            log.warning("worker %s stopping (%s): no new jobs; %d running get up to %.0fs", self.id, why,
                        len(self.running), self.settings.shutdown_grace_s)
        self.draining = True
        self._stopping.set()

    @property
    def streams(self) -> tuple[str, ...]:
        return self.member.streams

    def stream_of(self, job: Job) -> str:
        """The stream a job was read from (admit sets its priority from that), where it must be acked: an affinity
        job's is the affinity stream it waited in, whoever runs it."""
        if job.affinity:
            return self.keys.affinity_jobs(self.model.name, self.device, job.affinity)
        return dict(self.levels).get(job.priority, self.stream)

    def _affinity_streams(self) -> tuple[str, ...]:
        return self.affinity.streams if self.affinity is not None else ()

    async def ensure_group(self) -> None:
        """Create both streams' consumer groups (at start, and again when Redis lost them: NOGROUP)."""
        backoff = Backoff()
        for stream in (*self.streams, *self.intake.bells, *self._affinity_streams()[:1]):
            while True:
                try:
                    await self.redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
                    break
                except ResponseError as exc:
                    if is_busygroup(exc):
                        break
                    raise
                except UNAVAILABLE as exc:
                    await asyncio.sleep(backoff.failed(log, f"worker {self.id}", exc))

    async def _shutdown(self, tasks: list[asyncio.Task[Any]]) -> None:
        """Stop reading; let running jobs finish for the grace period; hand back the ones that have sent nothing
        or that another worker can continue (left pending, another worker takes them over) and end the rest with
        an error."""
        tasks[0].cancel()
        if self.affinity is not None:
            try:  # its waiting affinity jobs to the shared stream: others start them now (bounded: socket timeout)
                await self.affinity.drain()
            except (*UNAVAILABLE, ResponseError) as exc:
                log.warning("affinity jobs left for others to steal: %s", exc)
        deadline = time.monotonic() + self.settings.shutdown_grace_s
        while self.running and time.monotonic() < deadline and self.backend_alive:
            await asyncio.sleep(0.05)
        takeover = self.settings.worker_takeover
        handed = [s for s in self.running.values() if not s.streamed or (takeover and self.resumable(s.job))]
        for state in handed:
            del self.running[state.job.id]
        self._fail_all(503, "the worker shut down before the job finished")
        try:
            await asyncio.wait_for(self.publisher.drain(), timeout=10)
        except asyncio.TimeoutError:
            log.error("Redis did not take the last events within 10s; exiting without them")
        for task in tasks:
            task.cancel()
        try:
            await asyncio.wait_for(self.heartbeat.leave(), timeout=5)
            own = (*self.streams, *self.intake.bells, *self._affinity_streams()[:1])  # those ensure_group joined
            await asyncio.wait_for(self.reclaimer.leave(own), timeout=5)
        except (asyncio.TimeoutError, *UNAVAILABLE):
            pass
        await self.stop_backend()
        if self.health is not None:
            await self.health.stop()
        await self.publisher.stop()
        await self.intake.close()
        await self.redis.aclose()
        log.warning("worker %s stopped: %d jobs handed back to the stream", self.id, len(handed))

    # ---- reading jobs ----------------------------------------------------------------------------------
    async def _idle(self) -> bool:
        """Nothing runs here and nothing waits in its streams (what a removed model's worker waits for)."""
        if self.running:
            return False
        pipe = self.redis.pipeline(transaction=False)
        for stream in (*self.streams, *self._affinity_streams()[:1]):
            pipe.xlen(stream)
        return not any(await pipe.execute()) and not self.running

    async def reconfigure(self, model: ModelConfig) -> None:
        """A changed models-file entry (workers/reload.py): take no new job, let the running ones finish, then
        replace the backend with one built from `model`; one that does not start gives way to the last
        configuration again. Waiting jobs wait in the stream meanwhile. Jobs the new backend can go on with
        (`can_carry`: a text job, from the tokens it has generated) get the grace period to finish, then are carried
        over; the others are waited for (none is failed)."""
        old = self.model
        self.reconfiguring = True
        try:
            deadline = time.monotonic() + self.settings.shutdown_grace_s
            while self.running and not self._stopping.is_set() and (
                    time.monotonic() < deadline or not all(self.can_carry(s) for s in self.running.values())):
                await asyncio.sleep(0.05)
            if self._stopping.is_set():
                return
            left = list(self.running.values())
            log.warning("worker %s: %s changed in the models file; restarting its engine (%d jobs carried over)",
                        self.id, model.name, len(left))
            for state in left:  # the old backend's last words about them (its stop cancels them) go nowhere
                del self.running[state.job.id]
            await self.stop_backend()
            try:
                self.model = model
                # In a thread: a tokenizer loads for seconds, and the heartbeats must go on meanwhile (a worker
                # silent past the worker TTL is dead to the others, who would take its jobs over).
                await asyncio.to_thread(self.configure, model)
                await self.start_backend()
            except Exception as exc:  # a path that is not there, a device that does not open: keep serving
                log.error("worker %s: the changed configuration of %s does not start (%s); going on with the last "
                          "one", self.id, model.name, exc)
                self.model = old
                await asyncio.to_thread(self.configure, old)
                await self.start_backend()
            self.running.update((state.job.id, state) for state in left)
            self.carry_on(left)
            log.warning("worker %s: engine restarted with the new configuration of %s", self.id, model.name)
        finally:
            self.reconfiguring = False
            self._slot_free.set()

    async def _read_loop(self) -> None:
        backoff = Backoff()
        while True:
            free = self._room()
            if free <= 0:
                self._slot_free.clear()
                await self._slot_free.wait()
                continue
            try:
                reply = await self.intake.read(free, block_ms=1000)
                taken = time.time()
            except UNAVAILABLE:  # before ResponseError: a Cluster's TRYAGAIN (a slot migrating) is one too
                await backoff.wait()  # the heartbeat loop logs the outage
                continue
            except ResponseError as exc:
                if not is_nogroup(exc):
                    raise
                log.warning("the stream %s lost its consumer group (Redis restarted empty?); creating it again",
                            self.stream)
                await self.ensure_group()
                continue
            backoff.reset()
            for stream, entries in reply:
                await self.admit(entries, stream, taken, self.intake.lane)

    async def admit(self, entries: list[tuple[bytes, dict[bytes, bytes]]], stream: str | None = None,
                    taken: float | None = None, lane: Lane | None = None) -> None:
        """Start the jobs of one read from `stream` (default: the interactive one), read at `taken`: skip the
        cancelled, answer each with `accepted` or `error` at once. `lane`: where to screen them (the read loop's
        own, between its reads; by default the publisher's, which never blocks)."""
        stream = stream or self.stream
        taken = taken or time.time()
        outbox = Outbox()
        jobs = []
        for entry_id, fields in entries:
            try:
                job = Job.from_fields(fields)
                # The stream it came from decides where it is acked, whatever the job says.
                job.priority = self.member.level_of(stream)  # type: ignore[assignment]
                jobs.append((entry_id, job))
            except Exception:
                log.exception("unreadable job %s moved to the dead-letter stream", entry_id)
                await self.dead_letter(fields, "unreadable")
                outbox.ack(entry_id, stream)
                self._refuse_unreadable(fields.get(ENTRY_JOB.encode(), b""), outbox)
        self.publisher.put(outbox)
        await self.admit_jobs(jobs, taken, lane)

    async def admit_jobs(self, jobs: list[tuple[bytes, Job]], taken: float | None = None,
                         lane: Lane | None = None) -> None:
        taken = taken or time.time()
        outbox = Outbox()
        cancelled, gone, deaf = await self._screen([j for e, j in jobs if not self._heard_since(e)],
                                                   {j.reply_to for _, j in jobs}, lane or self.publisher.lane)
        now = time.time()
        started: list[Job] = []
        for entry_id, job in jobs:
            self.fence.hold(entry_id, self.stream_of(job), job.id)
            if job.expired(now):
                self._drop_late(entry_id, job, outbox)
                continue
            if job.journal:  # resumable: its events are journaled, whoever listens (or nobody, for a while)
                outbox.journal(job.id)
            if job.id in cancelled or (job.reply_to in gone and not job.journal) \
                    or self._cancelled_early.pop(job.id, None):
                outbox.publish(job.reply_to, Cancelled(job=job.id, seq=1))
                outbox.set_status(job.id, status=JobStatus.CANCELLED,
                                  reason=f"its API process {job.reply_to} is gone"
                                  if job.reply_to in gone and not job.journal else None)
                outbox.ack(entry_id, self.stream_of(job))
                continue
            if job.reply_to in deaf and not job.journal:
                self._deferred.setdefault(job.id, (entry_id, job, time.monotonic()))
                continue
            self._deferred.pop(job.id, None)
            self.jobs_taken += 1
            self.keep_alive_s = job.keep_alive  # Ollama's rule: each request sets how long the model stays after it
            started.append(job)
            # Its stream entry (Redis time it was queued) and when it left the stream: the queue order, visible.
            outbox.later(job.id, entry=entry_id.decode(), taken=taken)
            self._start(entry_id, job, outbox)
        self.publisher.put(outbox)
        if self.affinity is not None and started:
            self.affinity.served(started)

    def _drop_late(self, entry_id: bytes, job: Job, outbox: Outbox) -> None:
        """A job read after its deadline leaves the stream unrun, with a 504 to whoever still listens."""
        error = OvqError("The request's deadline passed while it waited in the queue; it was not started", 504,
                         "timeout", code="deadline_exceeded")
        outbox.publish(job.reply_to, Error(job=job.id, seq=1, status=504, error=error.body))
        outbox.set_status(job.id, status=JobStatus.ERROR, error=error.body.model_dump())
        outbox.ack(entry_id, self.stream_of(job))
        self.expired += 1

    def cancel_overdue(self, now: float) -> None:
        """Cancel running jobs past their deadline, as if their client had left: nobody waits for the rest."""
        overdue = [s.job for s in self.running.values()
                   if s.job.deadline is not None and now > s.job.deadline and s.job.id not in self._overdue]
        if not overdue:
            return
        outbox = Outbox()
        for job in overdue:
            self._overdue.add(job.id)
            outbox.set_status(job.id, reason="its deadline passed")
            self.cancel(job.id)
        self.publisher.put(outbox)

    async def _deferred_loop(self) -> None:
        """Start deferred jobs once their API listens; drop those nobody has listened for in worker_ttl_s * 4
        (their API process is gone: nobody would hear the answer)."""
        while True:
            await asyncio.sleep(0.25)
            self.cancel_overdue(time.time())
            if not self._deferred:
                continue
            now, outbox = time.monotonic(), Outbox()
            for job_id, (entry_id, job, since) in list(self._deferred.items()):
                if now - since > self.settings.worker_ttl_s * 4:
                    log.warning("job %s dropped: its API process (%s) stopped listening", job_id, job.reply_to)
                    del self._deferred[job_id]
                    outbox.set_status(job_id, status=JobStatus.CANCELLED)
                    outbox.ack(entry_id, self.stream_of(job))
            self.publisher.put(outbox)
            waiting = [(e, j) for e, j, _ in self._deferred.values()][: self._room()]
            try:
                if waiting:
                    await self.admit_jobs(waiting)
            except UNAVAILABLE:
                pass

    @staticmethod
    def _refuse_unreadable(raw: bytes, outbox: Outbox) -> None:
        """A job this worker cannot read (another version?) still gets its one terminal event, if it says where."""
        try:
            data = orjson.loads(raw)
            job_id, reply_to = str(data["id"]), str(data["reply_to"])
        except Exception:
            return
        body = ErrorBody(message="the worker could not read this job (incompatible versions?)", type="server_error")
        outbox.publish(reply_to, Error(job=job_id, seq=1, status=500, error=body))

    def _heard_since(self, entry_id: bytes) -> bool:
        """Whether the job was queued after this worker began hearing cancels (stream ids are Redis time):
        then a cancel for it reaches `cancel()` and no flag lookup is needed."""
        return self._cancels_heard_ms is not None and int(entry_id.split(b"-")[0]) > self._cancels_heard_ms

    async def _flagged(self, jobs: list[Job]) -> set[str]:
        if not jobs:
            return set()
        pipe = self.redis.pipeline(transaction=False)
        for job in jobs:
            pipe.exists(self.keys.cancel(job.id, job.model))
        return {job.id for job, hit in zip(jobs, await pipe.execute(), strict=True) if hit}

    async def _screen(self, jobs: list[Job], reply_tos: set[str],
                      lane: Lane) -> tuple[set[str], set[str], set[str]]:
        """In one round trip: which of `jobs` have their cancel flag set, which API processes are gone, and which
        live ones are not subscribed right now ("deaf": reconnecting to Redis). An event published to a deaf API
        would be lost, so its jobs wait until it listens again."""
        if not jobs and not reply_tos:
            return set(), set(), set()
        commands: list[Command] = [["EXISTS", self.keys.cancel(job.id, job.model)] for job in jobs]
        listeners = sorted(reply_tos)
        # API heartbeats read within a heartbeat are taken as read: with a few API processes, a job's intake then
        # asks for none (one command less per job; on a Cluster, no detour to the master of `apis`).
        now = time.monotonic()
        known = {c: score for c, (score, at) in self._api_scores.items() if now - at < self.settings.heartbeat_s}
        asked = [c for c in listeners if c not in known]
        if asked:
            commands.append(["ZMSCORE", self.keys.apis, *asked])
        if listeners:
            commands.append(["PUBSUB", "NUMSUB", *[self.keys.events(c, self.model.name) for c in listeners]])
        replies = await lane.execute(commands)
        for reply in replies:
            if isinstance(reply, ResponseError):
                raise reply
        flagged = {job.id for job, hit in zip(jobs, replies, strict=False) if hit}
        if not listeners:
            return flagged, set(), set()
        if asked:  # RESP2 answers doubles as strings
            fresh = {c: None if v is None else float(v) for c, v in zip(asked, replies[-2], strict=True)}
            self._api_scores.update((c, (score, now)) for c, score in fresh.items())
            known.update(fresh)
            if len(self._api_scores) > API_SCORES_KEPT:  # API processes come and go: forget the stale
                self._api_scores = {c: v for c, v in self._api_scores.items() if now - v[1] < self.settings.heartbeat_s}
        scores = [known[c] for c in listeners]
        counts = replies[-1]
        subscribers = dict(zip(counts[::2], counts[1::2], strict=True))
        gone = gone_apis(listeners, scores, self.settings.api_ttl_s)
        channel = {c: self.keys.events(c, self.model.name).encode() for c in listeners}
        deaf = {c for c, score in zip(listeners, scores, strict=True)
                if score is not None and c not in gone and not subscribers.get(channel[c])}
        if not self.heartbeat.judges_apis():  # stale scores say nothing yet: wait for them as for a deaf API
            return flagged, set(), deaf | gone
        return flagged, gone, deaf

    # ---- what the heartbeat and the reclaimer learn ----------------------------------------------------
    async def _heartbeat_loop(self) -> None:
        async for steering in self.heartbeat.beats():
            self.steer(steering)
            if self.affinity is not None:
                try:
                    await self.affinity.beat()
                except UNAVAILABLE:
                    pass  # the heartbeat says so

    def steer(self, steering: Steering) -> None:
        now = time.monotonic()  # the beat's reads of API heartbeats: a job's intake needs none of them again
        self._api_scores.update((c, (score, now)) for c, score in steering.api_scores.items())
        self.cancel_orphans(steering.gone)
        self.cancel_unread(steering.unread)
        if steering.drain and not self.draining:
            self.stop("an operator asked it to drain")
        if steering.command == "sleep":
            self.sleep("an operator asked it to")
        elif steering.command == "wake":
            self.wake("an operator asked it to")

    # ---- sleep and wake --------------------------------------------------------------------------------
    def sleep(self, why: str) -> None:
        """Release the backend (its weights and KV cache) while the process, its Redis connections, its heartbeat
        and its card stay: no new job; once the running ones end, the backend stops (`_sleep_loop`)."""
        if not self.can_sleep:
            log.warning("worker %s cannot sleep (%s): ignored", self.id, self.describe())
        elif self.state == "awake":
            log.info("worker %s going to sleep (%s): %d running finish first", self.id, why, len(self.running))
            self.state = "sleeping"

    def wake(self, why: str) -> None:
        if self.state == "sleeping":  # not yet asleep: it simply goes on
            self.state = "awake"
            self._slot_free.set()
        elif self.state == "asleep":
            log.info("worker %s waking (%s)", self.id, why)
            self.state = "waking"

    async def _sleep_loop(self) -> None:
        """Carry sleep and wake out: stop the backend once a sleeping worker is idle; start it again when asked, or
        when a job waits in its streams (or a request waits for its model's card); after
        OVQ_WORKER_SLEEP_AFTER_S idle, fall asleep by itself."""
        after = self.settings.worker_sleep_after_s
        while True:
            await asyncio.sleep(0.25)
            if self.running or self._deferred:
                self._idle_since = time.monotonic()
            elif self.state == "awake" and after is not None and time.monotonic() - self._idle_since >= after:
                self.sleep(f"idle for {after:g}s (OVQ_WORKER_SLEEP_AFTER_S)")
            if self.state == "sleeping" and not self.running and not self._deferred:
                began = time.monotonic()
                await self.stop_backend()
                self.state = "asleep"
                log.info("worker %s asleep: its engine released in %.2fs", self.id, time.monotonic() - began)
            elif self.state == "asleep":
                try:
                    if await self._work_waits():
                        self.wake("a job waits")
                except UNAVAILABLE:
                    pass
            if self.state == "waking":
                await self._wake_backend()

    async def _wake_backend(self) -> None:
        began = time.monotonic()
        try:
            await self.start_backend()
        except Exception as exc:
            log.error("worker %s could not wake its engine (%s); stopping", self.id, exc)
            self.state = "asleep"
            self.stop("its engine could not be started again")
            return
        self.woke_in_s = time.monotonic() - began
        self.state, self._idle_since = "awake", time.monotonic()
        self._slot_free.set()
        log.info("worker %s awake: its engine started again in %.2fs", self.id, self.woke_in_s)

    async def _work_waits(self) -> bool:
        """A job waits in one of its streams (XLEN - in flight: acked entries are deleted), or a request waits for
        its model's card."""
        pipe = self.redis.pipeline(transaction=False)
        for stream in self.streams:
            pipe.xlen(stream)
            pipe.xpending(stream, GROUP)
        pipe.llen(self.keys.awaiting(self.model.name, self.device))
        replies = await pipe.execute(raise_on_error=False)
        *pairs, awaiting = replies
        waiting = sum(max(int(n) - in_flight(p), 0) for n, p in zip(pairs[::2], pairs[1::2], strict=True)
                      if isinstance(n, int) and isinstance(p, dict))
        return waiting > 0 or (isinstance(awaiting, int) and awaiting > 0)

    async def _reclaim_loop(self) -> None:
        async for takeover in self.reclaimer.passes():
            try:
                await self.take_over(takeover)
            except UNAVAILABLE:
                pass  # Redis is away; the heartbeat loop says so
            except Exception:
                log.exception("taking over the jobs of dead workers failed")

    async def take_over(self, takeover: Takeover) -> None:
        """Act on what a reclaim pass claimed: dead-letter, fail and ack, run again."""
        for fields in takeover.dead:
            await self.dead_letter(fields, "delivered too often")
        self.publisher.put(takeover.outbox)
        if takeover.rerun:
            await self.admit(takeover.rerun, takeover.stream)
        if takeover.continued:
            for continued in takeover.continued:
                self._continuing[Job.from_fields(continued.fields).id] = continued
            await self.admit([(c.entry_id, c.fields) for c in takeover.continued], takeover.stream)
            # Cancelled meanwhile (or their API is gone): they did not start, and will not.
            self._continuing = {j: c for j, c in self._continuing.items() if j in self._deferred}

    def fence_off(self, jobs: set[str]) -> None:
        """Jobs another worker took over while this one could not reach Redis (the publisher found them so and
        logged it): they are that worker's now. Stop them here without a word; nothing of them goes out."""
        for job_id in jobs:
            self._deferred.pop(job_id, None)
            self._continuing.pop(job_id, None)
            if job_id in self.running:
                self.drop(job_id)
        self._slot_free.set()

    def drop(self, job_id: str) -> None:
        """Stop a running job that is no longer this worker's: cancelled as by its client (the publisher drops
        what it still sends, its end too)."""
        self.cancel_running(job_id)

    def cancel_orphans(self, gone: set[str]) -> None:
        """Cancel the running jobs of API processes that are gone: nobody reads what they would generate."""
        orphans = [s.job for s in self.running.values()
                   if s.job.reply_to in gone and not s.job.journal and s.job.id not in self._orphaned]
        if not orphans:
            return
        log.warning("cancelling %d running jobs: their API process is gone (%s)", len(orphans),
                    ", ".join(sorted({job.reply_to for job in orphans})))
        outbox = Outbox()
        for job in orphans:
            self._orphaned.add(job.id)
            outbox.set_status(job.id, reason=f"its API process {job.reply_to} is gone")
            self.cancel(job.id)
        self.publisher.put(outbox)

    def cancel_unread(self, unread: set[str]) -> None:
        """Cancel the resumable streams nobody has read for the grace period: their client left for good."""
        jobs = [job_id for job_id in unread if job_id in self.running and job_id not in self._orphaned]
        if not jobs:
            return
        log.info("cancelling %d resumable streams: no client came back within resume_grace_s", len(jobs))
        outbox = Outbox()
        for job_id in jobs:
            self._orphaned.add(job_id)
            outbox.set_status(job_id, reason="its client left and did not resume it within resume_grace_s")
            self.cancel(job_id)
        self.publisher.put(outbox)

    async def dead_letter(self, fields: dict[bytes, bytes], reason: str) -> None:
        """Into the dead-letter stream (trimmed to about OVQ_MAX_DEAD_LETTERS), for `ovq dead` and the ops page."""
        await self.redis.xadd(self.keys.dead, {**fields, ENTRY_REASON.encode(): reason.encode(),
                                              ENTRY_WORKER.encode(): self.id.encode()},
                              maxlen=self.settings.max_dead_letters, approximate=True)

    def _job_done(self, state: JobState, outbox: Outbox) -> None:
        del self.running[state.job.id]
        self._orphaned.discard(state.job.id)
        self._overdue.discard(state.job.id)
        self._slot_free.set()
        outbox.ack(state.entry_id, self.stream_of(state.job))
        share = state.job.share
        if share is not None:  # its tenant's fair share: by the tokens it took
            summary = state.summary()
            # its tokens; a job whose cost is its work (a video's) says so in `cost`
            used = int(summary.get("cost") or summary.get("prompt_tokens") or 0) + \
                int(summary.get("completion_tokens") or 0)
            clock = self.keys.fair_clock(self.model.name, self.device, state.job.priority)
            outbox.commands.append(correction(clock, self.keys.job(state.job.id, self.model.name), share.tenant,
                                              (used - share.cost) / share.weight, self.settings.job_ttl_s))

    def _fail_all(self, status: int, message: str) -> None:
        outbox = Outbox()
        for state in list(self.running.values()):
            error = OvqError(message, status, "server_error" if status >= 500 else "invalid_request_error")
            outbox.publish(state.job.reply_to, Error(job=state.job.id, seq=state.next_seq(), status=status,
                                                     error=error.body))
            outbox.set_status(state.job.id, status=JobStatus.ERROR, error=error.body.model_dump(),
                              **state.summary())
            outbox.ack(state.entry_id, self.stream_of(state.job))
            if state.streamed:
                outbox.forget(state.job.id)
        self.running.clear()
        self._orphaned.clear()
        self._overdue.clear()
        self._slot_free.set()
        self.publisher.put(outbox)

    # ---- cancellation ----------------------------------------------------------------------------------
    async def _cancel_loop(self) -> None:
        """Hear cancels on the channel; after a lost connection, resubscribe and look up the flags of every
        running job (a cancel published meanwhile was missed)."""
        while True:
            pubsub = None
            try:
                pubsub = await self._cancels()
                async for message in pubsub.listen():
                    if message["type"] in ("subscribe", "ssubscribe"):
                        seconds, micros = await self.redis.time()
                        self._cancels_heard_ms = seconds * 1000 + micros // 1000
                        for job_id in await self._flagged([s.job for s in self.running.values()]):
                            self.cancel(job_id)
                    elif message["type"] in ("message", "smessage"):
                        self.cancel(message["data"].decode())
                    elif message["type"] == "sunsubscribe":  # the channel's slot moved: subscribe where it is now
                        raise redis.ConnectionError("the cancel channel's slot moved")
            except (*UNAVAILABLE, RuntimeError) as exc:
                if isinstance(exc, RuntimeError) and not lost_transport(exc):
                    raise
                self._cancels_heard_ms = None  # cancels may be missed until resubscribed: look flags up
                await asyncio.sleep(1.0)
            finally:
                try:
                    if pubsub is not None:
                        await pubsub.aclose()
                except (*UNAVAILABLE, RuntimeError) as exc:
                    if isinstance(exc, RuntimeError) and not lost_transport(exc):
                        raise

    async def _cancels(self) -> PubSub:
        """Subscribed to the channel cancels come on: the one channel on one Redis; on a Cluster the model's own,
        sharded, on the master that owns its slot."""
        if not self.keys.cluster:
            pubsub = self.redis.pubsub()
            await pubsub.subscribe(self.keys.cancel_channel)
            return pubsub
        channel = self.keys.model_cancel_channel(self.model.name)
        pubsub = (await node_client(self.redis, channel, refresh=True)).pubsub()
        await pubsub.ssubscribe(channel)
        return pubsub

    def cancel(self, job_id: str) -> None:
        if job_id in self.running:
            self.cancel_running(job_id)
            return
        now = time.monotonic()
        # Remember briefly: the job may be between its cancel-flag check and its start.
        self._cancelled_early[job_id] = now
        if len(self._cancelled_early) > 10_000:
            self._cancelled_early = {j: t for j, t in self._cancelled_early.items() if now - t < 60}
