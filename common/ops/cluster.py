"""What an operator sees, read from Redis alone (so every API process and `ovq status` see the same): the
streams of each model and device with their backlog, the live workers, the API processes, the dead letters and
the recent failures. Shared by the ops page (`api/ops/`) and the CLI (`cli/status.py`)."""
from __future__ import annotations

import time

import orjson
import redis.asyncio as aioredis
from pydantic import BaseModel, Field
from redis.exceptions import ResponseError

from common.batch.store import ModelBatches
from common.batch.store import per_model as batch_models
from common.fairness import in_flight, tenant_counts
from common.jobs import ENTRY_REASON, ENTRY_WORKER, Job
from common.keys import GROUP, Keys
from common.ops.stats import Summary
from common.ops.stats import read as read_stats
from common.redis.client import node_of
from common.settings import Settings

FAIR_LEVELS = ("high", "interactive", "low", "batch")  # the levels whose jobs are parked for fair shares
TOP_TENANTS = 10


class StreamState(BaseModel):
    model: str
    device: str
    stream: str
    waiting: int
    in_flight: int
    workers: int  # live: heartbeat within the worker TTL
    consumers: int  # in the consumer group, dead ones not yet removed included
    # Batch API lines in the model's batch stream (read only when nothing interactive waits).
    batch_waiting: int = 0
    batch_in_flight: int = 0
    # Jobs waiting at the `high` and `low` priority levels (their own streams, `Keys.level_jobs`).
    high_waiting: int = 0
    low_waiting: int = 0
    # Parked jobs per tenant (fair shares, common/fairness.py) over the levels, the TOP_TENANTS with the most.
    tenants_waiting: dict[str, int] = Field(default_factory=dict)
    # Of `waiting`: the interactive jobs waiting in the workers' affinity streams (prefix affinity).
    affinity_waiting: int = 0
    stats: Summary | None = None
    node: str = ""  # the Redis node the stream lives on (HOST:PORT): the primary, or its cluster shard's master


class WorkerState(BaseModel):
    id: str
    model: str
    device: str
    host: str = ""
    pid: int = 0
    servable_type: str = ""
    capacity: int = 0
    running: int = 0
    kv_cache_usage: float = 0.0
    tokens_per_s: float = 0.0
    tokens_generated: int = 0
    jobs_taken: int = 0
    heartbeat: float = 0.0
    age_s: float = 0.0  # since its last heartbeat
    started: float = 0.0
    draining: bool = False
    drain_requested: bool = False
    port: int = 0
    # A continuous-batching worker's learned admission knee and the sequences it admits to now (0: not learned).
    admission_knee: int = 0
    admission_limit: int = 0
    affinity_hits: int = 0  # prefix affinity: jobs run from its own affinity stream
    affinity_steals: int = 0  # and from other workers' (waited past OVQ_AFFINITY_STEAL_MS)
    pool: str = ""  # the pool worker hosting it (`ovq worker --pool`); "" for a dedicated worker
    state: str = "awake"  # awake, sleeping, asleep (its engine released), waking
    can_sleep: bool = False
    woke_in_s: float | None = None  # its last wake: seconds to start its engine again


class ApiState(BaseModel):
    reply_to: str
    host: str = ""
    pid: int = 0
    started: float = 0.0
    age_s: float = 0.0


class PoolModel(BaseModel):
    model: str
    state: str  # loading, serving, unloading
    footprint: int = 0  # bytes, estimated
    for_s: float = 0.0  # in this state
    idle_s: float | None = None
    load_s: float | None = None
    worker: str = ""


class PoolState(BaseModel):
    """A pool worker (`ovq worker --pool`), as its own record describes it (`Keys.pool`)."""

    id: str
    device: str = ""
    host: str = ""
    pid: int = 0
    budget: int = 0  # bytes its models may take
    used: int = 0
    known: int = 0  # models of its models file on its device
    models: list[PoolModel] = Field(default_factory=list)
    loads: int = 0
    unloads: int = 0
    load_s: float = 0.0  # summed over its loads
    unload_s: float = 0.0
    failed: int = 0
    age_s: float = 0.0


