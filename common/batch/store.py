"""A batch in Redis: its fields, its lease, its checkpoint, and the rq queue that runs it.

The API creates, lists and cancels batches; a batch worker (workers/batch/runner.py) runs one while it holds its lease.
Every write a runner makes checks its lease in the same Lua call, so a runner that lost its batch (paused past
its lease, taken over by another) changes nothing; every line's output is recorded with HSETNX, so a line is
answered exactly once in the output whatever ran it twice.

A batch records its owner (common/owner.py) when it is created, and a secret the runner sends with each line
(`run_token`, never answered to a client: api/batch/lines.py), by which the API runs the line as the owner's.
"""
from __future__ import annotations

import re
import secrets
import time
import uuid
from typing import Any, Literal

import orjson
import redis
import redis.asyncio as aioredis
from pydantic import BaseModel, Field

from common.batch.models import BatchFields, LineError
from common.batch.rq_keys import use_rq_prefix
from common.keys import Keys
from common.owner import OWNER_FIELD, Caller
from common.settings import Settings
from common.webhooks.events import EMIT_FUNCTION, emit_args, new_event

Status = Literal["validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling",
                 "cancelled"]
TERMINAL = ("failed", "completed", "expired", "cancelled")
RUN_FUNCTION = "workers.batch.runner.run_batch"
COUNTERS_TTL_S = 30 * 24 * 3600
RQ_RESULT_TTL_S = 24 * 3600
RQ_FAILURE_TTL_S = 7 * 24 * 3600
JSON_FIELDS = ("metadata", "errors")
RUN_AS_HEADER = "X-Ovq-Batch"  # `BATCH_ID:RUN_TOKEN`: a batch line, to run as its batch's owner's


class BatchState(BatchFields):
    """A batch's fields as kept in its Redis hash: the Batch object's own, its errors, counts and token totals
    (the API answers them as `errors`, `request_counts` and `usage`), and the runner's."""

    status: Status = "validating"
    expires_at: int
    errors: list[LineError] | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    in_flight: int = 0
    rq_job: str | None = None
    # How long the output and error files live (the request's `output_expires_after`; default files_ttl_s).
    output_ttl_s: int | None = None
    owner: str | None = None  # whose it is (common/owner.py); None: stored before owners were
    # What the runner sends with each line to have it run as the owner's (api/batch/lines.py); never on the wire.
    run_token: str | None = None

    @classmethod
    def from_hash(cls, raw: dict[bytes, bytes]) -> BatchState:
        values: dict[str, Any] = {k.decode(): v.decode() for k, v in raw.items()}
        for name in JSON_FIELDS:
            if name in values:
                values[name] = orjson.loads(values[name])
        return cls.model_validate({k: v for k, v in values.items() if v != ""})

    def to_hash(self) -> dict[str, str | int]:
        out: dict[str, str | int] = {}
        for name, value in self.model_dump().items():
            if value is None:
                continue
            out[name] = orjson.dumps(value).decode() if name in JSON_FIELDS else value
        return out


def new_batch_id() -> str:
    return f"batch_{uuid.uuid4().hex}"


def new_run_token() -> str:
    return secrets.token_hex(16)


def result_file_id(batch_id: str, kind: Literal["output", "error"]) -> str:
    """The output (or error) file's id, the same for every runner that finalizes the batch: a runner that dies
    mid-finalize leaves nothing the next one does not overwrite."""
    return f"file-{uuid.uuid5(uuid.NAMESPACE_URL, f'{batch_id}/{kind}').hex}"


WINDOW = re.compile(r"^(\d+)([smhd])$")
UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def window_seconds(window: str) -> int:
    """`24h` -> 86400 (also s, m, d: an operator may allow other windows)."""
    match = WINDOW.match(window.strip())
    if not match:
        raise ValueError(f"not a duration: {window!r}")
    return int(match.group(1)) * UNIT_S[match.group(2)]


