"""What the chaos run proves, from its records alone (records.Run): for every request, exactly one terminal outcome
reached its client, what it received is what the server recorded, no event number twice or missing, greedy text
equal to its reference where that is sound; every error a documented clean one during a fault; no 5xx but 503; no
Redis key leaked and no idle worker holding KV cache. `check` returns a Report; `Report.failed` decides the exit
code."""
from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field

from .records import BACKGROUND, BATCH, CHAT, EMBEDDING, KINDS, STREAM, Fault, RedisState, Request, Run

EFFECT_S = 30.0  # a fault's effects outlast its recovery (a takeover after the TTL, clients backing off)
CLEAN_CODES = {"service_unavailable", "worker_died", "engine_crashed", "deadline_exceeded"}
# A stream whose journal's last events did not reach the replica before it was promoted (replication is
# asynchronous): a clean error, but only a failover answers with it.
FAILOVER_CODES = {"events_lost"}
TAKEOVER_FAULTS = {"worker kill", "partition", "oom"}
LLM_KINDS = {STREAM, CHAT, BACKGROUND, BATCH}
MIN_COSINE = 0.999  # embeddings: the same text in another batch rounds a little differently
KV_IDLE = 0.0
QUEUE = re.compile(r":(jobs|batchjobs|leveljobs|affjobs):")  # job streams: empty again once every job is acked


@dataclass
class Report:
    requests: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)
    hung: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    unclean: list[str] = field(default_factory=list)  # errors that are not a documented answer to a fault
    server_errors: list[str] = field(default_factory=list)  # 5xx other than 503
    leaked_keys: dict[str, int] = field(default_factory=dict)
    memory: tuple[int, int] = (0, 0)  # used_memory at the baseline and after
    keys: tuple[int, int] = (0, 0)  # how many keys at the baseline and after
    kv_busy: dict[str, float] = field(default_factory=dict)
    greedy_compared: int = 0
    continued: int = 0  # solo streams a worker fault hit: compared up to the takeover point
    flipped: int = 0  # of those, how many differ from the reference after it
    ttft_fault: list[float] = field(default_factory=list)
    ttft_calm: list[float] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return bool(self.lost or self.hung or self.duplicated or self.mismatched or self.unclean
                    or self.server_errors or self.leaked_keys or self.kv_busy or self.memory_leaked)

    @property
    def memory_leaked(self) -> bool:
        baseline, after = self.memory
        return after > baseline * 1.10 + (1 << 20)


def windows(faults: list[Fault], kinds: set[str] | None = None) -> list[tuple[float, float]]:
    return [(f.began, (f.ended or f.began) + EFFECT_S) for f in faults if kinds is None or f.kind in kinds]


def _overlaps(start: float, end: float, spans: list[tuple[float, float]]) -> bool:
    return any(start < b and a < end for a, b in spans)


def _end(request: Request, run: Run) -> float:
    """When it ended: its terminal outcome, else its last lost connection (the client gave up), else the run's end."""
    if request.ended is not None:
        return request.ended
    if request.transport_errors:
        return float(request.transport_errors[-1].split()[0])
    return run.finished


def _api_killed(request: Request, run: Run) -> bool:
    api = run.apis.get(request.api, request.api)
    kills = [f for f in run.faults if f.kind == "api kill" and f.target == api]
    return _overlaps(request.sent, _end(request, run), windows(kills))


def _terminal(request: Request, run: Run, report: Report) -> None:
    """Exactly one terminal outcome; none only where its API died under a request that cannot be resumed."""
    name = f"{request.kind} {request.key}"
    if len(request.terminals) > 1:
        report.duplicated.append(f"{name}: {len(request.terminals)} terminal outcomes {request.terminals}")
    elif request.terminals:
        report.outcomes[request.terminals[0].split(":")[0] if request.terminals[0].startswith("done") else
                        request.terminals[0]] += 1
    elif request.transport_errors and not request.events and _api_killed(request, run):
        report.outcomes["connection lost with its API (documented)"] += 1
    elif request.transport_errors or request.kind == BATCH:
        report.lost.append(f"{name}: no terminal outcome ({request.transport_errors or 'not in the batch files'})")
    else:
        report.hung.append(f"{name}: no terminal outcome by the end of the run")


def _clean(request: Request, run: Run, report: Report) -> None:
    """An error is a documented answer to a fault: 503, or a clean error code, while a fault's effects last."""
    for status in request.statuses:
        if status >= 500 and status != 503:
            report.server_errors.append(f"{request.kind} {request.key}: HTTP {status}")
    for outcome in request.terminals:
        if outcome.startswith("done") or outcome in ("completed", "incomplete"):
            continue
        line_status = re.match(r"error:(\d{3}):", outcome)  # a batch line's answer in the error file
        if line_status and int(line_status[1]) >= 500 and int(line_status[1]) != 503:
            report.server_errors.append(f"{request.kind} {request.key}: HTTP {line_status[1]} in the batch files")
        code = outcome.split(":")[-1]
        clean = outcome.startswith("http:503") or code in CLEAN_CODES or outcome == "failed"
        spans = windows(run.faults)
        if code in FAILOVER_CODES:
            clean, spans = True, windows(run.faults, {"redis failover"})
        if not clean or not _overlaps(request.sent, _end(request, run), spans):
            report.unclean.append(f"{request.kind} {request.key}: {outcome}")


