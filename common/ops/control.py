"""What an operator does to the queue, straight on Redis: drain a worker, retry or purge dead letters, look a job up.
Shared by the CLI (`ovq worker drain`, `ovq dead`, `ovq jobs show`) and the ops page's buttons."""
from __future__ import annotations

import time
from typing import Any

import orjson
import redis.asyncio as aioredis
from pydantic import BaseModel

from common.jobs import ENTRY_JOB, Job, JobStatus
from common.jobs import JobHash as H
from common.keys import GROUP, Keys
from common.owner import OWNER_FIELD, shown
from common.settings import Settings

# A drain request for a worker that never reads it (it died meanwhile) goes away after this long.
DRAIN_TTL_S = 600
# A retried dead letter's events go to a channel nobody listens on: its outcome is in its job hash. No API
# process announces this name, so workers never take the job for one that is gone.
RETRY_REPLY_TO = "ops-retry"

# KEYS: job hash, the model's stream. ARGV: entry id (unused), job JSON, created, reply_to, model, device, job TTL.
# Queues a dead letter's job again: on a Redis Cluster, the second step of a retry (the dead-letter stream lives in
# another slot than the job's model, so its XDEL goes first, alone: that claims the retry).
REQUEUE = f"""
local job, stream = KEYS[#KEYS - 1], KEYS[#KEYS]
redis.call('XADD', stream, '*', '{ENTRY_JOB}', ARGV[2])
redis.call('HDEL', job, '{H.ERROR}', '{H.RESULT}', '{H.WORKER}', '{H.REASON}', '{H.STREAMED}', '{H.TEXT}')
redis.call('HSET', job, '{H.STATUS}', '{JobStatus.QUEUED}', '{H.CREATED}', ARGV[3], '{H.API}', ARGV[4],
           '{H.MODEL}', ARGV[5], '{H.DEVICE}', ARGV[6])
redis.call('HINCRBY', job, '{H.RETRIES}', 1)
redis.call('EXPIRE', job, ARGV[7])
return 1
"""
# KEYS: dead-letter stream, job hash, the model's stream. ARGV: as REQUEUE's. Removed from the dead letters and
# queued again in one step; 0 when the entry is gone already (retried or purged by someone else).
RETRY = "if redis.call('XDEL', KEYS[1], ARGV[1]) == 0 then return 0 end\n" + REQUEUE


class NotFound(LookupError):
    """No such worker, dead letter or job."""


class Refused(ValueError):
    """The operation cannot be done on this item (say, a dead letter whose job cannot be read)."""


async def drain(redis: aioredis.Redis, keys: Keys, worker_id: str) -> None:
    """Ask a live worker to drain: at its next heartbeat it stops taking jobs, finishes its running ones, exits."""
    if not await redis.exists(keys.worker(worker_id)):
        raise NotFound(f"no live worker {worker_id!r}")
    await redis.set(keys.drain(worker_id), time.time(), ex=DRAIN_TTL_S)


STEER_TTL_S = 600  # a sleep or wake command for a worker that never reads it (it died meanwhile) goes away then
COMMANDS = ("sleep", "wake")


async def steer(redis: aioredis.Redis, keys: Keys, worker_id: str, command: str) -> None:
    """Ask a live worker to sleep (release its engine's weights and KV cache, keep its process; a job wakes it) or
    to wake; it takes the command at its next heartbeat."""
    if command not in COMMANDS:
        raise Refused(f"no worker command {command!r} (one of: {', '.join(COMMANDS)})")
    can_sleep = await redis.hget(keys.worker(worker_id), "can_sleep")
    if can_sleep is None:
        raise NotFound(f"no live worker {worker_id!r}")
    if can_sleep != b"1":
        raise Refused(f"worker {worker_id} cannot sleep: its kind keeps its pipeline in its own process")
    await redis.set(keys.steer(worker_id), command, ex=STEER_TTL_S)