# KEYS: lease. ARGV: token, then milliseconds. 1 when renewed, 0 when the lease is another's or gone.
RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# KEYS: lease, batch. ARGV: token, allowed current statuses (comma-separated), then field, value pairs.
# Returns the status now (unchanged when the current one is not allowed), or '' when the lease is not ours.
UPDATE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return '' end
local status = redis.call('HGET', KEYS[2], 'status')
if not status then return '' end
if not string.find(',' .. ARGV[2] .. ',', ',' .. status .. ',', 1, true) then return status end
for i = 3, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
return redis.call('HGET', KEYS[2], 'status')
"""
# KEYS: lease, checkpoint, batch, model counters, models with counters.
# ARGV: token, custom_id, output line, 'completed' or 'failed', input tokens, output tokens, now, counters TTL,
# model. Returns 1 when recorded, 0 when the line was answered already, -1 when the lease is not ours.
RECORD = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
if redis.call('HSETNX', KEYS[2], ARGV[2], ARGV[3]) == 0 then return 0 end
local ttl = redis.call('TTL', KEYS[3])
if ttl > 0 then redis.call('EXPIRE', KEYS[2], ttl) end
redis.call('HINCRBY', KEYS[3], ARGV[4], 1)
redis.call('HINCRBY', KEYS[3], 'input_tokens', ARGV[5])
redis.call('HINCRBY', KEYS[3], 'output_tokens', ARGV[6])
redis.call('HINCRBY', KEYS[4], ARGV[4], 1)
redis.call('EXPIRE', KEYS[4], ARGV[8])
redis.call('ZADD', KEYS[5], ARGV[7], ARGV[9])
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', ARGV[7] - ARGV[8])
redis.call('EXPIRE', KEYS[5], ARGV[8])
return 1
"""
# KEYS: lease, batch, checkpoint, active set, webhook events. ARGV: token, batch TTL (s), batch id, the webhook
# event's payload, MAXLEN and TTL of the events, then field, value pairs. The event goes to the batch's owner.
END = EMIT_FUNCTION + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
for i = 7, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
redis.call('HSET', KEYS[2], 'in_flight', 0)
redis.call('EXPIRE', KEYS[2], ARGV[2])
redis.call('DEL', KEYS[3], KEYS[1])
redis.call('ZREM', KEYS[4], ARGV[3])
emit_webhook(KEYS[5], ARGV[4], redis.call('HGET', KEYS[2], 'owner') or '', ARGV[5], ARGV[6])
return 1
"""
# KEYS: batch, lease, checkpoint, active set, webhook events. ARGV: now, batch TTL (s), then the `batch.cancelled`
# event's payload, MAXLEN and TTL of the events.
# A batch nobody runs and that has answered nothing ends `cancelled` at once (and emits its event); one being run
# (or with answers to write) becomes `cancelling` and its runner ends it. Returns the status now, '' for no such
# batch.
CANCEL = EMIT_FUNCTION + """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return '' end
if status ~= 'validating' and status ~= 'in_progress' then return status end
redis.call('HSET', KEYS[1], 'cancelling_at', ARGV[1])
if redis.call('EXISTS', KEYS[2]) == 1 or redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('HSET', KEYS[1], 'status', 'cancelling')
  return 'cancelling'