class DeadLetter(BaseModel):
    id: str  # the entry id in the dead-letter stream (what retry takes)
    time: float
    reason: str
    job: str = ""
    model: str = ""
    device: str = ""
    kind: str = ""
    worker: str = ""


class Failure(BaseModel):
    job: str
    model: str
    device: str
    worker: str
    time: float
    message: str
    type: str = ""
    code: str | int | None = None


class Overview(BaseModel):
    time: float
    streams: list[StreamState]
    workers: list[WorkerState]
    apis: list[ApiState]
    dead_letters: int
    dead: list[DeadLetter]
    failures: list[Failure]
    batches: list[ModelBatches] = Field(default_factory=list)
    pools: list[PoolState] = Field(default_factory=list)


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _hash(raw: dict[bytes, bytes]) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in raw.items()}


async def served(redis: aioredis.Redis, keys: Keys, settings: Settings) -> list[tuple[str, str]]:
    """(model, device) of every model announced within the card TTL, devices as their cards say."""
    since = time.time() - settings.model_card_ttl_s
    models = sorted(_text(m) for m in await redis.zrangebyscore(keys.models, since, "+inf"))
    pipe = redis.pipeline(transaction=False)
    for model in models:
        pipe.hkeys(keys.model(model))
    return [(model, _text(device)) for model, devices in zip(models, await pipe.execute(), strict=True)
            for device in sorted(devices)]


async def streams(redis: aioredis.Redis, keys: Keys, settings: Settings,
                  pairs: list[tuple[str, str]]) -> list[StreamState]:
    """Backlog per stream. Redis 6.2 has no group `lag`: waiting = XLEN - pending (acked entries are deleted)."""
    since = time.time() - settings.worker_ttl_s
    pipe = redis.pipeline(transaction=False)
    for model, device in pairs:
        stream = keys.jobs(model, device)
        pipe.xlen(stream)
        pipe.xpending(stream, GROUP)
        pipe.xinfo_groups(stream)
        pipe.zcount(keys.workers(model, device), since, "+inf")
        pipe.xlen(keys.batch_jobs(model, device))
        pipe.xpending(keys.batch_jobs(model, device), GROUP)
        for level in ("high", "low"):
            pipe.xlen(keys.level_jobs(model, device, level))
            pipe.xpending(keys.level_jobs(model, device, level), GROUP)
        for level in FAIR_LEVELS:
            pipe.hgetall(keys.fair_clock(model, device, level))
    replies = iter(await pipe.execute(raise_on_error=False))
    affine = iter(await affinity_waiting(redis, keys, settings.job_ttl_s, pairs))
    states = []
    for model, device in pairs:
        length, pending, groups, live, batch_length, batch_pending = (next(replies) for _ in range(6))
        high, low = (max(_length(next(replies)) - _pending(next(replies)), 0) for _ in range(2))
        tenants: dict[str, int] = {}
        for clock in (next(replies) for _ in FAIR_LEVELS):
            for tenant, n in (tenant_counts(clock) if isinstance(clock, dict) else {}).items():
                tenants[tenant] = tenants.get(tenant, 0) + n
        in_flight, length = _pending(pending), _length(length)
        batch_in_flight = _pending(batch_pending)
        consumers = 0 if isinstance(groups, ResponseError) else sum(
            int(g["consumers"]) for g in groups if _text(g["name"]) == GROUP)
        in_affinity = next(affine)
        states.append(StreamState(model=model, device=device, stream=keys.jobs(model, device),
                                  waiting=max(length - in_flight, 0) + in_affinity, in_flight=in_flight,
                                  affinity_waiting=in_affinity,
                                  workers=int(live), consumers=consumers,
                                  batch_waiting=max(_length(batch_length) - batch_in_flight, 0),
                                  batch_in_flight=batch_in_flight, high_waiting=high, low_waiting=low,
                                  tenants_waiting=dict(sorted(tenants.items(), key=lambda kv: -kv[1])[:TOP_TENANTS]),
                                  node=await node_of(redis, keys.jobs(model, device))))
    return states


