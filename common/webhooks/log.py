"""What became of webhook deliveries, as /ops and `ovq webhooks` show it: the most recent attempts
(`Keys.webhook_log`), counts by outcome (`Keys.webhook_counts`), and what waits now (the stream, the retries)."""
from __future__ import annotations

from typing import Literal

import orjson
import redis.asyncio as aioredis
from pydantic import BaseModel

from common.keys import Keys

Outcome = Literal["delivered", "failed", "gave_up", "refused"]
OUTCOMES: tuple[str, ...] = Outcome.__args__  # type: ignore[attr-defined]


class Attempt(BaseModel):
    """One delivery attempt: its event, where it went, the attempt's number (1 is the first) and how it went."""

    at: float  # unix s
    event: str  # the event's id: its webhook-id
    type: str
    tenant: str
    url: str
    attempt: int
    outcome: Outcome  # delivered (2xx); failed (retried later); gave_up (past webhook_retry_for_s); refused (SSRF)
    status: int | None = None  # the receiver's HTTP status, when it answered
    error: str | None = None  # why it failed, in a few words
    next_s: float | None = None  # failed: the wait before the next attempt


class Summary(BaseModel):
    counts: dict[str, int]
    waiting: int  # events and deliveries in the stream (new, or being delivered)
    retrying: int  # deliveries waiting for their next attempt
    recent: list[Attempt]


async def summary(redis: aioredis.Redis, keys: Keys, limit: int = 50) -> Summary:
    pipe = redis.pipeline(transaction=False)
    pipe.hgetall(keys.webhook_counts)
    pipe.xlen(keys.webhooks)
    pipe.zcard(keys.webhook_retries)
    pipe.lrange(keys.webhook_log, 0, limit - 1)
    counts, waiting, retrying, recent = await pipe.execute()
    found = {k.decode(): int(v) for k, v in counts.items()}
    return Summary(counts={o: found.get(o, 0) for o in OUTCOMES}, waiting=waiting, retrying=retrying,
                   recent=[Attempt.model_validate(orjson.loads(raw)) for raw in recent])