async def retry(redis: aioredis.Redis, keys: Keys, settings: Settings, entry_id: str) -> Job:
    """Put a dead letter's job back on its model's stream (a fresh delivery count, created now)."""
    entries = await redis.xrange(keys.dead, entry_id, entry_id)
    if not entries:
        raise NotFound(f"no dead letter {entry_id!r}")
    try:
        job = Job.from_fields(entries[0][1])
    except Exception:
        raise Refused(f"the dead letter {entry_id} holds a job this version cannot read; purge it") from None
    job = job.model_copy(update={"created": time.time(), "reply_to": RETRY_REPLY_TO})
    args = [entry_id, orjson.dumps(job.model_dump()), job.created, job.reply_to, job.model, job.device,
            settings.job_ttl_s]
    queued = [keys.job(job.id, job.model), keys.jobs(job.model, job.device)]
    if keys.cluster:  # two slots: claim the dead letter, then queue its job (a crash between them loses the retry)
        if not await redis.xdel(keys.dead, entry_id):
            raise NotFound(f"no dead letter {entry_id!r} (retried or purged meanwhile)")
        await redis.register_script(REQUEUE)(keys=queued, args=args)
    elif not await redis.register_script(RETRY)(keys=[keys.dead, *queued], args=args):
        raise NotFound(f"no dead letter {entry_id!r} (retried or purged meanwhile)")
    return job


async def purge(redis: aioredis.Redis, keys: Keys) -> int:
    """Delete every dead letter; how many there were."""
    tx = redis.pipeline(transaction=True)
    tx.xlen(keys.dead)
    tx.delete(keys.dead)
    count, _ = await tx.execute()
    return int(count)


class JobInfo(BaseModel):
    id: str
    status: str
    model: str = ""
    device: str = ""
    kind: str = ""
    worker: str = ""  # the worker that ran it (or holds it, while in flight)
    api: str = ""  # the API process waiting for it (its `reply_to`)
    api_alive: bool | None = None  # None: that API process never announced itself
    created: float | None = None
    updated: float | None = None
    queue_ms: float | None = None
    ttft_ms: float | None = None
    total_ms: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reasons: list[str] = []
    deliveries: int | None = None  # while in flight: how often the stream delivered it
    retries: int = 0
    reason: str = ""  # why it was cancelled, when not by its client
    error: dict[str, Any] | None = None
    text: str | None = None  # only with OVQ_KEEP_JOB_TEXT


async def job_info(redis: aioredis.Redis, keys: Keys, settings: Settings, job_id: str, model: str = "") -> JobInfo:
    """`model`: the job's, which names its hash on a Cluster; there, without it, each model announced is tried."""
    models = [model] if model or not keys.cluster else [m.decode() for m in await redis.zrange(keys.models, 0, -1)]
    found: dict[bytes, bytes] = {}
    for each in models:
        if found := await redis.hgetall(keys.job(job_id, each)):
            break
    raw = {k.decode(): v.decode(errors="replace") for k, v in found.items()}
    if not raw:
        raise NotFound(f"no job {job_id!r} (unknown, or ended more than OVQ_JOB_TTL_S ago)")

    def number(name: str) -> float | None:
        return float(raw[name]) if raw.get(name) not in (None, "", "null") else None

    def count(name: str, fallback: int | None) -> int | None:
        return int(raw[name]) if raw.get(name) else fallback

    result = orjson.loads(raw[H.RESULT]) if raw.get(H.RESULT) else {}
    timings, usage = result.get("timings") or {}, result.get("usage") or {}
    info = JobInfo(
        id=job_id, status=raw.get(H.STATUS, ""), model=raw.get(H.MODEL, ""), device=raw.get(H.DEVICE, ""),
        worker=raw.get(H.WORKER, ""), api=raw.get(H.API, ""), created=number(H.CREATED), updated=number(H.UPDATED),
        queue_ms=number(H.QUEUE_MS) if H.QUEUE_MS in raw else timings.get("queue_ms"),
        ttft_ms=number(H.TTFT_MS) if H.TTFT_MS in raw else timings.get("ttft_ms"),
        total_ms=number(H.TOTAL_MS) if H.TOTAL_MS in raw else timings.get("total_ms"),
        prompt_tokens=count(H.PROMPT_TOKENS, usage.get("prompt_tokens")),
        completion_tokens=count(H.COMPLETION_TOKENS, usage.get("completion_tokens")),
        finish_reasons=result.get("finish_reasons") or [], retries=int(raw.get(H.RETRIES, 0)),
        reason=raw.get(H.REASON, ""), error=orjson.loads(raw[H.ERROR]) if raw.get(H.ERROR) else None,
        text=raw.get(H.TEXT))
    if info.api:
        score = await redis.zscore(keys.apis, info.api)
        info.api_alive = None if score is None else score >= time.time() - settings.api_ttl_s
    if info.status in (JobStatus.QUEUED, JobStatus.RUNNING) and info.model and info.device:
        await _find_in_stream(redis, keys, info)
    return info


