"""Every Redis key and channel name, in one place."""
from __future__ import annotations

from dataclasses import dataclass

GROUP = "workers"


@dataclass(frozen=True)
class Keys:
    """Key names. With `cluster` (Redis Cluster) keys carry hash tags so that what one script touches shares a slot:
    a model's queues, workers, card, stats, jobs' own keys and its jobs' event channels `{m:MODEL}`,
    a stored response and its background record `{r:ID}`, the whole Batch API `{PREFIX:batch}`; other keys are
    single-key and untagged. Without it names are unchanged."""
    prefix: str = "ovq"
    cluster: bool = False

    @staticmethod
    def _of(model: str) -> str:
        """`{m:MODEL}:` before a job's id in cluster mode: its keys then live in its model's slot. (Single-Redis
        names are built without calling this: no work added per key there.)"""
        if not model:
            raise ValueError("in cluster mode a job's keys need its model (they live in the model's slot)")
        return "{m:" + model + "}:"

    def _b(self) -> str:
        """The Batch API's part of a key in cluster mode: every Batch API and rq key in one slot."""
        return "{" + self.prefix + ":batch}:" if self.cluster else ""

    def jobs(self, model: str, device: str) -> str:
        """The queue of one model on one device (a stream with consumer group `workers`). An entry's `job` field is
        the job's JSON as `Job.to_json` writes it: its fields that are None left out."""
        return f"{self.prefix}:jobs:{{m:{model}}}:{device}" if self.cluster else f"{self.prefix}:jobs:{model}:{device}"

    def batch_jobs(self, model: str, device: str) -> str:
        """The lower-priority queue of one model on one device: Batch API lines (a stream with consumer group
        `workers`). Workers read it only when `jobs(model, device)` has nothing waiting."""
        if self.cluster:
            return f"{self.prefix}:batchjobs:{{m:{model}}}:{device}"
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
        if self.cluster:  # in its model's slot: the intake script reads every level at once
            return f"{self.prefix}:leveljobs:{level}:{{m:{model}}}:{device}"
        return f"{self.prefix}:leveljobs:{level}:{model}:{device}"

    def affinity_jobs(self, model: str, device: str, worker: str) -> str:
        """One worker's affinity stream (prefix affinity, issue 30; a stream with consumer group `workers`): the
        interactive jobs whose prompt prefix that worker served last. Created by its worker; entries XADDed by the API
        (api/queue/affinity.py), acked and deleted by whichever worker ran them (its owner, or one that stole them
        after OVQ_AFFINITY_STEAL_MS). TTL OVQ_JOB_TTL_S, renewed by its owner's heartbeats and by every XADD: a dead
        worker's stream outlives it no longer than its jobs could."""
        if self.cluster:
            return f"{self.prefix}:affjobs:{{m:{model}}}:{device}:{worker}"
        return f"{self.prefix}:affjobs:{model}:{device}:{worker}"

    def affinity_owners(self, model: str, device: str) -> str:
        """Sorted set: the workers of a model on a device that have an affinity stream, scored by their last
        heartbeat (unix s): where idle workers look for jobs to steal. Owner: those workers' heartbeats, which trim
        entries older than OVQ_JOB_TTL_S (their streams have expired by then) and give it that TTL."""
        if self.cluster:
            return f"{self.prefix}:affowners:{{m:{model}}}:{device}"
        return f"{self.prefix}:affowners:{model}:{device}"

    def affinity_draining(self, model: str, device: str) -> str:
        """Sorted set: the workers of a model on a device that are draining, scored by when they began (unix s): the
        API puts no affinity job in their streams (api/queue/affinity.py's ENQUEUE checks it in the same script).
        Owner: each such worker, which adds itself when it begins to drain (workers/queue/affinity.py's DRAIN) and
        trims entries older than OVQ_JOB_TTL_S; TTL OVQ_JOB_TTL_S."""
        if self.cluster:
            return f"{self.prefix}:affdraining:{{m:{model}}}:{device}"
        return f"{self.prefix}:affdraining:{model}:{device}"

    def prefix_owner(self, model: str, digest: str) -> str:
        """String: `DEVICE|WORKER`, the worker that last served a prompt with this prefix digest
        (api/queue/affinity.py computes the digests, the job carries them). Written by that worker when it starts the
        job; TTL OVQ_AFFINITY_TTL_S, renewed by every job that has the prefix."""
        if self.cluster:
            return f"{self.prefix}:prefix:{{m:{model}}}:{digest}"
        return f"{self.prefix}:prefix:{model}:{digest}"

    def awaiting(self, model: str, device: str) -> str:
        """Requests waiting for the first card of a model no worker has announced (a list of tokens, each removed
        when its wait ends; the key expires after the longest wait): what wakes a scaled-to-zero model's workers
        before any job of it can be queued (KEDA's `redis` scaler reads its length)."""
        if self.cluster:
            return f"{self.prefix}:awaiting:{{m:{model}}}:{device}"
        return f"{self.prefix}:awaiting:{model}:{device}"

    def events(self, reply_to: str, model: str = "") -> str:
        """Pub/sub channel a job's events go to (`reply_to` names the API process that waits for them).

        In cluster mode a job's events go to a channel of its API process in its model's slot, `{m:MODEL}`: the
        worker's publish then joins the rest of its step's writes (job hash, generated text, acks) on that master,
        in one round trip, and a Cluster's event traffic spreads over its masters by model instead of landing on
        whichever master an API process's one channel hashed to (that master carried about twice the others' CPU
        per job: `benchmarks/fleet_scale.py --redis cluster`). Without a model, the channel of API processes before
        that, `{a:REPLY_TO}`: API processes still listen there for workers not yet upgraded. One Redis: one channel
        per API process."""
        if not self.cluster:
            return f"{self.prefix}:ev:{reply_to}"
        return f"{self.prefix}:ev:{{m:{model}}}:{reply_to}" if model else f"{self.prefix}:ev:{{a:{reply_to}}}"

    def job(self, job_id: str, model: str = "") -> str:
        return f"{self.prefix}:job:{self._of(model)}{job_id}" if self.cluster else f"{self.prefix}:job:{job_id}"

    def cancel(self, job_id: str, model: str = "") -> str:
        return f"{self.prefix}:cancel:{self._of(model)}{job_id}" if self.cluster else f"{self.prefix}:cancel:{job_id}"

    @property
    def cancel_channel(self) -> str:
        return f"{self.prefix}:cancel"

    def model_cancel_channel(self, model: str) -> str:
        """The channel cancels of one model's jobs go to: `cancel_channel` on one Redis; per model, in its slot, on a
        Cluster (sharded pub/sub delivers a channel only on the node that owns its slot)."""
        return f"{self.prefix}:cancel:{{m:{model}}}" if self.cluster else self.cancel_channel

    def worker(self, worker_id: str) -> str:
        return f"{self.prefix}:worker:{worker_id}"

    def workers(self, model: str, device: str) -> str:
        """Sorted set of the ids of the workers serving a model on a device, scored by last heartbeat (unix s).
        Owner: those workers. Each beat prunes members 10 worker TTLs old and sets the set's TTL to that, so it
        goes once no worker of the model beats; a worker that stops removes itself."""
        if self.cluster:
            return f"{self.prefix}:workers:{{m:{model}}}:{device}"
        return f"{self.prefix}:workers:{model}:{device}"

    def pool(self, pool_id: str) -> str:
        """Hash announcing one pool worker (`ovq worker --pool`, workers/pool/): device, memory budget and use, the
        models it hosts (JSON: model, state, footprint, since), its swap counters and times. Owner: that pool, which
        refreshes it each tick with a TTL of OVQ_WORKER_TTL_S and deletes it when it stops."""
        return f"{self.prefix}:pool:{pool_id}"

    def pool_claim(self, model: str, device: str) -> str:
        """String: the id of the pool worker loading a model on a device, so that other pools load something else
        meanwhile. Owner: that pool, which sets it (NX) when its load begins, renews it each tick while it loads
        (TTL 60 s: a pool that dies mid-load holds it no longer) and deletes it once the model serves or failed."""
        if self.cluster:
            return f"{self.prefix}:poolclaim:{{m:{model}}}:{device}"
        return f"{self.prefix}:poolclaim:{model}:{device}"

    @property
    def pools(self) -> str:
        """Sorted set: the ids of pool workers, scored by their last tick (unix s). Owner: the pools, which trim
        entries older than ten worker TTLs and give it an hour's TTL on every tick."""
        return f"{self.prefix}:pools"

    def model(self, model: str) -> str:
        """Hash: device -> JSON model card, written by that device's workers."""
        return f"{self.prefix}:model:{{m:{model}}}" if self.cluster else f"{self.prefix}:model:{model}"

    def lora(self, model: str) -> str:
        """Hash: LoRA adapter name -> JSON {path, alpha} of the adapters loaded at run time onto a text model
        (`POST /v1/load_lora_adapter`). Owner: the admin endpoints; `/v1/unload_lora_adapter` deletes a field (the
        hash goes with its last one); capped at OVQ_MAX_LORA_ADAPTERS fields. No TTL: an adapter stays loaded until
        unloaded, across restarts. The model's workers read it every OVQ_LORA_POLL_S."""
        return f"{self.prefix}:lora:{{m:{model}}}" if self.cluster else f"{self.prefix}:lora:{model}"

    def lora_rebuild(self, model: str) -> str:
        """String: the id of the one worker of the model rebuilding its engine for a changed adapter set, so the
        model's workers do so one at a time (a rolling restart). TTL OVQ_LORA_REBUILD_LOCK_S; deleted by its
        holder when done."""
        if self.cluster:
            return f"{self.prefix}:lorarebuild:{{m:{model}}}"
        return f"{self.prefix}:lorarebuild:{model}"

    @property
    def models(self) -> str:
        """Sorted set: every model a worker has announced, scored by its last heartbeat (unix s); entries older
        than the card TTL are trimmed by the heartbeats, so retired models leave the list."""
        return f"{self.prefix}:models:seen"

    @property
    def config_generation(self) -> str:
        """Integer: the fleet's configuration reload generation. `POST /v1/config/reload` increments it; every API
        process, worker and `ovq serve` that sees it change re-reads its own models file at once (docs/how-to/
        reload.md). One key per prefix, never more: no TTL (losing it only makes each process re-read once)."""
        return f"{self.prefix}:config:generation"

    def reload_lock(self, model: str) -> str:
        """String (a worker id) with TTL: the one worker of a model restarting its engine for a changed models-file
        entry right now, so the model's workers restart one at a time (a rolling restart). Owner: that worker,
        which deletes it when its engine is back; the TTL (grace period + engine start timeout + 30 s) frees it
        if the worker dies meanwhile."""
        return f"{self.prefix}:reload:{{m:{model}}}" if self.cluster else f"{self.prefix}:reload:{model}"

    def blob(self, job_id: str, name: str, model: str = "") -> str:
        """Bytes a job needs or made (uploads, PNGs), with a short TTL: never in the stream or on pub/sub."""
        if self.cluster:
            return f"{self.prefix}:blob:{self._of(model)}{job_id}:{name}"
        return f"{self.prefix}:blob:{job_id}:{name}"

    @property
    def dead(self) -> str:
        """Stream of jobs that failed delivery too often or could not be read (capped: OVQ_MAX_DEAD_LETTERS)."""
        return f"{self.prefix}:dead"

    def stats(self, model: str, device: str, window: int) -> str:
        """Hash of one model on one device over one stats window starting at `window` (unix s): counters and
        latency histogram buckets that its workers HINCRBY (TTL OVQ_STATS_TTL_S). Fields: `common/ops/stats.py`."""
        if self.cluster:
            return f"{self.prefix}:stats:{{m:{model}}}:{device}:{window}"
        return f"{self.prefix}:stats:{model}:{device}:{window}"

    @property
    def failed(self) -> str:
        """List of the most recent failed jobs, newest first, JSON each (capped: OVQ_FAILED_JOBS_KEPT)."""
        return f"{self.prefix}:failed"

    def drain(self, worker_id: str) -> str:
        """String set by an operator (TTL): the worker reads it each heartbeat, stops taking jobs, finishes, exits."""
        return f"{self.prefix}:drain:{worker_id}"

    def steer(self, worker_id: str) -> str:
        """String set by an operator (`ovq worker sleep|wake ID`, the ops page), TTL 10 min: `sleep` or `wake`. The
        worker takes it (GETDEL) at its next heartbeat and acts on it."""
        return f"{self.prefix}:steer:{worker_id}"

    def api(self, reply_to: str) -> str:
        """Hash announcing one API process (host, pid, started, heartbeat), named by its `reply_to`; short TTL."""
        return f"{self.prefix}:api:{reply_to}"

    @property
    def apis(self) -> str:
        """Sorted set: `reply_to` of every API process heard within the last hour, scored by its last heartbeat
        (set past the TTL once it stops cleanly). A job whose API scores older than OVQ_API_TTL_S has nobody
        listening; one not in the set at all (an API without heartbeats) counts as listening."""
        return f"{self.prefix}:apis"

    def generated(self, job_id: str, model: str = "") -> str:
        """String: a streaming text job's token ids so far, packed records appended by its worker's publisher each
        time it sends text (`workers/text/progress.py`), so that another worker can continue the job if this one
        dies (OVQ_WORKER_TAKEOVER). Owned by the worker running the job: TTL OVQ_JOB_TTL_S from its first record,
        deleted when the job ends."""
        return f"{self.prefix}:gen:{self._of(model)}{job_id}" if self.cluster else f"{self.prefix}:gen:{job_id}"

    # ---- Responses API (api/openai/responses/store.py) ------------------------------------------------------
    def response(self, response_id: str) -> str:
        """Hash: a stored response (`store: true`): `response` (the object, JSON), `items` (its input items, then
        its output items, JSON), `inputs` (how many of those are input), `tokens` (each item's token count, JSON;
        absent where the API host had no tokenizer), `window` (the [id, tokens] of the newest responses before it
        through previous_response_id that a prompt could still hold, oldest first, JSON: at most the model's
        context's worth, at most 1,024), `depth` (how many responses are before it in all), `owner` (its tenant:
        common/owner.py; absent on one stored before owners were); one stored before windows has `chain` (every
        earlier id) instead of `window` and `depth`. Owned by the API's response store: written once when the
        response ends, with TTL OVQ_RESPONSES_TTL_S (renewed for the responses of its window when a turn chains
        onto it), at most OVQ_RESPONSES_MAX_BYTES; removed by `DELETE /responses/{id}`."""
        if self.cluster:  # beside its background record (Keys.background): deleted together
            return f"{self.prefix}:response:{{r:{response_id}}}"
        return f"{self.prefix}:response:{response_id}"

    def journal(self, job_id: str, model: str = "") -> str:
        """Stream: a resumable job's events, one entry per publish round trip (field `e`: that step's events of
        the job, as an `EventBatch`). Owner: the worker's publisher (workers/queue/publisher.py), which XADDs it in
        the same round trip as the PUBLISH, capped with MAXLEN ~ OVQ_JOURNAL_MAX_ENTRIES, TTL OVQ_JOURNAL_TTL_S
        (renewed every few hundred entries and by the last). Read by any API process (api/queue/journal.py)."""
        return f"{self.prefix}:journal:{self._of(model)}{job_id}" if self.cluster else f"{self.prefix}:journal:{job_id}"

    def reader(self, job_id: str, model: str = "") -> str:
        """String: the API process now streaming a resumable job to a client (its `reply_to`), TTL
        OVQ_RESUME_GRACE_S, set in the job's enqueue round trip and renewed by that stream while it lasts. A worker
        cancels a resumable (not background) job once this is gone: its client left and did not come back within
        the grace period."""
        return f"{self.prefix}:reader:{self._of(model)}{job_id}" if self.cluster else f"{self.prefix}:reader:{job_id}"

    def background(self, response_id: str) -> str:
        """Hash: a background response (`background: true`) as created: `request` (the body, JSON), `job`,
        `chain` and `depth` (the window of the chain it continues and its depth: Keys.response), `prompt`,
        `created_at`, `owner` (its tenant: common/owner.py), `tier`, `served` (the servable's model). Owner: the API
        (api/openai/responses/background.py); TTL
        OVQ_JOURNAL_TTL_S, the journal's: once the journal is gone, the stored response (Keys.response) says it."""
        if self.cluster:
            return f"{self.prefix}:bg:{{r:{response_id}}}"
        return f"{self.prefix}:bg:{response_id}"

    @property
    def backgrounds(self) -> str:
        """Sorted set: background response id -> created (unix s), for the ops page and `ovq jobs`. Trimmed by
        every creation of entries older than OVQ_JOURNAL_TTL_S; TTL the same."""
        return f"{self.prefix}:bgs"

    # ---- Conversations (api/openai/conversations/store.py) ----------------------------------------------------
    def _c(self, conversation_id: str) -> str:
        """A conversation's id, tagged `{c:ID}` in cluster mode: its three keys share a slot (its scripts touch all)."""
        return "{c:" + conversation_id + "}" if self.cluster else conversation_id

    def conversation(self, conversation_id: str) -> str:
        """Hash: a conversation: `created_at`, `metadata` (JSON), `owner` (its tenant: common/owner.py), `next` (the
        sequence number its next item takes), `bytes` (its items' total size, JSON). Owned by the API's conversation
        store with its items (Keys.conversation_items, Keys.conversation_order): all three written together, with
        TTL OVQ_CONVERSATIONS_TTL_S renewed by every write, and removed by `DELETE /conversations/{id}`."""
        return f"{self.prefix}:conv:{self._c(conversation_id)}"

    def conversation_items(self, conversation_id: str) -> str:
        """Hash: a conversation's items, item id -> the item (JSON). At most OVQ_CONVERSATION_MAX_ITEMS items and
        OVQ_CONVERSATION_MAX_BYTES bytes (plus one response's output); TTL and owner as Keys.conversation's."""
        return f"{self.prefix}:conv:{self._c(conversation_id)}:items"

    def conversation_order(self, conversation_id: str) -> str:
        """Sorted set: a conversation's item ids scored by their sequence number (their order in it): pages and a
        turn's history are ranges of it. Cap, TTL and owner as Keys.conversation_items's."""
        return f"{self.prefix}:conv:{self._c(conversation_id)}:order"

    # ---- Videos API (api/openai/videos/, workers/video/) --------------------------------------------------
    def video(self, video_id: str) -> str:
        """Hash: a video job as created and as last seen: `request` (JSON), `job`, `model`, `owner`, `created_at`,
        and once it ended `status`, `progress`, `completed_at`, `error`, `video`/`thumbnail` (its content's keys).
        Owner: the API (api/openai/videos/store.py), which deletes it on DELETE; TTL OVQ_VIDEO_TTL_S."""
        if self.cluster:
            return f"{self.prefix}:video:{{v:{video_id}}}"
        return f"{self.prefix}:video:{video_id}"

    def videos_of(self, owner: str) -> str:
        """Sorted set: one owner's video ids -> created (unix s), for `GET /videos`. Trimmed by every creation of
        entries older than OVQ_VIDEO_TTL_S; TTL the same; DELETE removes its id."""
        return f"{self.prefix}:videos:{owner}"

    def video_content(self, job_id: str, variant: str, model: str = "") -> str:
        """String: a video job's output (`video`: the MP4, `thumbnail`: a WebP of its first frame). Written by the
        video worker with the job's TTL (OVQ_VIDEO_TTL_S, at most OVQ_MAX_VIDEO_BYTES); deleted by the API on
        DELETE."""
        if self.cluster:
            return f"{self.prefix}:vc:{self._of(model)}{job_id}:{variant}"
        return f"{self.prefix}:vc:{job_id}:{variant}"

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
        return f"{self.prefix}:{self._b()}rq"

    @property
    def files(self) -> str:
        """Hash: file id -> the file's metadata (JSON, with its `owner` tenant: common/owner.py). Entries past their
        `expires_at` are trimmed by the file
        store on every listing and upload; a deleted file's entry is removed by the delete."""
        return f"{self.prefix}:{self._b()}files"

    def file_data(self, file_id: str) -> str:
        """List of a file's chunks (Redis storage), with the file's TTL; removed by a delete."""
        return f"{self.prefix}:{self._b()}file:{file_id}:data"

    def batch(self, batch_id: str) -> str:
        """Hash: a batch's fields, its `owner` tenant (common/owner.py) and `run_token` (what its lines are sent with
        to run as the owner's: api/batch/lines.py) among them. TTL: completion window + file TTL at creation, the file
        TTL once it ends."""
        return f"{self.prefix}:{self._b()}batch:{batch_id}"

    @property
    def batches(self) -> str:
        """Sorted set: batch id -> created_at, for listing. Entries whose batch hash expired are trimmed by the
        listing (and any older than the longest a batch can live)."""
        return f"{self.prefix}:{self._b()}batches"

    @property
    def active_batches(self) -> str:
        """Sorted set: ids of batches not yet ended -> created_at. The runner removes a batch when it ends; the
        sweeper (workers/batch/worker.py) removes entries whose batch hash is gone."""
        return f"{self.prefix}:{self._b()}batches:active"

    def batch_done(self, batch_id: str) -> str:
        """Hash: custom_id -> output line (JSON), the batch's checkpoint. Deleted by the runner once the output
        and error files are written; TTL as the batch hash's while it runs."""
        return f"{self.prefix}:{self._b()}batch:{batch_id}:done"

    def batch_lease(self, batch_id: str) -> str:
        """String: the token of the runner that holds the batch, with a short TTL its heartbeat renews."""
        return f"{self.prefix}:{self._b()}batch:{batch_id}:lease"

    def batch_requeue(self, batch_id: str) -> str:
        """String with a short TTL: one sweeper at a time re-enqueues an abandoned batch."""
        return f"{self.prefix}:{self._b()}batch:{batch_id}:requeue"

    def batch_stats(self, model: str) -> str:
        """Hash: lines done and failed for a model, counters for /metrics; TTL refreshed by every increment."""
        return f"{self.prefix}:{self._b()}batchstats:{model}"

    @property
    def batch_stats_models(self) -> str:
        """Sorted set: models with batch counters -> last increment (unix s); trimmed past the counters' TTL,
        which each increment gives it too."""
        return f"{self.prefix}:{self._b()}batchstats"

    # ---- Fair shares per tenant (common/fairness.py) ----------------------------------------------------------
    def fair_order(self, model: str, device: str, level: str) -> str:
        """Sorted set: the parked jobs of one model, device and priority level (`batch` too) that carry a
        tenant, member `ENTRY_ID|TENANT`, score the job's virtual start time: workers take the lowest first.
        Owners: the API's enqueue adds (with the stream entry), a worker's read pops, a withdraw removes; at most
        one member per entry of its stream (bounded by OVQ_MAX_QUEUE_DEPTH), so it needs no TTL."""
        if self.cluster:
            return f"{self.prefix}:fairorder:{level}:{{m:{model}}}:{device}"
        return f"{self.prefix}:fairorder:{level}:{model}:{device}"

    def fair_clock(self, model: str, device: str, level: str) -> str:
        """Hash: the fair-queueing state of one model, device and level: `v` (virtual time: the start time of the
        job last taken), `f:TENANT` (the virtual finish time of the tenant's last job), `n:TENANT` (its jobs parked
        now). Owners: the API's enqueue and a worker's read and job end; TTL OVQ_JOB_TTL_S from each enqueue; capped:
        past 4096 fields the enqueue drops the finish times already behind `v` (they mean nothing any more)."""
        if self.cluster:
            return f"{self.prefix}:fairclock:{level}:{{m:{model}}}:{device}"
        return f"{self.prefix}:fairclock:{level}:{model}:{device}"

    def fair_bell(self, model: str, device: str) -> str:
        """Stream, capped at 32 entries: rung by the API's enqueue when it parks a job, read (consumer group
        `workers`, NOACK) by an idle worker's blocking read so that it wakes for a parked job. Owner: the workers
        (they create its group); nothing else is kept in it."""
        if self.cluster:
            return f"{self.prefix}:fairbell:{{m:{model}}}:{device}"
        return f"{self.prefix}:fairbell:{model}:{device}"

    def quota(self, tenant: str) -> str:
        """Hash: a tenant's token bucket (`tokens`, `at`: ms), for its key's tokens_per_min. Owner: the API's
        enqueue (api/queue/quota.py); TTL two minutes from the last request (a full bucket needs no state)."""
        return f"{self.prefix}:quota:{tenant}"

    # ---- Webhooks (common/webhooks/, api/webhooks/delivery.py) -------------------------------------------------
    # On a Cluster every webhook key shares the Batch API's slot: a batch's end emits its event in the same script.

    @property
    def webhooks(self) -> str:
        """Stream, consumer group `workers` (read by every API process's deliverer): webhook events and their
        deliveries. An event (`e`: the payload, `t`: its tenant) is added by whoever ends what it tells of (a
        batch's end script, the API saving a background response); a deliverer replaces it by one entry per
        endpoint of the tenant (`u`: the URL, `n`: attempts so far, `f`: first attempt, unix ms), then acks and
        deletes each entry once delivered, given up, or moved to `webhook_retries`. An entry a dead API process
        held is claimed by another after OVQ_WEBHOOK_CLAIM_IDLE_S. Capped: MAXLEN ~ OVQ_WEBHOOK_MAX_EVENTS; TTL
        2 x OVQ_WEBHOOK_RETRY_FOR_S, renewed by every addition."""
        return f"{self.prefix}:{self._b()}webhooks"

    @property
    def webhook_retries(self) -> str:
        """Sorted set: deliveries waiting to be retried (member: the delivery's stream fields, JSON), scored by
        when they are due (unix ms). Owner: the deliverers, which move due ones back to `webhooks` in one script;
        a delivery is never older than OVQ_WEBHOOK_RETRY_FOR_S, so the set's TTL is 2 x that, renewed by every
        addition."""
        return f"{self.prefix}:{self._b()}webhooks:retries"

    def webhook_sent(self, source_id: str) -> str:
        """String: marks that the event of a background response (by its id) was emitted, so that of the API
        processes that see it end (its keeper, a reader, a retrieve) only the first emits it. TTL 2 x
        OVQ_JOURNAL_TTL_S (past its record's life nobody can see it end again)."""
        return f"{self.prefix}:{self._b()}webhooks:sent:{source_id}"

    @property
    def webhook_log(self) -> str:
        """List: the most recent delivery attempts and their outcomes, newest first, JSON each (for /ops and `ovq
        webhooks`). Capped: OVQ_WEBHOOK_LOG_KEPT (LTRIM with every push); TTL 2 x OVQ_WEBHOOK_RETRY_FOR_S."""
        return f"{self.prefix}:{self._b()}webhooks:log"

    @property
    def webhook_counts(self) -> str:
        """Hash: delivery outcomes counted since the key was made (`delivered`, `failed`: an attempt that failed,
        `gave_up`, `refused`: an address not allowed), for /ops and `ovq webhooks`. Owner: the deliverers; TTL 2 x
        OVQ_WEBHOOK_RETRY_FOR_S, renewed by every increment."""
        return f"{self.prefix}:{self._b()}webhooks:counts"
