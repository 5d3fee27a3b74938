"""What a worker tells operators about its jobs: counts per stats window, the recent-failures list, and (when
OVQ_LOG_JOBS is on) one log line per finished job. Added to the publisher's round trip, never one of its own.

Counts add up in memory and go out at most once per STATS_EVERY_S (and when the window turns, and at stop):
written with every engine step they were five of the eight or so commands of each round trip, and redis-py
spends about 25 µs of the worker's CPU on each command. Readers sum 10-second windows, so a second's delay
changes nothing they show."""
from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

import orjson

from common.keys import Keys
from common.ops.stats import OUTCOMES, observe, window_of
from common.redis.lane import Command
from common.settings import Settings

log = logging.getLogger("ovq.jobs")
STATS_EVERY_S = 1.0


class Accounting:
    def __init__(self, keys: Keys, model: str, device: str, worker_id: str, settings: Settings) -> None:
        self.keys, self.model, self.device, self.worker_id = keys, model, device, worker_id
        self.stats_ttl = settings.stats_ttl_s
        self.failed_kept = settings.failed_jobs_kept
        self.log_jobs = settings.log_jobs
        self.pending: Counter[str] = Counter()  # counted, not written yet
        self._window = 0  # the stats window `pending` counts into
        self._sending: Counter[str] | None = None  # in the round trip under way
        self._sent_at = 0.0

    def settle(self, status: dict[str, dict[str, Any]], stats: Counter[str]) -> list[bytes]:
        """Count the jobs that ended in this batch (into `stats`, then all of it into `pending`), log them; their
        failure records. Once per batch, however often its round trip is retried."""
        failures = []
        for job_id, values in status.items():
            outcome = values.get("status")
            if outcome not in OUTCOMES:
                continue
            stats[outcome] += 1
            if outcome == "done" and values.get("total_ms") is not None:
                observe(stats, "e2e", float(values["total_ms"]))
            if outcome == "error":
                failures.append(self._failure(job_id, values))
            if self.log_jobs:
                self._log(job_id, outcome, values)
        if stats:
            now = time.time()
            if not self.pending:
                self._window = window_of(now)
            self.pending.update(stats)
        return failures

    def due(self, now: float) -> bool:
        return bool(self.pending) and (now - self._sent_at >= STATS_EVERY_S or window_of(now) != self._window)

    def write(self, commands: list[Command], failures: list[bytes], everything: bool = False) -> None:
        """Add to the round trip's commands the pending counts, when due (or `everything`), and the failures."""
        now = time.time()
        if everything and self.pending or self.due(now):
            key = self.keys.stats(self.model, self.device, self._window)
            commands += [["HINCRBY", key, name, n] for name, n in self.pending.items()]
            commands.append(["EXPIRE", key, self.stats_ttl])
            self._sending, self.pending, self._sent_at = self.pending, Counter(), now
        if failures:
            commands += [["LPUSH", self.keys.failed, *failures], ["LTRIM", self.keys.failed, 0, self.failed_kept - 1],
                         ["EXPIRE", self.keys.failed, self.stats_ttl]]

    def written(self, ok: bool) -> None:
        """The round trip's outcome: counts it did not write are pending again."""
        if not ok and self._sending:
            self.pending.update(self._sending)
        self._sending = None

    def _failure(self, job_id: str, values: dict[str, Any]) -> bytes:
        error = values.get("error") or {}
        return orjson.dumps({"job": job_id, "model": self.model, "device": self.device, "worker": self.worker_id,
                             "time": time.time(), "message": error.get("message", ""),
                             "type": error.get("type", ""), "code": error.get("code")})

    def _log(self, job_id: str, outcome: str, values: dict[str, Any]) -> None:
        def ms(name: str) -> str:
            value = values.get(name)
            return "-" if value is None else f"{float(value):.0f}"

        log.info("job %s model=%s device=%s status=%s prompt_tokens=%s completion_tokens=%s queue_ms=%s "
                 "ttft_ms=%s total_ms=%s%s", job_id, self.model, self.device, outcome,
                 values.get("prompt_tokens", "-"), values.get("completion_tokens", "-"), ms("queue_ms"),
                 ms("ttft_ms"), ms("total_ms"),
                 f" error={(values.get('error') or {}).get('message', '')!r}" if outcome == "error" else "")
