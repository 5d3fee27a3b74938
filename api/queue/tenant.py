"""Whose work a request is (fair shares, quotas: common/fairness.py): the API key's tenant, or the request's `user`
field when keys are off; and each tenant's token-rate quota, a token bucket in Redis shared by every API process.

A quota is the key's `tokens_per_min` (api/http/auth.py): the bucket holds at most a minute's tokens and refills
continuously; a request is let in while the bucket is above zero and takes its estimated tokens (prompt + expected
output) from it, so a request larger than a minute's quota still runs once the bucket is full, and leaves it in
debt. Over quota: 429 `rate_limit_error`, code `quota_exceeded`, with `Retry-After` (when the bucket is above zero
again). A Batch API line (priority `batch`) run as its batch's owner's (api/batch/lines.py) carries the owner as
its tenant: it waits in fair order among the batch level's tenants and takes from the owner's quota, as the owner's
own requests do; a line of an old batch carries none (first come, first served at its level, no quota).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from starlette.requests import Request

from api.http.auth import KEY_STATE, KeyAttributes
from common.errors import OvqError
from common.fairness import TENANT_MAX_CHARS
from common.keys import Keys
from common.redis.lane import Lane, Script

USER_FIELD = "user_field"  # request.state's attribute: the body's `user`, as parse_body found it
BATCH_LINE = "batch_line"  # request.state's attribute: True for a batch line run as its owner's (api/batch/lines.py)

# KEYS: the tenant's bucket. ARGV: tokens per minute, the request's tokens.
# Returns 0 when let in (the tokens taken), else the milliseconds until the bucket is above zero again.
TAKE = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local rate = tonumber(ARGV[1])
local held = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(held[1]) or rate
local at = tonumber(held[2]) or ms
tokens = math.min(rate, tokens + (ms - at) * rate / 60000)
if tokens <= 0 then return math.ceil((1 - tokens) * 60000 / rate) end
tokens = tokens - tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'tokens', tokens, 'at', ms)
redis.call('PEXPIRE', KEYS[1], 120000 + math.ceil(math.max(0, -tokens) * 60000 / rate))
return 0
"""


@dataclass(frozen=True)
class Tenant:
    name: str
    weight: float = 1.0
    tokens_per_min: int | None = None


def tenant_of(request: Request) -> Tenant | None:
    """The API key's tenant (its weight and quota with it); with keys off, the `user` field's (weight 1, no quota);
    None for neither."""
    key: KeyAttributes | None = getattr(request.state, KEY_STATE, None)
    if key is not None:
        return Tenant(key.who[:TENANT_MAX_CHARS], key.weight, key.tokens_per_min)
    user = getattr(request.state, USER_FIELD, None)
    if isinstance(user, str) and user.strip():
        return Tenant(user.strip()[:TENANT_MAX_CHARS])
    return None


def scheduled_tenant(request: Request, priority: str) -> Tenant | None:
    """The tenant a job of this request is scheduled and held to quota as: `tenant_of`, except for a `batch` line
    that does not run as its batch's owner (an old batch, or keys off): none."""
    if priority == "batch" and not getattr(request.state, BATCH_LINE, False):
        return None
    return tenant_of(request)


class Quotas:
    def __init__(self, lane: Lane, keys: Keys) -> None:
        self.lane, self.keys = lane, keys
        self._take = Script(TAKE)

    async def take(self, tenant: Tenant, tokens: int) -> None:
        """Take `tokens` from the tenant's bucket; 429 with Retry-After when it is empty."""
        if tenant.tokens_per_min is None:
            return
        wait_ms = await self._take(self.lane, keys=[self.keys.quota(tenant.name)],
                                   args=[tenant.tokens_per_min, tokens])
        if wait_ms:
            error = OvqError(f"Tenant `{tenant.name}` is over its token-rate quota ({tenant.tokens_per_min} tokens per "
                             "minute); retry later", 429, "rate_limit_error", code="quota_exceeded")
            error.retry_after = max(1, math.ceil(int(wait_ms) / 1000))
            raise error
