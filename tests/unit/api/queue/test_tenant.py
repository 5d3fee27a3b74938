"""Tenants and their token-rate quotas: the bucket script on the real redis-server."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import redis.asyncio as aioredis

from api.http.auth import KEY_STATE, KeyAttributes
from api.queue.tenant import USER_FIELD, Quotas, Tenant, tenant_of
from common.errors import OvqError
from common.keys import Keys
from common.redis.lane import Lane


def request(**state: object) -> SimpleNamespace:
    return SimpleNamespace(state=SimpleNamespace(**state))


def test_the_tenant_is_the_keys_else_the_user_fields() -> None:
    key = KeyAttributes(key="sk-1", name="team-a", weight=2, tokens_per_min=100)
    assert tenant_of(request(**{KEY_STATE: key, USER_FIELD: "bob"})) == Tenant("team-a", 2, 100)  # type: ignore[arg-type]
    assert tenant_of(request(**{USER_FIELD: "bob"})) == Tenant("bob")  # type: ignore[arg-type]
    assert tenant_of(request(**{USER_FIELD: 7})) is None  # type: ignore[arg-type]
    assert tenant_of(request()) is None  # type: ignore[arg-type]


async def test_over_quota_is_429_with_retry_after_until_the_bucket_refills(redis_url: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    keys = Keys(f"quota{time.time_ns()}")
    lane = Lane(redis)
    quotas = Quotas(lane, keys)
    tenant = Tenant("t", tokens_per_min=6000)  # 100 tokens a second
    await quotas.take(tenant, 4000)
    await quotas.take(tenant, 4000)  # the bucket was above zero: let in, now in debt
    with pytest.raises(OvqError) as caught:
        await quotas.take(tenant, 10)
    error = caught.value
    assert (error.status, error.body.type, error.body.code) == (429, "rate_limit_error", "quota_exceeded")
    assert error.retry_after is not None and 1 <= error.retry_after <= 21  # 2000 tokens of debt at 100/s
    assert 0 < await redis.pttl(keys.quota("t")) <= 120_000 + 21_000
    await quotas.take(Tenant("t"), 10**9)  # no quota: nothing counted
    await quotas.take(Tenant("other", tokens_per_min=6000), 10)  # another tenant's bucket is its own
    await lane.close()
    await redis.aclose()
