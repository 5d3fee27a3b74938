"""Every Redis key and channel name, in one place."""
from __future__ import annotations

from dataclasses import dataclass

GROUP = "workers"


@dataclass(frozen=True)
class Keys:
    prefix: str = "ovq"

    def jobs(self, model: str, device: str) -> str:
        """The queue of one model on one device (a stream with consumer group `workers`)."""
        return f"{self.prefix}:jobs:{model}:{device}"

    def events(self, reply_to: str) -> str:
        """Pub/sub channel a job's events go to (`reply_to` names the API process that waits for them)."""
        return f"{self.prefix}:ev:{reply_to}"

    def job(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}"

    def cancel(self, job_id: str) -> str:
        return f"{self.prefix}:cancel:{job_id}"

    @property
    def cancel_channel(self) -> str:
        return f"{self.prefix}:cancel"

    def worker(self, worker_id: str) -> str:
        return f"{self.prefix}:worker:{worker_id}"

    def workers(self, model: str, device: str) -> str:
        """Sorted set of the ids of the workers serving a model on a device, scored by last heartbeat (unix s)."""
        return f"{self.prefix}:workers:{model}:{device}"

    def model(self, model: str) -> str:
        """Hash: device -> JSON model card, written by that device's workers."""
        return f"{self.prefix}:model:{model}"

    @property
    def models(self) -> str:
        """Sorted set: every model a worker has announced, scored by its last heartbeat (unix s); entries older
        than the card TTL are trimmed by the heartbeats, so retired models leave the list."""
        return f"{self.prefix}:models:seen"

    def blob(self, job_id: str, name: str) -> str:
        """Bytes a job needs or made (uploads, PNGs), with a short TTL: never in the stream or on pub/sub."""
        return f"{self.prefix}:blob:{job_id}:{name}"

    @property
    def dead(self) -> str:
        """Stream of jobs that failed delivery too often or could not be read (capped: OVQ_MAX_DEAD_LETTERS)."""
        return f"{self.prefix}:dead"

    def stats(self, model: str, device: str, window: int) -> str:
        """Hash of one model on one device over one stats window starting at `window` (unix s): counters and
        latency histogram buckets that its workers HINCRBY (TTL OVQ_STATS_TTL_S). Fields: `common/stats.py`."""
        return f"{self.prefix}:stats:{model}:{device}:{window}"

    @property
    def failed(self) -> str:
        """List of the most recent failed jobs, newest first, JSON each (capped: OVQ_FAILED_JOBS_KEPT)."""
        return f"{self.prefix}:failed"

    def drain(self, worker_id: str) -> str:
        """String set by an operator (TTL): the worker reads it each heartbeat, stops taking jobs, finishes, exits."""
        return f"{self.prefix}:drain:{worker_id}"

    def api(self, reply_to: str) -> str:
        """Hash announcing one API process (host, pid, started, heartbeat), named by its `reply_to`; short TTL."""
        return f"{self.prefix}:api:{reply_to}"

    @property
    def apis(self) -> str:
        """Sorted set: `reply_to` of every API process heard within the last hour, scored by its last heartbeat
        (set past the TTL once it stops cleanly). A job whose API scores older than OVQ_API_TTL_S has nobody
        listening; one not in the set at all (an API without heartbeats) counts as listening."""
        return f"{self.prefix}:apis"
