"""The batch worker: an rq worker on ovq's batch queue that also takes up batches whose runner died.

It runs each batch in its own process (rq's SimpleWorker, no fork): a batch is I/O-bound asyncio, and a
SIGKILL of this process then really ends the batch's runner; its lease lapses and a sweep, here or in another
batch worker, queues the batch again, within about `batch_lease_s + batch_sweep_s`. rq's own abandoned-job
handling (a retry once the job's heartbeat is gone) does the same for plain `rq worker` processes, later.

SIGTERM drains: the running batch stops feeding lines, lets those in flight finish (up to the grace period),
goes back on the queue for another worker, and the worker exits.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from rq import Queue, SimpleWorker
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.utils import now
from rq.worker import WorkerStatus

from common.batch.rq_keys import use_rq_prefix
from common.batch.store import TERMINAL, BatchQueue
from common.keys import Keys
from common.redis.client import Backoff, keys_for, reason
from common.settings import Settings

log = logging.getLogger("ovq.batch")

WAITING = (JobStatus.QUEUED, JobStatus.SCHEDULED, JobStatus.DEFERRED)
REDIS_AWAY = (redis.ConnectionError, redis.TimeoutError)


def sweep_once(connection: redis.Redis, keys: Keys, settings: Settings, queue: BatchQueue) -> list[str]:
    """Queue again every batch that should be running and is not: no lease, and no rq job waiting or just
    started for it. Forgets active entries of ended or vanished batches. Returns the batches queued."""
    queued = []
    for raw in connection.zrange(keys.active_batches, 0, -1):
        batch_id = raw.decode()
        status, rq_job = connection.hmget(keys.batch(batch_id), ["status", "rq_job"])
        if status is None or status.decode() in TERMINAL:
            connection.zrem(keys.active_batches, batch_id)
            continue
        if connection.exists(keys.batch_lease(batch_id)) or _rq_job_alive(connection, rq_job, settings):
            continue
        # One sweeper at a time (several batch workers sweep); a second rq job would only find the lease held.
        if not connection.set(keys.batch_requeue(batch_id), 1, nx=True, ex=max(1, int(settings.batch_lease_s))):
            continue
        connection.hset(keys.batch(batch_id), "rq_job", queue.enqueue(batch_id))
        log.warning("batch %s had no runner (its batch worker died?): queued again", batch_id)
        queued.append(batch_id)
    return queued


def _rq_job_alive(connection: redis.Redis, rq_job: bytes | None, settings: Settings) -> bool:
    """Whether the batch's rq job waits in the queue, or started so recently that its runner has no lease yet."""
    if rq_job is None:
        return False
    try:
        job = Job.fetch(rq_job.decode(), connection=connection)
    except NoSuchJobError:
        return False
    status = job.get_status(refresh=False)
    if status in WAITING:
        return True
    started = job.started_at
    if status == JobStatus.STARTED and started is not None:
        if started.tzinfo is None:
            started = started.replace(tzinfo=now().tzinfo)
        return (now() - started).total_seconds() < 2 * settings.batch_lease_s
    return False


class Sweeper(threading.Thread):
    def __init__(self, settings: Settings, connection: redis.Redis) -> None:
        super().__init__(name="batch-sweeper", daemon=True)
        self.settings, self.connection = settings, connection
        self.keys = keys_for(settings)
        self.queue = BatchQueue(connection, self.keys, settings)
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.settings.batch_sweep_s):
            try:
                sweep_once(self.connection, self.keys, self.settings, self.queue)
            except redis.RedisError as exc:
                log.warning("batch sweep: Redis unavailable (%s)", exc)
            except Exception:
                log.exception("batch sweep failed")


class BatchWorker(SimpleWorker):
    """rq's SimpleWorker, keeping rq's heartbeats while a (long) batch runs, with a sweeper beside it.

    rq's work loop quits on any error but its dequeue's own lost connections: a Redis restart or a Sentinel
    failover that met a suspension check, a heartbeat or a job's bookkeeping ended the batch worker, and the
    batches it would have run waited for ever (the likely cause of a batch that stayed `validating` through CI's
    Sentinel failover test). Here those wait for Redis, with one log line each, as the dequeue does."""

    def __init__(self, settings: Settings, connection: redis.Redis, **kwargs: Any) -> None:
        keys = keys_for(settings)
        use_rq_prefix(keys)  # rq is imported by now: this checks it names its keys under this deployment's prefix
        super().__init__([Queue(keys.batch_queue, connection=connection)], connection=connection, **kwargs)
        self.settings = settings
        self.sweeper = Sweeper(settings, connection)

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        """rq's start (registering this worker), tried again while Redis is away, for up to redis_wait_s."""
        deadline, backoff = time.monotonic() + self.settings.redis_wait_s, Backoff()
        while True:
            try:
                return super().bootstrap(*args, **kwargs)
            except REDIS_AWAY as exc:
                if time.monotonic() + backoff.delay > deadline:
                    raise
                time.sleep(backoff.failed(log, "batch worker starting", exc))

    def check_for_suspension(self, burst: bool) -> None:
        self._unless_redis_away("suspension check", super().check_for_suspension, burst)

    def run_maintenance_tasks(self) -> None:
        self._unless_redis_away("rq's maintenance", super().run_maintenance_tasks)

    def heartbeat(self, *args: Any, **kwargs: Any) -> None:
        self._unless_redis_away("rq heartbeat", super().heartbeat, *args, **kwargs)

    def set_state(self, *args: Any, **kwargs: Any) -> None:
        self._unless_redis_away("rq worker state", super().set_state, *args, **kwargs)

    @staticmethod
    def _unless_redis_away(what: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Skipped while Redis is away: the loop's next step, the dequeue, waits for it with backoff."""
        try:
            call(*args, **kwargs)
        except REDIS_AWAY as exc:
            log.warning("%s skipped: Redis unavailable (%s)", what, reason(exc))

    def work(self, *args: Any, **kwargs: Any) -> bool:
        self.sweeper.start()
        try:
            return super().work(*args, **kwargs)
        finally:
            self.sweeper.stopped.set()

    def execute_job(self, job: Job, queue: Queue) -> None:
        execution = self.prepare_execution(job)
        done = threading.Event()
        beat = threading.Thread(target=self._keep_heartbeats, args=(job, execution, done), name="rq-heartbeat",
                                daemon=True)
        beat.start()
        try:
            self.perform_job(job, queue, execution)
        except REDIS_AWAY as exc:  # rq's own bookkeeping of the job; the batch's lease and the sweep cover it
            log.warning("rq job %s: its end not recorded, Redis unavailable (%s); a sweep queues its batch again if "
                        "it did not end", job.id, reason(exc))
        finally:
            done.set()
            beat.join(timeout=5)
        self.set_state(WorkerStatus.IDLE)

    def _keep_heartbeats(self, job: Job, execution: Any, done: threading.Event) -> None:
        """What rq's forking worker does while its work horse runs: without it a batch longer than rq's worker
        TTL would look abandoned to rq."""
        while not done.wait(self.job_monitoring_interval):
            try:
                self.maintain_heartbeats(job, execution)
            except redis.RedisError as exc:
                log.warning("rq heartbeat failed (%s)", exc)