async def affinity_waiting(redis: aioredis.Redis, keys: Keys, job_ttl_s: float,
                           pairs: list[tuple[str, str]]) -> list[int]:
    """Per (model, device): the jobs waiting (undelivered) in its workers' affinity streams, dead workers' included.
    The API lets at most OVQ_AFFINITY_MAX_WAITING wait in one, so this is a round trip for the owners and, if there
    are any, one for their streams, however long the queue."""
    pipe = redis.pipeline(transaction=False)
    since = time.time() - job_ttl_s
    for model, device in pairs:
        pipe.zrangebyscore(keys.affinity_owners(model, device), since, "+inf")
    owners = await pipe.execute(raise_on_error=False)
    streams = [[keys.affinity_jobs(model, device, _text(w)) for w in (found if isinstance(found, list) else [])]
               for (model, device), found in zip(pairs, owners, strict=True)]
    if not any(streams):
        return [0] * len(pairs)
    pipe = redis.pipeline(transaction=False)
    for group in streams:
        for stream in group:
            pipe.xlen(stream)
            pipe.xpending(stream, GROUP)
    replies = iter(await pipe.execute(raise_on_error=False))
    return [sum(max(_length(next(replies)) - _pending(next(replies)), 0) for _ in group) for group in streams]


def _pending(reply: object) -> int:
    return 0 if isinstance(reply, ResponseError) else in_flight(reply)  # parked jobs (common/fairness.py) wait


def _length(reply: object) -> int:
    return 0 if isinstance(reply, ResponseError) else int(reply)  # type: ignore[call-overload]


async def workers(redis: aioredis.Redis, keys: Keys, settings: Settings,
                  pairs: list[tuple[str, str]]) -> list[WorkerState]:
    """The workers with a live heartbeat, as their own hashes describe them."""
    now = time.time()
    since = now - settings.worker_ttl_s
    pipe = redis.pipeline(transaction=False)
    for model, device in pairs:
        pipe.zrangebyscore(keys.workers(model, device), since, "+inf")
    ids = sorted({_text(i) for members in await pipe.execute() for i in members})
    pipe = redis.pipeline(transaction=False)
    for worker_id in ids:
        pipe.hgetall(keys.worker(worker_id))
        pipe.exists(keys.drain(worker_id))
    replies = iter(await pipe.execute())
    found = []
    for worker_id in ids:
        raw, drain = _hash(next(replies)), next(replies)
        if not raw:
            continue  # gone between the two reads
        heartbeat = float(raw.get("heartbeat", 0))
        found.append(WorkerState(
            id=worker_id, model=raw.get("model", ""), device=raw.get("device", ""), host=raw.get("host", ""),
            pid=int(raw.get("pid", 0)), servable_type=raw.get("servable_type", ""),
            capacity=int(raw.get("capacity", 0)), running=int(raw.get("running", 0)),
            kv_cache_usage=float(raw.get("kv_cache_usage", 0)), tokens_per_s=float(raw.get("tokens_per_s", 0)),
            tokens_generated=int(raw.get("tokens_generated", 0)), jobs_taken=int(raw.get("jobs_taken", 0)),
            heartbeat=heartbeat, age_s=max(now - heartbeat, 0.0), started=float(raw.get("started", 0)),
            draining=raw.get("draining") == "1", drain_requested=bool(drain), port=int(raw.get("port", 0)),
            admission_knee=int(raw.get("admission_knee", 0)), admission_limit=int(raw.get("admission_limit", 0)),
            affinity_hits=int(raw.get("affinity_hits", 0)), affinity_steals=int(raw.get("affinity_steals", 0)),
            pool=raw.get("pool", ""), state=raw.get("state") or "awake", can_sleep=raw.get("can_sleep") == "1",
            woke_in_s=float(raw["woke_in_s"]) if raw.get("woke_in_s") else None))
    return sorted(found, key=lambda w: (w.model, w.device, w.host, w.id))


