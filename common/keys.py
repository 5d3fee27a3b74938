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

    def batch_jobs(self, model: str, device: str) -> str:
        """The lower-priority queue of one model on one device: Batch API lines (a stream with consumer group
        `workers`). Workers read it only when `jobs(model, device)` has nothing waiting."""
        return f"{self.prefix}:batchjobs:{model}:{device}"

    def level_jobs(self, model: str, device: str, level: str) -> str:
        """The queue of one model on one device for one priority level (`common.jobs.LEVELS`; a stream with
        consumer group `workers`): `interactive` is `jobs`, `batch` is `batch_jobs`, the others have their own,
        created by the device's workers; read by them highest first, lower levels aged in (workers/queue/intake.py).
        Its entries are acked and deleted as `jobs`'s are."""
        if level == "interactive":
            return self.jobs(model, device)
        if level == "batch":
            return self.batch_jobs(model, device)
        return f"{self.prefix}:leveljobs:{level}:{model}:{device}"

    def awaiting(self, model: str, device: str) -> str:
        """Requests waiting for the first card of a model no worker has announced (a list of tokens, each removed
        when its wait ends; the key expires after the longest wait): what wakes a scaled-to-zero model's workers
        before any job of it can be queued (KEDA's `redis` scaler reads its length)."""
        return f"{self.prefix}:awaiting:{model}:{device}"

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
        latency histogram buckets that its workers HINCRBY (TTL OVQ_STATS_TTL_S). Fields: `common/ops/stats.py`."""
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

    # ---- Responses API (api/openai/responses/store.py) ------------------------------------------------------
    def response(self, response_id: str) -> str:
        """Hash: a stored response (`store: true`): `response` (the object, JSON), `items` (its input items, then
        its output items, JSON), `inputs` (how many of those are input), `chain` (the ids of the responses before
        it through previous_response_id, oldest first, JSON). Owned by the API's response store: written once when
        the response ends, with TTL OVQ_RESPONSES_TTL_S (renewed for a whole chain when a turn chains onto it),
        at most OVQ_RESPONSES_MAX_BYTES; removed by `DELETE /responses/{id}`."""
        return f"{self.prefix}:response:{response_id}"

    # ---- Batch API (common/batch/files.py, common/batch/store.py, workers/batch/runner.py) -------------
    @property
    def batch_queue(self) -> str:
        """The name of the rq queue batches wait in (its list is `{rq_prefix}:queue:{prefix}-batches`)."""
        return f"{self.prefix}-batches"

    @property
    def rq_prefix(self) -> str:
        """Every key and channel rq writes for the Batch API starts with this (rq's `RQ_KEY_PREFIX`, which
        common/batch/rq_keys.py sets before rq is imported). Owners and lifetimes, rq 3.0's names:
        - `:job:{id}` (hash): waiting, TTL = the longest a batch lives (`ttl` at enqueue); once it ends,
          `result_ttl` (1 day) or `failure_ttl` (7 days), all set by common/batch/store.py's BatchQueue.
          `:results:{id}` (stream, 10 entries at most): the same TTLs.
        - `:queue:{name}` (list), `:queue:{name}:intermediate` (list): job ids, popped by rq's workers;
          `:queues` (set): one member per queue. Owner: rq.
        - `:wip:`, `:finished:`, `:failed:`, `:deferred:`, `:scheduled:`, `:canceled:{name}` (sorted sets scored by
          expiry): trimmed by rq workers' registry cleaning, whose lock `:clean_registries:{name}` has a TTL.
        - `:execution:{job}:{id}` (hash), `:executions:{job}` (sorted set), `:worker:{name}:executions` (set):
          TTL = rq's heartbeat TTL, renewed while the job runs.
        - `:worker:{name}` (hash): TTL renewed by the worker's heartbeats, deleted when it stops;
          `:workers`, `:workers:{queue}` (sets): pruned of dead workers by rq's cleaning.
        - `:scheduler:{queue}`, `:scheduler-lock:{queue}`, `:suspended`, `:pubsub:{worker}` (channel): rq's
          scheduler (unused by ovq: no job is scheduled), `rq suspend`, `rq`'s commands to a worker."""
        return f"{self.prefix}:rq"

    @property
    def files(self) -> str:
        """Hash: file id -> the file's metadata (JSON). Entries past their `expires_at` are trimmed by the file
        store on every listing and upload; a deleted file's entry is removed by the delete."""
        return f"{self.prefix}:files"

    def file_data(self, file_id: str) -> str:
        """List of a file's chunks (Redis storage), with the file's TTL; removed by a delete."""
        return f"{self.prefix}:file:{file_id}:data"

    def batch(self, batch_id: str) -> str:
        """Hash: a batch's fields. TTL: completion window + file TTL at creation, the file TTL once it ends."""
        return f"{self.prefix}:batch:{batch_id}"

    @property
    def batches(self) -> str:
        """Sorted set: batch id -> created_at, for listing. Entries whose batch hash expired are trimmed by the
        listing (and any older than the longest a batch can live)."""
        return f"{self.prefix}:batches"

    @property
    def active_batches(self) -> str:
        """Sorted set: ids of batches not yet ended -> created_at. The runner removes a batch when it ends; the
        sweeper (workers/batch/worker.py) removes entries whose batch hash is gone."""
        return f"{self.prefix}:batches:active"

    def batch_done(self, batch_id: str) -> str:
        """Hash: custom_id -> output line (JSON), the batch's checkpoint. Deleted by the runner once the output
        and error files are written; TTL as the batch hash's while it runs."""
        return f"{self.prefix}:batch:{batch_id}:done"

    def batch_lease(self, batch_id: str) -> str:
        """String: the token of the runner that holds the batch, with a short TTL its heartbeat renews."""
        return f"{self.prefix}:batch:{batch_id}:lease"

    def batch_requeue(self, batch_id: str) -> str:
        """String with a short TTL: one sweeper at a time re-enqueues an abandoned batch."""
        return f"{self.prefix}:batch:{batch_id}:requeue"

    def batch_stats(self, model: str) -> str:
        """Hash: lines done and failed for a model, counters for /metrics; TTL refreshed by every increment."""
        return f"{self.prefix}:batchstats:{model}"

    @property
    def batch_stats_models(self) -> str:
        """Sorted set: models with batch counters -> last increment (unix s); trimmed past the counters' TTL,
        which each increment gives it too."""
        return f"{self.prefix}:batchstats"
