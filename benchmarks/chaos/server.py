"""What the server recorded, read back after the run: each job's text (`OVQ_KEEP_JOB_TEXT`, in its hash), each
background response as stored; Redis's keys, their TTLs and its memory; each idle worker's KV-cache usage."""
from __future__ import annotations

import re
import time

import redis

from common.events import ACCEPTED, DELTA, DONE, ERROR, read_batch
from common.jobs import JobHash
from common.keys import Keys

from . import client
from .client import Client
from .faults import primary
from .fleet import Fleet, podman
from .records import BACKGROUND, EMBEDDING, STREAM, RedisState, Request

KEYS = Keys("ovq")
KV_METRIC = re.compile(r"^ovq_worker_kv_cache_usage_ratio(?:\{[^}]*\})? ([0-9.e+-]+)$", re.M)
IDLE_BOUND_S = 120.0


def connect(fleet: Fleet) -> redis.Redis:
    return redis.Redis(port=fleet.redis_ports[primary(fleet)], socket_timeout=10)


def snapshot(r: redis.Redis) -> RedisState:
    keys = [k.decode() for k in r.scan_iter(count=1000)]
    pipe = r.pipeline(transaction=False)
    for key in keys:
        pipe.ttl(key)
        pipe.type(key)
    answers = pipe.execute()
    ttls = dict(zip(keys, answers[0::2], strict=True))
    streams = [k for k, t in zip(keys, answers[1::2], strict=True) if t == b"stream"]
    pipe = r.pipeline(transaction=False)
    for key in streams:
        pipe.xlen(key)
    return RedisState(ttls, int(r.info("memory")["used_memory"]), dict(zip(streams, pipe.execute(), strict=True)))


def expire_run_keys(r: redis.Redis, baseline: RedisState) -> int:
    """Delete the keys with a TTL made since the baseline (job hashes, journals, stored responses, heartbeats of
    restarted tiers): each expires by itself within its TTL, and deleting them stands in for waiting that long.
    Keys with no TTL stay: they are what the leak check looks for."""
    doomed = [k for k, ttl in snapshot(r).keys.items() if ttl > 0 and k not in baseline.keys]
    for start in range(0, len(doomed), 500):
        r.delete(*doomed[start:start + 500])
    return len(doomed)


def read_back(r: redis.Redis, requests: list[Request], settled_s: float = 0.0) -> int:
    """The server's records (`job_texts`, `journals`) of the requests that ended at least `settled_s` ago and were
    not read back yet: read as the run goes, before their records expire (OVQ_JOB_TTL_S, 1 h by default: a long
    run's first requests had none left at its end). Returns how many it read; raises what Redis does."""
    now = time.time()
    due = [q for q in requests if q.read_back is None and q.ended is not None and now - q.ended >= settled_s]
    job_texts(r, due)
    journals(r, due)
    for request in due:
        request.read_back = now
    return len(due)


def job_texts(r: redis.Redis, requests: list[Request]) -> None:
    jobs = [q for q in requests if q.job and q.kind not in (BACKGROUND, EMBEDDING)]
    pipe = r.pipeline(transaction=False)
    for request in jobs:
        pipe.hget(KEYS.job(request.job), JobHash.TEXT)
    for request, text in zip(jobs, pipe.execute(), strict=True):
        request.server_text = None if text is None else text.decode()


def journals(r: redis.Redis, requests: list[Request]) -> None:
    """Each resumable stream's journal (kept OVQ_JOURNAL_TTL_S): the events the worker published, numbered."""
    streams = [q for q in requests if q.kind == STREAM and q.job]
    pipe = r.pipeline(transaction=False)
    for request in streams:
        pipe.xrange(KEYS.journal(request.job))
    for request, entries in zip(streams, pipe.execute(), strict=True):
        if entries:
            events = [e for _, fields in entries for e in read_batch(fields[b"e"])]
            request.journal = [(int(e["seq"]), _framed(e, n == 0)) for n, e in enumerate(events)]


def _framed(event: dict[str, object], first: bool) -> bool:
    """Whether the API makes a frame of it (api/openai/resume.py's `Frames.of`): the first `accepted` (the role
    chunk), a delta with text or a finish reason, the end; not an `accepted` again after a takeover."""
    kind = event["type"]
    if kind == ACCEPTED:
        return first
    if kind == DELTA:
        return bool(event.get("text") or event.get("finish_reason"))
    return kind in (DONE, ERROR)


async def stored_responses(c: Client, requests: list[Request], statuses: list[int]) -> None:
    """Each background response as stored; then deleted (its owner's cleanup)."""
    for request in requests:
        if request.kind != BACKGROUND or not request.job:
            continue
        answer = await client.call(c, "GET", f"/v3/responses/{request.job}", statuses)
        if answer.status_code == 200:
            request.server_text = "".join(part.get("text", "") for item in answer.json().get("output", [])
                                          for part in item.get("content") or [] if part.get("type") == "output_text")
        await client.call(c, "DELETE", f"/v3/responses/{request.job}", statuses)


def kv_usage(name: str) -> float:
    probe = ("import urllib.request as u; "
             "print(u.urlopen('http://127.0.0.1:8081/metrics', timeout=4).read().decode())")
    text = podman("exec", name, "python", "-c", probe, timeout=60).stdout
    return float(KV_METRIC.search(text).group(1))  # type: ignore[union-attr]


def idle_kv_usage(fleet: Fleet) -> dict[str, float]:
    """Each SmolLM2 worker's KV-cache usage once idle: waited for (bounded) until it reads 0."""
    deadline, usage = time.monotonic() + IDLE_BOUND_S, {}
    while time.monotonic() < deadline:
        usage = {name: kv_usage(name) for name in fleet.workers}
        if not any(usage.values()):
            break
        time.sleep(5)
    return usage