async def _find_in_stream(redis: aioredis.Redis, keys: Keys, info: JobInfo) -> None:
    """The job itself, while it is in its stream: its kind, and who holds it if delivered (a bounded scan: the
    stream holds at most OVQ_MAX_QUEUE_DEPTH entries)."""
    stream = keys.jobs(info.model, info.device)
    created_ms = int((info.created or 0) * 1000)
    async for entry_id, fields in _entries(redis, stream, f"{max(created_ms - 60_000, 0)}-0"):
        try:
            job = Job.from_fields(fields)
        except Exception:
            continue
        if job.id != info.id:
            continue
        info.kind = job.kind
        pending = await redis.xpending_range(stream, GROUP, entry_id, entry_id, 1)
        if pending:
            info.worker = info.worker or pending[0]["consumer"].decode()
            info.deliveries = int(pending[0]["times_delivered"])
        return


async def _entries(redis: aioredis.Redis, stream: str, start: str, page: int = 500) -> Any:
    lower = start
    while True:
        batch = await redis.xrange(stream, lower, "+", count=page)
        for entry in batch:
            yield entry
        if len(batch) < page:
            return
        lower = f"({batch[-1][0].decode()}"  # exclusive: after the last one read


class BackgroundResponse(BaseModel):
    """A background response (`POST /responses` with `background: true`) as an operator sees it."""

    id: str
    job: str
    model: str
    created: float
    status: str  # the job's: queued, running, done, error, cancelled
    owner: str = shown(None)  # whose it is (common/owner.py), as shown


async def background_responses(redis: aioredis.Redis, keys: Keys, limit: int = 50) -> list[BackgroundResponse]:
    """The newest background responses still recorded (Keys.backgrounds), with their jobs' status."""
    listed = await redis.zrevrange(keys.backgrounds, 0, limit - 1, withscores=True)
    pipe = redis.pipeline(transaction=False)
    for response_id, _ in listed:
        pipe.hmget(keys.background(response_id.decode()), ["job", "model", OWNER_FIELD])
    records = await pipe.execute() if listed else []
    found = [(rid.decode(), created, job.decode(), model.decode(), owner)
             for (rid, created), (job, model, owner) in zip(listed, records, strict=True) if job is not None]
    pipe = redis.pipeline(transaction=False)
    for _, _, job, model, _ in found:
        pipe.hget(keys.job(job, model), H.STATUS)
    statuses = await pipe.execute() if found else []
    return [BackgroundResponse(id=rid, job=job, model=model, created=created, owner=shown(owner),
                               status=status.decode() if status else JobStatus.QUEUED)
            for (rid, created, job, model, owner), status in zip(found, statuses, strict=True)]


async def cancel_background(redis: aioredis.Redis, keys: Keys, settings: Settings, response_id: str) -> str:
    """Cancel a background response's job at its worker (or before one takes it); the response is stored
    `cancelled` by the next API process that reads it. Returns the job's id."""
    job, model_raw = await redis.hmget(keys.background(response_id), ["job", "model"])
    if job is None:
        raise NotFound(f"no background response {response_id!r}")
    model = model_raw.decode() if model_raw else ""
    status = await redis.hget(keys.job(job.decode(), model), H.STATUS)
    if status is not None and status.decode() in (JobStatus.DONE, JobStatus.ERROR, JobStatus.CANCELLED):
        raise Refused(f"background response {response_id!r} has ended ({status.decode()})")
    pipe = redis.pipeline(transaction=False)
    pipe.set(keys.cancel(job.decode(), model), 1, ex=settings.cancel_ttl_s)
    if keys.cluster:
        pipe.spublish(keys.model_cancel_channel(model), job)
    else:
        pipe.publish(keys.cancel_channel, job)
    await pipe.execute()
    return job.decode()