end
redis.call('HSET', KEYS[1], 'status', 'cancelled', 'cancelled_at', ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('ZREM', KEYS[4], redis.call('HGET', KEYS[1], 'id'))
emit_webhook(KEYS[5], ARGV[3], redis.call('HGET', KEYS[1], 'owner') or '', ARGV[4], ARGV[5])
return 'cancelled'
"""


class ModelBatches(BaseModel):
    """Batches of one model, as /metrics and the ops page show them."""
    model: str
    completed: int = 0  # lines answered with a 2xx (counters over the counters' TTL)
    failed: int = 0
    in_flight: int = 0  # lines sent and not yet answered, over the batches still running
    batches: dict[str, int] = Field(default_factory=dict)  # batches not yet ended, by status


async def per_model(redis: aioredis.Redis, keys: Keys) -> list[ModelBatches]:
    """Line counters and running batches per model, read from Redis (so every API process shows the same)."""
    found: dict[str, ModelBatches] = {}
    for raw in await redis.zrange(keys.batch_stats_models, 0, -1):
        model = raw.decode()
        counts = await redis.hgetall(keys.batch_stats(model))
        found[model] = ModelBatches(model=model, completed=int(counts.get(b"completed", 0)),
                                    failed=int(counts.get(b"failed", 0)))
    for raw in await redis.zrange(keys.active_batches, 0, -1):
        fields = await redis.hmget(keys.batch(raw.decode()), ["model", "status", "in_flight"])
        model, status, flight = (v.decode() if v else "" for v in fields)
        if not status:
            continue
        entry = found.setdefault(model, ModelBatches(model=model))
        entry.in_flight += int(flight or 0)
        entry.batches[status] = entry.batches.get(status, 0) + 1
    return sorted(found.values(), key=lambda m: m.model)


def longest_life_s(settings: Settings) -> int:
    """The longest a batch may be kept: the longest window it may run, then the file TTL once it ended."""
    return max(window_seconds(w) for w in settings.batch_completion_windows) + settings.files_ttl_s


class Batches:
    """Batch records for the API and the runners (async Redis)."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, settings: Settings) -> None:
        self.redis, self.keys, self.settings = redis, keys, settings
        self._renew = redis.register_script(RENEW)
        self._release = redis.register_script(RELEASE)
        self._update = redis.register_script(UPDATE)
        self._record = redis.register_script(RECORD)
        self._end = redis.register_script(END)
        self._cancel = redis.register_script(CANCEL)

    @property
    def longest_life_s(self) -> int:
        return longest_life_s(self.settings)

    # ---- the API's side ------------------------------------------------------------------------------------
    async def create(self, state: BatchState) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.keys.batch(state.id), mapping=state.to_hash())
        pipe.expire(self.keys.batch(state.id), state.expires_at - state.created_at + self.settings.files_ttl_s)
        pipe.zadd(self.keys.batches, {state.id: state.created_at})
        pipe.zadd(self.keys.active_batches, {state.id: state.created_at})
        # Entries no batch could still need (no batch worker ever ran them): gone with their batch's TTL.
        oldest = state.created_at - self.longest_life_s
        pipe.zremrangebyscore(self.keys.batches, "-inf", oldest)
        pipe.zremrangebyscore(self.keys.active_batches, "-inf", oldest)
        await pipe.execute()

    async def get(self, batch_id: str, caller: Caller) -> BatchState | None:
        """The batch, when the caller sees it (else None, as for a missing one)."""
        raw = await self.redis.hgetall(self.keys.batch(batch_id))
        return BatchState.from_hash(raw) if raw and caller.sees(raw.get(OWNER_FIELD.encode())) else None

    async def page(self, after: str | None, limit: int, caller: Caller) -> tuple[list[BatchState], bool]:
        """The caller's batches, newest first, from after the batch `after`; whether more follow."""
        start = 0
        if after:  # (another's batch is no cursor: its place would say that it exists)
            rank = await self.redis.zrevrank(self.keys.batches, after)
            owner = await self.redis.hget(self.keys.batch(after), OWNER_FIELD)
            start = 0 if rank is None or not caller.sees(owner) else rank + 1
        found: list[BatchState] = []
        while len(found) <= limit:
            ids = await self.redis.zrevrange(self.keys.batches, start, start + limit)
            if not ids:
                break
            start += len(ids)
            pipe = self.redis.pipeline(transaction=False)
            for batch_id in ids:
                pipe.hgetall(self.keys.batch(batch_id.decode()))
            for batch_id, raw in zip(ids, await pipe.execute(), strict=True):
                if raw:
                    if caller.sees(raw.get(OWNER_FIELD.encode())):
                        found.append(BatchState.from_hash(raw))
                else:  # expired: its index entry goes too
                    await self.redis.zrem(self.keys.batches, batch_id)
        return found[:limit], len(found) > limit

    async def cancel(self, batch_id: str, caller: Caller) -> str:
        """Cancel the batch (CANCEL); '' for no such batch, or one the caller does not see (its owner is read
        first: it never changes)."""
        k = self.keys
        status, owner = await self.redis.hmget(k.batch(batch_id), ["status", OWNER_FIELD])
        if status is None or not caller.sees(owner):
            return ""
        event = emit_args(new_event("batch.cancelled", batch_id), None, self.settings)
        return (await self._cancel(keys=[k.batch(batch_id), k.batch_lease(batch_id), k.batch_done(batch_id),
                                         k.active_batches, k.webhooks],
                                   args=[int(time.time()), self.settings.files_ttl_s, event[0], *event[2:]])).decode()

    async def set_rq_job(self, batch_id: str, rq_job: str) -> None:
        await self.redis.hset(self.keys.batch(batch_id), "rq_job", rq_job)

    # ---- the runner's side ---------------------------------------------------------------------------------
    async def acquire(self, batch_id: str, token: str) -> bool:
        ms = int(self.settings.batch_lease_s * 1000)
        return bool(await self.redis.set(self.keys.batch_lease(batch_id), token, nx=True, px=ms))

    async def renew(self, batch_id: str, token: str) -> bool:
        ms = int(self.settings.batch_lease_s * 1000)
        return bool(await self._renew(keys=[self.keys.batch_lease(batch_id)], args=[token, ms]))

    async def release(self, batch_id: str, token: str) -> None:
        await self._release(keys=[self.keys.batch_lease(batch_id)], args=[token])

    async def update(self, batch_id: str, token: str, allowed: tuple[str, ...], **fields: Any) -> str:
        """Set fields if the batch's status is one of `allowed`; returns the status after ('' if not ours)."""
        args: list[Any] = [token, ",".join(allowed)]
        for name, value in fields.items():
            args += [name, orjson.dumps(value).decode() if name in JSON_FIELDS else value]
        k = self.keys
        status = await self._update(keys=[k.batch_lease(batch_id), k.batch(batch_id)], args=args)
        return status.decode() if isinstance(status, bytes) else str(status)

    async def record(self, state: BatchState, token: str, custom_id: str, line: bytes, ok: bool,
                     input_tokens: int, output_tokens: int) -> int:
        k, model = self.keys, state.model or ""
        return int(await self._record(
            keys=[k.batch_lease(state.id), k.batch_done(state.id), k.batch(state.id), k.batch_stats(model),
                  k.batch_stats_models],
            args=[token, custom_id, line, "completed" if ok else "failed", input_tokens, output_tokens,
                  int(time.time()), COUNTERS_TTL_S, model]))

    async def answered(self, batch_id: str) -> set[str]:
        return {k.decode() for k in await self.redis.hkeys(self.keys.batch_done(batch_id))}

    async def lines(self, batch_id: str, custom_ids: list[str]) -> list[bytes | None]:
        return await self.redis.hmget(self.keys.batch_done(batch_id), custom_ids) if custom_ids else []

    async def end(self, batch_id: str, token: str, status: str, **fields: Any) -> bool:
        """Make the batch terminal: its fields, the file TTL, its checkpoint and lease gone, no longer active; its
        webhook event (`batch.STATUS`) emitted in the same call."""
        event = emit_args(new_event(f"batch.{status}", batch_id), None, self.settings)
        args: list[Any] = [token, self.settings.files_ttl_s, batch_id, event[0], *event[2:], "status", status]
        for name, value in fields.items():
            args += [name, orjson.dumps(value).decode() if name in JSON_FIELDS else value]
        k = self.keys
        ended = await self._end(keys=[k.batch_lease(batch_id), k.batch(batch_id), k.batch_done(batch_id),
                                      k.active_batches, k.webhooks], args=args)
        return bool(ended)


class BatchQueue:
    """The rq queue batch workers take batches from, its keys under `Keys.rq_prefix` (rq is synchronous: callers
    in asyncio use a thread)."""

    def __init__(self, connection: redis.Redis, keys: Keys, settings: Settings) -> None:
        use_rq_prefix(keys)
        from rq import Queue

        self.queue = Queue(keys.batch_queue, connection=connection)
        self.waiting_ttl_s = longest_life_s(settings)

    def enqueue(self, batch_id: str) -> str:
        from rq import Retry

        # No rq timeout: a batch runs as long as its completion window allows and ends itself. rq's retry takes
        # the batch up again when its worker died (rq's abandoned-job handling); the lease keeps it to one runner.
        # A job nobody takes up is gone (rq's `ttl`, lifted when a worker starts it) once its batch is.
        job = self.queue.enqueue(RUN_FUNCTION, batch_id, job_timeout=-1, retry=Retry(max=3),
                                 ttl=self.waiting_ttl_s, result_ttl=RQ_RESULT_TTL_S, failure_ttl=RQ_FAILURE_TTL_S,
                                 description=f"batch {batch_id}")
        return job.id
