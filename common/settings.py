"""One settings object for the CLI, the API and the workers (env `OVQ_*`, `REDIS_URL`)."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

# A list of keys from the environment: a JSON array, or comma-separated.
Keys = Annotated[list[SecretStr], NoDecode]
# A list of names from the environment: the same, not secret.
Names = Annotated[list[str], NoDecode]


def _default_cache_dir() -> Path:
    import os

    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ovq"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OVQ_", extra="ignore")

    # Where every tier finds Redis: redis://, rediss://, unix://, redis+sentinel://, redis+cluster://; unset: the
    # embedded one.
    redis_url: str | None = Field(
        default=None, validation_alias=AliasChoices("REDIS_URL", "OVQ_REDIS_URL")
    )
    # At start, how long a tier waits for Redis (retrying with backoff, one log line per attempt) before it exits.
    redis_wait_s: float = 60.0
    # Connections per process; a request that finds all busy waits up to redis_pool_timeout_s (then 503).
    redis_max_connections: int = 256
    # How long a request waits for a free connection of the pool before its 503.
    redis_pool_timeout_s: float = 5.0
    # A Redis command's socket timeout; also what the API's readiness allows Redis to answer in.
    redis_timeout_s: float = 5.0
    # An enqueue is acknowledged once this many replicas have it (WAIT, up to redis_wait_timeout_ms; only as many as
    # the primary has connected). Unset: 1 with a redis+sentinel:// REDIS_URL, else 0 (no WAIT).
    redis_wait_replicas: int | None = None
    # How long an enqueue's WAIT for replicas may take; a slower replica delays nobody further.
    redis_wait_timeout_ms: int = 500
    # Every Redis key and channel starts with this (deployments sharing one Redis use different ones).
    key_prefix: str = "ovq"
    # The models file (YAML or JSON); unset: the default model, or ovms_config.
    config: Path | None = None
    # An OVMS repository's config.json (or its directory), served as is; excludes `config`.
    ovms_config: Path | None = None
    # Every API process, worker and `ovq serve` checks the models file (or OVMS config.json) this often: its stat
    # (mtime, size, inode: a ConfigMap's symlink swap too), and the fleet's reload generation in Redis that
    # `POST /v1/config/reload` bumps. A change is applied without a restart (docs/how-to/reload.md); 0: never
    # (OVMS's --file_system_poll_wait_seconds 0).
    config_poll_s: float = Field(1.0, ge=0)
    # Where the embedded Redis keeps its data and `ovq models prepare` its models (`models/`).
    cache_dir: Path = Field(default_factory=_default_cache_dir)
    # The API's bind address; not loopback needs an API key (protected mode) or allow_unauthenticated.
    host: str = "127.0.0.1"
    # The API's HTTP port.
    port: int = 8000
    # debug, info, warning, error (OVMS's TRACE is debug).
    log_level: str = "info"
    # OpenTelemetry traces (common/tracing.py; the `tracing` extra): also on when OTEL_EXPORTER_OTLP_ENDPOINT is set.
    tracing: bool = False
    # API processes sharing the port (0: one per four cores, at least one).
    api_processes: int = 0
    # Idle keep-alive connections are closed after this long.
    keep_alive_s: int = 5

    # A worker's probe and metrics port (`/live`, `/ready`, `/metrics`); unset: none.
    worker_port: int | None = None
    # The address the worker's probe port binds to.
    worker_host: str = "0.0.0.0"
    # How often workers and API processes announce themselves in Redis.
    heartbeat_s: float = 1.0
    # A worker whose heartbeat is older than this is dead: its pending jobs may be reclaimed.
    worker_ttl_s: float = 5.0
    # A model's card outlives its last worker this long: its requests wait for a worker (queue_timeout_s), then
    # it is unknown (404) unless the models file or `models` names it (then requests wait for its next card).
    model_card_ttl_s: int = 600
    # A job's hash (status, timings, result) and its records live this long in Redis.
    job_ttl_s: int = 3600
    # A job's cancel flag lives this long.
    cancel_ttl_s: int = 3600
    # Uploaded images and generated PNGs live this long in Redis at most (the API deletes them once read).
    blob_ttl_s: int = 600
    # Largest upload /images/edits accepts (bytes), and the most pixels an uploaded image may decode to.
    max_upload_bytes: int = 20 * 1024 * 1024
    # The most pixels an uploaded or fetched image may decode to (read from its header first).
    max_upload_pixels: int = 4096 * 4096
    # /audio/transcriptions and /audio/translations: the largest upload (413 above it; OpenAI's limit) and the
    # longest audio (400): WhisperPipeline's binding copies the samples holding the GIL (1.8 s for 590 s of audio
    # on this project's CPU), which stalls the worker's heartbeat; keep it well inside OVQ_WORKER_TTL_S.
    # /audio/speech: the longest input text (OpenAI's limit).
    max_audio_bytes: int = 25 * 1024 * 1024
    # The longest audio upload (from its header, before decoding): 400 above it.
    max_audio_seconds: float = 600.0
    # /audio/speech: the longest input text (OpenAI's limit).
    max_speech_chars: int = 4096
    # Chat images (`image_url` parts): http(s) only from these exact hosts, files only under this directory.
    allowed_media_domains: list[str] = Field(default_factory=list)
    # Chat images given as local paths must resolve inside this directory; unset: none allowed.
    allowed_local_media_path: Path | None = None
    # The whole fetch of one http(s) image, connection to last byte.
    media_timeout_s: float = 10.0
    # Backlog (waiting + in flight) of one stream above which the API answers 429.
    max_queue_depth: int = 4096
    # A job delivered more often than this is poison and goes to the dead-letter stream.
    max_deliveries: int = 3
    # How often a worker looks for jobs that dead workers left pending.
    reclaim_interval_s: float = 5.0
    # The dead-letter stream keeps about this many entries (older ones are trimmed).
    max_dead_letters: int = 1000
    # An API process whose heartbeat is older than this is gone: its running jobs are cancelled, its queued skipped.
    api_ttl_s: float = 5.0
    # Per model and device, workers count tokens, outcomes and latencies in windows kept this long (ops page).
    stats_ttl_s: int = 900
    # How many recent failed jobs (with their error) are kept for the ops page.
    failed_jobs_kept: int = 100
    # Keep each job's generated text in its job hash (`text`) for OVQ_JOB_TTL_S; off: metadata and counts only.
    keep_job_text: bool = False
    # Workers log one line per finished job (id, model, status, tokens, queue ms, TTFT, total ms).
    log_jobs: bool = False
    # While a request runs: how often the API checks that the worker running it is alive, when no event came.
    first_event_check_s: float = 5.0
    # A request no worker has started this long after it arrived ends with a 503 (with Retry-After; its job leaves
    # the stream). It waits across restarts, and for a known model with no live worker (scaled to zero, starting).
    queue_timeout_s: float = 300.0
    # Every request's deadline unless it sends X-Request-Timeout (seconds): past it, a 504. None: no deadline.
    request_timeout_s: float | None = None
    # Streams: a worker sends a choice's new text at most once per this interval (text that comes sooner goes
    # with the next event, as one chunk); the first text and the end never wait. 0: an event per engine step.
    stream_interval_ms: float = 10.0
    # One JSON line per request on the `ovq.access` logger (status, model, tokens, TTFT, total time).
    access_log: bool = False
    # SIGTERM: how long running work may take to finish before a tier exits (workers hand the rest over).
    shutdown_grace_s: float = 30.0
    # An engine that has work and reports nothing (no step finished) for this long is killed and restarted.
    engine_watchdog_s: float = 120.0
    # How many jobs a continuous-batching worker takes: "knee" stops at the knee of its learned throughput curve
    # (and the model's target_itl_ms), leaving the rest in the stream for other workers; "greedy" takes whatever
    # its engine can schedule (the admission before the knee, for comparison).
    admission: Literal["knee", "greedy"] = "knee"
    # How long an engine may take to load its model and open its device.
    engine_start_timeout_s: float = 900.0
    # LoRA adapters loaded at run time (`POST /v1/load_lora_adapter`, docs/how-to/lora.md): at most this many per model.
    max_lora_adapters: int = 16
    # How often each text worker reads its model's runtime LoRA adapters (at once when a job names one it lacks).
    lora_poll_s: float = 2.0
    # A worker rebuilding its engine for changed adapters first lets its running jobs finish, for up to this long;
    # those still running then go on from their tokens on the rebuilt engine.
    lora_drain_s: float = 60.0
    # The longest one worker may hold its model's rebuild turn (the model's workers rebuild one at a time).
    lora_rebuild_lock_s: float = 300.0
    # Security (docs/how-to/tenants.md). API keys (`Authorization: Bearer KEY`) for every route but the health probes,
    # given inline or one per line in a file (OVMS's --api_key_file); admin keys for /metrics, /docs,
    # /openapi.json and /ops. With no admin key those routes are open only while no API key is configured either.
    api_keys: Keys = Field(default_factory=list)
    # A file of API keys: one per line (OVMS's format), or YAML/JSON (`*.yaml`, `*.yml`, `*.json`) with attributes.
    api_key_file: Path | None = None
    # Admin keys for /metrics, /docs, /openapi.json and /ops (Bearer or HTTP Basic password).
    admin_keys: Keys = Field(default_factory=list)
    # A file of admin keys, one per line.
    admin_key_file: Path | None = None
    # Protected mode: an API bound to an address other than loopback refuses to start without an API key, unless
    # this says an open API is meant (`--allow-unauthenticated`).
    allow_unauthenticated: bool = False
    # DNS-rebinding defence (api/http/hosts.py): an API bound to loopback answers only requests whose Host is a
    # loopback name (localhost, 127.0.0.1, [::1]) or one of these (a JSON array or comma-separated; `*`: any);
    # bound elsewhere, only these when any is set. Add the names a proxy or a container network reaches it by.
    allowed_hosts: Names = Field(default_factory=list)
    # Input limits, checked in the API before anything is queued (each a 4xx naming the field).
    max_body_bytes: int = 32 * 1024 * 1024  # 413; /images/edits takes up to 2 x max_upload_bytes + 1 MiB
    max_message_chars: int = 256_000  # characters in one message's content (text parts)
    max_prompt_chars: int = 512_000  # characters in all messages (or the completion prompt, or its token ids)
    max_stop_chars: int = 1_000  # characters in one stop string
    max_schema_bytes: int = 64 * 1024  # response_format's schema, and all tools together, as JSON
    max_echo_prompt_chars: int = 16_000  # completions with echo: the prompt comes back token by token
    # HTTP timeouts: a request's headers must arrive within header_timeout_s of its first byte (or of the
    # connection opening), its body within body_timeout_s; a client that reads nothing of an answer for
    # write_timeout_s is disconnected (its job cancelled).
    header_timeout_s: float = 10.0
    # A request's body must arrive within this of its headers.
    body_timeout_s: float = 60.0
    # A client that reads nothing of its answer this long is disconnected, its job cancelled.
    write_timeout_s: float = 60.0
    # Kernel send buffer per connection (SO_SNDBUF); 0: the system's own (Linux grows it up to 4 MB).
    send_buffer_bytes: int = 0
    # Models the API expects to be served (readiness); empty: those of the models file, else every announced one.
    models: list[str] = Field(default_factory=list)

    # A running text job whose worker dies is continued by another worker of its model, from the token ids it had
    # streamed (recorded in Redis with each event: `Keys.generated`); the API waits up to queue_timeout_s for one.
    # Off: no ids are recorded, and such a job ends with an error.
    worker_takeover: bool = True

    # ---- Files (/v1/files) and the Batch API (/v1/batches) -------------------------------------------------
    # Where file bytes live: `redis` (default; every tier reaches it) or `directory` (files_dir, a volume every
    # API process and batch worker mounts). Metadata is in Redis either way.
    files_backend: Literal["redis", "directory"] = "redis"
    # files_backend `directory`: the directory (a volume every API process and batch worker mounts).
    files_dir: Path | None = None
    # Files expire this long after upload unless deleted (OpenAI: 30 days for purpose `batch`).
    files_ttl_s: int = 30 * 24 * 3600
    # Largest single upload (OpenAI: 512 MB), and the most bytes all files may take in Redis storage together.
    files_max_bytes: int = 512 * 1000 * 1000
    # The most bytes all files may take in Redis storage together.
    files_redis_max_total_bytes: int = 2 * 1000 * 1000 * 1000
    # OpenAI's batch limits: requests and bytes per input file, metadata pairs, accepted completion windows.
    batch_max_requests: int = 50_000
    # The largest batch input file.
    batch_max_input_bytes: int = 200 * 1000 * 1000
    # The most metadata pairs a batch may carry.
    batch_max_metadata: int = 16
    # The completion windows a batch may ask for.
    batch_completion_windows: list[str] = Field(default_factory=lambda: ["24h"])
    # The API a batch worker sends each line to (any API process: it queues the line at batch priority; unset:
    # http://127.0.0.1:{port}), and the key it sends when API keys are on.
    batch_api_url: str | None = None
    # The bearer key a batch worker sends when API keys are on.
    batch_api_key: str | None = None
    # Lines of one batch in flight at once (the batch's share of its model's workers).
    batch_max_in_flight: int = 8
    # A line that has no answer after this long is an error line (`request_timeout`).
    batch_line_timeout_s: float = 600.0
    # A batch worker holds its batch with a lease it renews; a batch whose lease lapsed (its worker died) is
    # taken over by another batch worker, which checks for such batches every batch_sweep_s.
    batch_lease_s: float = 30.0
    # How often a batch worker looks for batches whose lease lapsed.
    batch_sweep_s: float = 10.0

    # ---- Embeddings and rerank workers ----------------------------------------------------------------------------
    # The token budget of one pipeline call: the jobs waiting are batched while (texts x longest text) stays within
    # it (one job always goes; 1 runs one call per request). A request's texts are never split across calls.
    embed_batch_tokens: int = Field(8192, ge=1)
    # Most inputs (texts, or documents) one embeddings or rerank request may carry (OpenAI allows 2048 inputs).
    embed_max_inputs: int = Field(2048, ge=1)

    # ---- Stored responses (/v1/responses with `store`, the default) ---------------------------------------------
    # A stored response lives this long after its last write; a turn chained onto it (previous_response_id) renews
    # the responses of the chain a prompt could still hold (its window), so a conversation in use keeps what its
    # prompts need. OpenAI keeps 30 days, on disk; ovq keeps
    # them in Redis memory, next to the queues, so a week: long enough for a conversation or an agent run that
    # pauses over days, short enough that abandoned ones do not pile up in memory.
    responses_ttl_s: int = 7 * 24 * 3600
    # The most one stored response may take (the object and its input and output items, as JSON). A request whose
    # input alone is over it is a 400 (send `store: false`); a response whose output takes it over is returned,
    # but not stored (its `store` says false).
    responses_max_bytes: int = 8 * 1024 * 1024
    # Scheduling (issue 26): a job of a level below the highest (not batch) that has waited this long is taken
    # before any higher-priority job, so it starts within about this bound however much high-priority work comes.
    priority_aging_s: float = 10.0
    # Fair shares per tenant (common/fairness.py): jobs that carry a tenant (the API key's, else the `user` field)
    # are taken in weighted fair order by tokens when a model's queue is contended. Off: first come, first served.
    fairness: bool = True

    # ---- Conversations (/v1/conversations; api/openai/conversations/) ---------------------------------------
    # A conversation (its metadata and items) lives this long after its last write: creating it, adding or deleting
    # items, updating its metadata, or a response with `conversation` appending its turn. OpenAI keeps conversations
    # until deleted; ovq keeps them in Redis memory beside the queues, so they expire when abandoned, as stored
    # responses do (responses_ttl_s).
    conversations_ttl_s: int = Field(7 * 24 * 3600, ge=1)
    # The most items one conversation may hold. `items.create` and a response with `conversation` that would take it
    # over are a 400 (`conversation_too_large`) before anything runs; a response's own output is appended whatever
    # (a turn that ran is never lost), so a conversation exceeds it by at most one response's output.
    conversation_max_items: int = Field(10_000, ge=1)
    # The most bytes one conversation's items may take (as JSON), with the same rule as conversation_max_items.
    # Every turn reads all of them: this also bounds a turn's Redis and API cost.
    conversation_max_bytes: int = Field(8 * 1024 * 1024, ge=1)

    # ---- Resumable jobs (background responses, streams sent with `X-Ovq-Resumable: true`) --------------------
    # Their workers also write each step's events to a per-job journal (Keys.journal): any API process can replay
    # it. It lives journal_ttl_s after its last renewal (renewed every few hundred steps and at the end) and holds at
    # most journal_max_entries steps (trimmed beyond: a resume from before then fails, and says why).
    journal_ttl_s: int = 3600
    # A journal holds at most this many steps (trimmed beyond: a resume from before then fails, saying why).
    journal_max_entries: int = 100_000
    # A resumable stream whose client is gone is cancelled this long after its last reader left: the client may
    # reconnect (with Last-Event-ID) to any API process until then.
    resume_grace_s: float = 30.0
    # A background response whose journal gains nothing for this long (no worker took it, or its events were lost
    # with a Redis that restarted) ends `failed` with that reason, instead of waiting forever.
    background_stall_s: float = 600.0

    # ---- Videos API (api/openai/videos/, workers/video/) ---------------------------------------------------------
    # A video job, its status and its content (MP4 and thumbnail, in Redis) live this long after its creation
    # (the Video object's `expires_at`).
    video_ttl_s: int = 86_400
    # The largest MP4 a video worker stores (bytes): a bigger one fails the job with that reason.
    max_video_bytes: int = 256 * 1024 * 1024
    # A video job whose journal gains nothing for this long ends `failed`: no worker took it, or its events were
    # lost with a Redis that restarted. Longer than background_stall_s: a video waits for a worker to load.
    video_stall_s: float = 3600.0

    # ---- Prefix affinity (issue 30; api/queue/affinity.py, workers/queue/affinity.py) ------------------------
    # On: an interactive text job whose prompt shares a prefix (or `prompt_cache_key` / X-Ovq-Session) with one a
    # live worker served lately waits in that worker's own stream, where its engine's prefix cache likely holds it.
    # `auto`: on for a model whose workers run with `enable_prefix_caching` (its card says `prefix_caching`), off for
    # the others (no cache to land on: affinity would only cost); `true` / `false`: on / off for every model.
    affinity: Literal["auto", "true", "false"] = "auto"
    # A job in a worker's affinity stream that has waited this long is taken by any worker with room and nothing
    # else to read (and a dead or draining worker's are taken so).
    affinity_steal_ms: int = 500  # measured: benchmarks/prefix.py --steal-ms 100,250,500,1000 (docs/benchmarks.md)
    # How long a worker's record of a served prefix lasts (renewed by each job with it).
    affinity_ttl_s: int = 600
    # A preferred worker with this many jobs already waiting in its affinity stream is passed over: the job goes to
    # the shared stream (load beats cache, as llm-d's and Dynamo's routers weigh it).
    affinity_max_waiting: int = 4
    # Characters per prefix block of the rendered prompt (the block grows x2 every 16 blocks: a long prompt has a
    # few dozen digests, not hundreds).
    affinity_block_chars: int = 256

    # ---- Webhooks (docs/how-to/webhooks.md): endpoints per key in the key file, delivered by every API process ----
    # One delivery attempt, connection to answer; a receiver slower than this is a failed attempt.
    webhook_timeout_s: float = 10.0
    # The first retry waits about this long, each next one twice as long (jittered: half to all of it), at most
    # webhook_backoff_max_s.
    webhook_backoff_s: float = 5.0
    # The longest wait between two attempts.
    webhook_backoff_max_s: float = 3600.0
    # An event not delivered this long after its first attempt is given up (counted and listed as such).
    webhook_retry_for_s: float = 24 * 3600.0
    # A delivery an API process took and has not finished for this long is taken over by another (its process
    # died); more than webhook_timeout_s. The receiver may then see the same webhook-id twice.
    webhook_claim_idle_s: float = 60.0
    # Deliveries one API process makes at once.
    webhook_max_in_flight: int = 16
    # Events and deliveries waiting in Redis at most (MAXLEN ~): the oldest beyond are dropped.
    webhook_max_events: int = 100_000
    # How many recent delivery attempts /ops and `ovq webhooks` show.
    webhook_log_kept: int = 200
    # SSRF defence: webhooks go only to public addresses (every address the host resolves to is checked, at
    # connect time). On: loopback, private, link-local and other non-public addresses are allowed too.
    webhook_allow_private: bool = False

    # A dedicated worker idle this long goes to sleep (its engine released, its process kept; a job wakes it, faster
    # than a cold start: docs/how-to/pool-workers.md); unset: never by itself (`ovq worker sleep ID` still does).
    worker_sleep_after_s: float | None = None

    # ---- Pool workers (`ovq worker --pool`, workers/pool/) ------------------------------------------------------
    # How long a pool worker keeps an idle model loaded (Ollama's `keep_alive`, which a request may set for itself:
    # seconds, or "5m"); negative: for good; 0: unloaded as soon as it is idle.
    model_keep_alive_s: float = 300.0
    # The memory a pool worker's resident models may take together (MiB), each estimated from its IR files' sizes
    # and its KV cache (`cache_size`) before it loads.
    pool_memory_mb: int = Field(4096, ge=1)
    # A model a pool worker loaded stays at least this long before another model's waiting work may swap it out.
    pool_min_residency_s: float = 10.0
    # A model whose oldest waiting job has waited this long (at most half of queue_timeout_s) is loaded first, even
    # if a model at work must be swapped out for it: the longest a pool lets a model's requests wait for a slot.
    pool_max_wait_s: float = 30.0

    @model_validator(mode="after")
    def _files_dir_for_directory_backend(self) -> Settings:
        if self.files_backend == "directory" and self.files_dir is None:
            raise ValueError("OVQ_FILES_BACKEND=directory needs OVQ_FILES_DIR (a volume every tier mounts)")
        return self

    @model_validator(mode="after")
    def _claim_after_timeout(self) -> Settings:
        """A delivery still being attempted must not look abandoned: it would be sent twice by live processes."""
        if self.webhook_claim_idle_s <= self.webhook_timeout_s:
            raise ValueError("OVQ_WEBHOOK_CLAIM_IDLE_S must exceed OVQ_WEBHOOK_TIMEOUT_S (a delivery under way would "
                             "be taken over)")
        return self

    @property
    def batch_api(self) -> str:
        return self.batch_api_url or f"http://127.0.0.1:{self.port}"

    @field_validator("affinity", mode="before")
    @classmethod
    def _affinity_words(cls, value: Any) -> Any:
        """OVQ_AFFINITY takes what a boolean setting takes (1/0, on/off, yes/no), and `auto`."""
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, str):
            word = value.strip().lower()
            return "true" if word in ("1", "on", "yes", "true") else "false" if word in ("0", "off", "no", "false") \
                else word
        return value

    def affinity_on(self, prefix_caching: bool) -> bool:
        """Whether prefix affinity applies to a model whose engines do (or do not) cache prefixes."""
        return self.affinity == "true" or (self.affinity == "auto" and prefix_caching)

    @field_validator("api_keys", "admin_keys", "allowed_hosts", mode="before")
    @classmethod
    def _key_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [key.strip() for key in text.split(",") if key.strip()]
        return value

    @property
    def models_dir(self) -> Path:
        return self.cache_dir / "models"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