async def pools(redis: aioredis.Redis, keys: Keys, settings: Settings) -> list[PoolState]:
    """The pool workers heard within the worker TTL."""
    now = time.time()
    ids = [_text(i) for i in await redis.zrangebyscore(keys.pools, now - settings.worker_ttl_s, "+inf")]
    pipe = redis.pipeline(transaction=False)
    for pool_id in ids:
        pipe.hgetall(keys.pool(pool_id))
    found = []
    for pool_id, raw in zip(ids, await pipe.execute() if ids else [], strict=True):
        fields = _hash(raw)
        if not fields:
            continue
        found.append(PoolState(
            id=pool_id, device=fields.get("device", ""), host=fields.get("host", ""), pid=int(fields.get("pid", 0)),
            budget=int(fields.get("budget", 0)), used=int(fields.get("used", 0)), known=int(fields.get("known", 0)),
            models=[PoolModel.model_validate(m) for m in orjson.loads(fields.get("models") or "[]")],
            loads=int(fields.get("loads", 0)), unloads=int(fields.get("unloads", 0)),
            load_s=float(fields.get("load_s", 0)), unload_s=float(fields.get("unload_s", 0)),
            failed=int(fields.get("failed", 0)), age_s=max(now - float(fields.get("heartbeat", now)), 0.0)))
    return sorted(found, key=lambda p: (p.host, p.id))


async def apis(redis: aioredis.Redis, keys: Keys, settings: Settings) -> list[ApiState]:
    """The API processes with a live heartbeat."""
    now = time.time()
    names = [_text(n) for n in await redis.zrangebyscore(keys.apis, now - settings.api_ttl_s, "+inf")]
    pipe = redis.pipeline(transaction=False)
    for name in names:
        pipe.hgetall(keys.api(name))
    found = []
    for name, raw in zip(names, await pipe.execute(), strict=True):
        fields = _hash(raw)
        if fields:
            found.append(ApiState(reply_to=name, host=fields.get("host", ""), pid=int(fields.get("pid", 0)),
                                  started=float(fields.get("started", 0)),
                                  age_s=max(now - float(fields.get("heartbeat", now)), 0.0)))
    return sorted(found, key=lambda a: (a.host, a.reply_to))


def dead_letter(entry_id: bytes | str, fields: dict[bytes, bytes]) -> DeadLetter:
    entry = _text(entry_id)
    letter = DeadLetter(id=entry, time=int(entry.split("-")[0]) / 1000,
                        reason=_text(fields.get(ENTRY_REASON.encode(), b"")),
                        worker=_text(fields.get(ENTRY_WORKER.encode(), b"")))
    try:
        job = Job.from_fields(fields)
    except Exception:  # an unreadable job is exactly what may land here: show what can be shown
        return letter
    return letter.model_copy(update={"job": job.id, "model": job.model, "device": job.device, "kind": job.kind})


async def dead_letters(redis: aioredis.Redis, keys: Keys, count: int = 50) -> tuple[int, list[DeadLetter]]:
    """How many dead letters there are, and the newest `count` of them."""
    if count <= 0:
        return int(await redis.xlen(keys.dead)), []
    pipe = redis.pipeline(transaction=False)
    pipe.xlen(keys.dead)
    pipe.xrevrange(keys.dead, count=count)
    total, entries = await pipe.execute()
    return int(total), [dead_letter(entry_id, fields) for entry_id, fields in entries]


async def failures(redis: aioredis.Redis, keys: Keys, count: int = 50) -> list[Failure]:
    if count <= 0:
        return []
    out = []
    for raw in await redis.lrange(keys.failed, 0, count - 1):
        try:
            out.append(Failure.model_validate(orjson.loads(raw)))
        except Exception:  # a record from another version: skip it rather than fail the page
            continue
    return out


async def overview(redis: aioredis.Redis, keys: Keys, settings: Settings, with_stats: bool = True,
                   rows: int = 50) -> Overview:
    pairs = await served(redis, keys, settings)
    states = await streams(redis, keys, settings, pairs)
    if with_stats and pairs:
        summaries = await read_stats(redis, keys, pairs)
        for state in states:
            state.stats = summaries[(state.model, state.device)]
    total, dead = await dead_letters(redis, keys, rows)
    return Overview(time=time.time(), streams=states, workers=await workers(redis, keys, settings, pairs),
                    apis=await apis(redis, keys, settings), dead_letters=total, dead=dead,
                    failures=await failures(redis, keys, rows), batches=await batch_models(redis, keys),
                    pools=await pools(redis, keys, settings))
