"""One settings object for the CLI, the API and the workers (env `OVQ_*`, `REDIS_URL`)."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_cache_dir() -> Path:
    import os

    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ovq"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OVQ_", extra="ignore")

    redis_url: str | None = Field(
        default=None, validation_alias=AliasChoices("REDIS_URL", "OVQ_REDIS_URL")
    )
    # At start, how long a tier waits for Redis (retrying with backoff, one log line per attempt) before it exits.
    redis_wait_s: float = 60.0
    # Connections per process; a request that finds all busy waits up to redis_pool_timeout_s (then 503).
    redis_max_connections: int = 256
    redis_pool_timeout_s: float = 5.0
    redis_timeout_s: float = 5.0
    key_prefix: str = "ovq"
    config: Path | None = None
    # An OVMS repository's config.json (or its directory), served as is; excludes `config`.
    ovms_config: Path | None = None
    cache_dir: Path = Field(default_factory=_default_cache_dir)
    host: str = "127.0.0.1"
    port: int = 8000
    log_level: str = "info"
    # API processes sharing the port (0: one per four cores, at least one).
    api_processes: int = 0
    # Idle keep-alive connections are closed after this long.
    keep_alive_s: int = 5

    # A worker's probe and metrics port (`/live`, `/ready`, `/metrics`); unset: none.
    worker_port: int | None = None
    worker_host: str = "0.0.0.0"
    heartbeat_s: float = 1.0
    # A worker whose heartbeat is older than this is dead: its pending jobs may be reclaimed.
    worker_ttl_s: float = 5.0
    # A model's card outlives its last worker this long: "not served right now" (503), then unknown (404).
    model_card_ttl_s: int = 600
    job_ttl_s: int = 3600
    cancel_ttl_s: int = 3600
    # Uploaded images and generated PNGs live this long in Redis at most (the API deletes them once read).
    blob_ttl_s: int = 600
    # Largest upload /images/edits accepts (bytes), and the most pixels an uploaded image may decode to.
    max_upload_bytes: int = 20 * 1024 * 1024
    max_upload_pixels: int = 4096 * 4096
    # Chat images (`image_url` parts): http(s) only from these exact hosts, files only under this directory.
    allowed_media_domains: list[str] = Field(default_factory=list)
    allowed_local_media_path: Path | None = None
    media_timeout_s: float = 10.0
    # Backlog (waiting + in flight) of one stream above which the API answers 429.
    max_queue_depth: int = 4096
    # A job delivered more often than this is poison and goes to the dead-letter stream.
    max_deliveries: int = 3
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
    # How long the API waits for a worker's first event before it checks the model is still served.
    first_event_check_s: float = 5.0
    shutdown_grace_s: float = 30.0
    # An engine that has work and reports nothing (no step finished) for this long is killed and restarted.
    engine_watchdog_s: float = 120.0
    # How long an engine may take to load its model and open its device.
    engine_start_timeout_s: float = 900.0
    # Models the API expects to be served (readiness); empty: those of the models file, else every announced one.
    models: list[str] = Field(default_factory=list)

    @property
    def models_dir(self) -> Path:
        return self.cache_dir / "models"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