def _numbers(request: Request, report: Report) -> None:
    """Event numbers: none twice, none missing (streams count from 1, background responses from 0)."""
    if not request.events:
        return
    name = f"{request.kind} {request.key}"
    twice = [n for n, count in Counter(request.events).items() if count > 1]
    if twice:
        report.duplicated.append(f"{name}: event numbers received twice {twice[:5]}")
    if request.journal is not None:  # a stream: every journaled event that makes a frame, and nothing else
        # Up to the last it received: one ended by a clean error (a failover) does not get the rest its job made.
        missing = sorted({n for n, framed in request.journal if framed and n <= max(request.events)}
                         - set(request.events))
        extra = sorted(set(request.events) - {n for n, _ in request.journal})
        if extra:
            report.mismatched.append(f"{name}: event numbers the server never journaled {extra[:5]}")
    else:  # background responses number every event from 0 (streams whose journal was not read: from 1)
        first = 0 if request.kind == BACKGROUND else 1
        missing = sorted(set(range(first, max(request.events) + 1)) - set(request.events))
    if missing:
        report.lost.append(f"{name}: event numbers missing {missing[:5]}")
    elif not twice and request.events != sorted(request.events):
        report.mismatched.append(f"{name}: events out of order")


def _recorded(request: Request, report: Report) -> None:
    """What the client received equals what the server recorded as its output."""
    if not request.terminals or request.kind == EMBEDDING:
        return
    if not (request.terminals[0].startswith("done") or request.terminals[0] in ("completed", "incomplete")):
        return
    name = f"{request.kind} {request.key}"
    if request.server_text is None:
        report.mismatched.append(f"{name}: the server has no record of its output (job {request.job or '?'})")
    elif request.server_text != request.text:
        report.mismatched.append(f"{name}: received {request.text[:60]!r}, the server recorded "
                                 f"{request.server_text[:60]!r}")


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)) or 1.0)


def _alone(request: Request, run: Run) -> bool:
    """Nothing else of the workload ran on the LLM workers meanwhile (a batch of one rounds as its reference did)."""
    end = _end(request, run)
    return not any(other is not request and other.kind in LLM_KINDS and other.sent < end
                   and request.sent < _end(other, run) for other in run.requests)


def _greedy(request: Request, run: Run, report: Report) -> None:
    """A stream that ran alone equals its reference; if a worker fault hit it, up to the takeover point."""
    if request.kind == EMBEDDING:
        if request.vector is not None and request.reference_vector is not None \
                and _cosine(request.vector, request.reference_vector) < MIN_COSINE:
            report.mismatched.append(f"embedding {request.key}: not the text's embedding")
        return
    if request.reference is None or not request.terminals or not request.terminals[0].startswith("done") \
            or not _alone(request, run):
        return
    report.greedy_compared += 1
    hits = [f for f in run.faults if f.kind in TAKEOVER_FAULTS
            and _overlaps(request.sent, _end(request, run), windows([f]))]
    if not hits:
        if request.text != request.reference:
            report.mismatched.append(f"stream {request.key}: greedy text differs from its reference alone: "
                                     f"{request.text[:60]!r} vs {request.reference[:60]!r}")
        return
    report.continued += 1
    before = request.text_before(min(f.began for f in hits))
    if not request.reference.startswith(before):
        report.mismatched.append(f"stream {request.key}: differs from its reference before the takeover point")
    elif request.text != request.reference:
        report.flipped += 1


def _ttft(request: Request, run: Run, report: Report) -> None:
    """Time to the first token of the streamed kinds (a unary answer's first token is not seen)."""
    if request.first is None or request.kind not in (STREAM, BACKGROUND):
        return
    during = _overlaps(request.sent, request.first, windows(run.faults))
    (report.ttft_fault if during else report.ttft_calm).append(request.first - request.sent)


def pattern(key: str, keep: set[str]) -> str:
    """A key with its ids starred (`ovq:job:3f2a...` -> `ovq:job:*`); model names and fixed words stay."""
    return ":".join(p if p in keep or not re.search(r"\d", p) or len(p) < 8 else "*" for p in key.split(":"))


def leaks(baseline: RedisState, after: RedisState, keep: set[str]) -> dict[str, int]:
    """Keys with no TTL the run left (counted by pattern), and job queues longer than at the baseline."""
    found: Counter[str] = Counter(pattern(key, keep) for key, ttl in after.keys.items()
                                  if ttl < 0 and key not in baseline.keys)
    for key, length in after.streams.items():  # the queues: capped streams (ovq:fairbell:*) fill to their cap
        if QUEUE.search(key) and length > baseline.streams.get(key, 0):
            found[f"{key} (stream: {length} entries, {baseline.streams.get(key, 0)} at the baseline)"] += 1
    return dict(found)


def check(run: Run, keep: set[str] = frozenset()) -> Report:  # type: ignore[assignment]
    report = Report(requests=Counter(r.kind for r in run.requests), faults=Counter(f.kind for f in run.faults))
    for request in run.requests:
        for rule in (_terminal, _clean):
            rule(request, run, report)
        _numbers(request, report)
        _recorded(request, report)
        _greedy(request, run, report)
        _ttft(request, run, report)
    for status in run.harness_statuses:
        if status >= 500 and status != 503:
            report.server_errors.append(f"a harness call: HTTP {status}")
    if run.baseline and run.after:
        report.leaked_keys = leaks(run.baseline, run.after, set(keep))
        report.memory = (run.baseline.used_memory, run.after.used_memory)
        report.keys = (len(run.baseline.keys), len(run.after.keys))
    report.kv_busy = {w: u for w, u in run.kv_usage.items() if u > KV_IDLE}
    return report


__all__ = ["KINDS", "Report", "check", "leaks", "pattern", "windows"]
