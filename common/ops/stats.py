"""Time-bucketed generation stats in Redis: what workers write and how readers (ops page, `ovq status`) sum them.

Each worker counts in memory and adds its counts, at most once a second (`workers/queue/accounting.py`), to one hash
per model, device and window of WINDOW_S seconds (`Keys.stats`), so the numbers are the sum over every worker
and every API process reads the same. Fields:

- `tokens`, `prompt_tokens`: tokens generated / prompts accepted;
- `done`, `error`, `cancelled`: jobs that ended so;
- `refused:{reason}` for reason in REFUSALS: requests the API refused before a worker saw them (written by the API
  processes, api/ops/refusals.py, into the stats of the model's first device);
- `{histogram}:{bound}` for bound in BOUNDS[histogram] (milliseconds, upper bound inclusive) and `{histogram}:inf`:
  how many observations fell into each bucket (not cumulative), plus `{histogram}:sum` in ms.
"""
from __future__ import annotations

import time
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable

import redis.asyncio as aioredis
from pydantic import BaseModel

from common.keys import Keys

WINDOW_S = 10
OUTCOMES = ("done", "error", "cancelled")
REFUSALS = ("deadline", "quota", "queue_full")
# Bucket upper bounds in milliseconds: TTFT and queue time from enqueue, inter-token latency between the
# deliveries of a sequence's tokens (a step that yields k tokens counts k gaps of 1/k each), e2e enqueue to end.
# Narrow where latencies of a served model sit (ITL 2.5 ms wide from 10 to 20 ms, so 12 ms reads as 10-12.5 ms;
# TTFT 5-25 ms wide below 100 ms), wide above; the API's Prometheus histograms use the same bounds.
BOUNDS: dict[str, tuple[float, ...]] = {
    "ttft": (5, 10, 20, 35, 50, 75, 100, 150, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000),
    "itl": (2, 4, 6, 8, 10, 12.5, 15, 17.5, 20, 25, 30, 40, 50, 75, 100, 200, 500, 1000, 2500),
    "queue": (1, 5, 10, 50, 100, 500, 1000, 5000, 10000, 30000, 60000),
    "e2e": (100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 120000, 300000),
}
_FIELDS = {name: [f"{name}:{b:g}" for b in bounds] + [f"{name}:inf"] for name, bounds in BOUNDS.items()}
_SUMS = {name: f"{name}:sum" for name in BOUNDS}


def window_of(t: float) -> int:
    return int(t // WINDOW_S) * WINDOW_S


def bucket(histogram: str, ms: float) -> str:
    """The field an observation of `ms` milliseconds is counted in."""
    return _FIELDS[histogram][bisect_left(BOUNDS[histogram], ms)]


def observe(counts: Counter[str], histogram: str, ms: float, n: int = 1) -> None:
    """Count `n` observations of `ms` (on the worker's per-step path: a bisect and two additions)."""
    counts[_FIELDS[histogram][bisect_left(BOUNDS[histogram], ms)]] += n
    counts[_SUMS[histogram]] += int(ms * n + 0.5)


def quantile(counts: dict[str, int], histogram: str, q: float) -> float | None:
    """The q-quantile in ms, interpolated within its bucket as Prometheus' histogram_quantile does (the highest
    finite bound when it falls in the open last bucket); None without observations."""
    bounds = BOUNDS[histogram]
    per_bucket = [counts.get(f, 0) for f in _FIELDS[histogram]]
    total = sum(per_bucket)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(per_bucket):
        if n and seen + n >= rank:
            if i == len(bounds):
                return float(bounds[-1])
            low = bounds[i - 1] if i else 0.0
            return low + (bounds[i] - low) * (rank - seen) / n
        seen += n
    return float(bounds[-1])


class Point(BaseModel):
    t: int  # window start, unix s
    tokens_per_s: float
    requests_per_s: float


class Summary(BaseModel):
    """One model on one device over the last `span_s` seconds."""

    span_s: int
    tokens_per_s: float  # over the last minute
    requests_per_s: float
    tokens: int
    prompt_tokens: int
    done: int
    error: int
    cancelled: int
    refused: dict[str, int] = {}  # by reason (REFUSALS)
    ttft_ms: dict[str, float | None]  # p50, p90, p99
    itl_ms: dict[str, float | None]
    queue_ms: dict[str, float | None]
    e2e_ms: dict[str, float | None]
    series: list[Point]  # one per window, oldest first


QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
RATE_SPAN_S = 60  # the rates: the last minute
SPAN_S = 300  # the counts, latencies and the chart's points: the last 5 minutes


def summarize(windows: Iterable[tuple[int, dict[str, int]]], now: float, span_s: int) -> Summary:
    """Sum the windows of the span; rates per second of each window (the current one over its elapsed part)."""
    current = window_of(now)
    by_start = dict(windows)
    total: Counter[str] = Counter()
    series = []
    recent: Counter[str] = Counter()
    for start in range(current - span_s + WINDOW_S, current + WINDOW_S, WINDOW_S):
        counts = by_start.get(start, {})
        total.update(counts)
        seconds = max(now - start, 1.0) if start == current else WINDOW_S
        finished = sum(counts.get(o, 0) for o in OUTCOMES)
        series.append(Point(t=start, tokens_per_s=counts.get("tokens", 0) / seconds,
                            requests_per_s=finished / seconds))
        if start > current - RATE_SPAN_S:
            recent.update(counts)
    # The last minute: the complete windows of it and the current one as far as it has gone.
    seconds = RATE_SPAN_S - WINDOW_S + max(now - current, 1.0)
    return Summary(
        span_s=span_s,
        tokens_per_s=recent["tokens"] / seconds,
        requests_per_s=sum(recent[o] for o in OUTCOMES) / seconds,
        tokens=total["tokens"], prompt_tokens=total["prompt_tokens"],
        done=total["done"], error=total["error"], cancelled=total["cancelled"],
        refused={reason: total[f"refused:{reason}"] for reason in REFUSALS},
        **{f"{h}_ms": {name: quantile(total, h, q) for name, q in QUANTILES.items()} for h in BOUNDS},
        series=series,
    )


async def read(redis: aioredis.Redis, keys: Keys, streams: list[tuple[str, str]], span_s: int = SPAN_S,
               now: float | None = None) -> dict[tuple[str, str], Summary]:
    """The summaries of several (model, device) streams, in one round trip."""
    now = time.time() if now is None else now
    starts = range(window_of(now) - span_s + WINDOW_S, window_of(now) + WINDOW_S, WINDOW_S)
    pipe = redis.pipeline(transaction=False)
    for model, device in streams:
        for start in starts:
            pipe.hgetall(keys.stats(model, device, start))
    replies = iter(await pipe.execute())
    summaries = {}
    for stream in streams:
        windows = [(start, {k.decode(): int(v) for k, v in next(replies).items()}) for start in starts]
        summaries[stream] = summarize(windows, now, span_s)
    return summaries
