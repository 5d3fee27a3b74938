"""Who a worker is and how it is doing: all that its heartbeat, reclaimer, probes and metrics read of it, so each
of them can be built (and tested) without a whole worker."""
from __future__ import annotations

from dataclasses import dataclass

from common.modelcard import ModelCard


@dataclass(frozen=True)
class Member:
    """A worker as Redis knows it: its consumer name, what it serves, the streams it reads, when it started."""

    id: str
    model: str
    device: str
    stream: str
    batch_stream: str
    started: float
    # Every priority level's stream, highest first ((level, stream) pairs, `common.jobs.LEVELS`); empty: the
    # interactive and batch streams alone.
    levels: tuple[tuple[str, str], ...] = ()

    @property
    def streams(self) -> tuple[str, ...]:
        """Interactive first (reclaim covers it first), then the other levels, batch last."""
        others = tuple(s for _, s in self.levels if s not in (self.stream, self.batch_stream))
        return self.stream, *others, self.batch_stream

    def level_of(self, stream: str) -> str:
        """The priority level of jobs read from `stream` (where they must be acked)."""
        if stream == self.batch_stream:
            return "batch"
        return next((level for level, s in self.levels if s == stream), "interactive")


@dataclass(frozen=True)
class Vitals:
    """A worker's state at one moment."""

    card: ModelCard
    capacity: int
    running: int
    draining: bool
    engine_alive: bool
    # The engine's last [requests, scheduled, KV cache %, prompt tokens waiting], where it reports them.
    engine: list[float] | None
    jobs_taken: int
    reclaimed: int
    tokens_generated: int
    engine_restarts: int
    # The API processes the running jobs answer to: the heartbeat asks whether they are still there.
    listeners: frozenset[str]
    port: int  # the probes' port; 0 without one
    redis_silent_s: float  # since the last heartbeat Redis took
    # Resumable, not background, jobs running: the heartbeat asks whether an API process still streams each.
    followed: frozenset[str] = frozenset()
    # A continuous-batching worker's learned knee (sequences) and the limit it admits to now (the knee within the
    # target ITL, probing included); 0 where there is none.
    admission_knee: int = 0
    admission_limit: int = 0
    # Prefix affinity (workers/queue/affinity.py): jobs it ran from its own affinity stream, and from others'.
    affinity_hits: int = 0
    affinity_steals: int = 0
    # The pool worker hosting it (workers/pool/); "" for a dedicated worker.
    pool: str = ""
    # "awake", "asleep" (its engine released: weights and KV cache), "waking" or "sleeping".
    state: str = "awake"
    woke_in_s: float | None = None  # the last wake's seconds (its engine started again)
    can_sleep: bool = False

    @property
    def kv_cache_usage(self) -> float:
        return self.engine[2] / 100 if self.engine else 0.0
