"""Routing rules on fakeredis: pure key logic."""
from __future__ import annotations

import time

import fakeredis
import pytest

from api.registry import Registry
from common.errors import OvqError
from common.keys import Keys
from common.modelcard import ModelCard
from common.servable import ServableType
from common.settings import Settings

KEYS = Keys("t")


def card(device: str) -> str:
    return ModelCard(name="m", device=device, servable_type=ServableType.LM_CB, context_length=64,
                     chat_template="x", created=0).model_dump_json()


@pytest.fixture()
async def registry():
    redis = fakeredis.FakeAsyncRedis()
    yield redis, Registry(redis, KEYS, Settings(max_queue_depth=3), expected=["expected"])
    await redis.aclose()


async def test_unknown_model_is_404_and_expected_but_unserved_is_503(registry) -> None:
    _, reg = registry
    with pytest.raises(OvqError) as caught:
        await reg.route("nope")
    assert caught.value.status == 404
    with pytest.raises(OvqError) as caught:
        await reg.route("expected")
    assert caught.value.status == 503


async def test_shortest_backlog_among_live_devices_wins(registry) -> None:
    redis, reg = registry
    await redis.hset(KEYS.model("m"), mapping={"GPU": card("GPU"), "CPU": card("CPU"), "NPU": card("NPU")})
    now = time.time()
    await redis.zadd(KEYS.workers("m", "GPU"), {"g": now})
    await redis.zadd(KEYS.workers("m", "CPU"), {"c": now})
    await redis.zadd(KEYS.workers("m", "NPU"), {"n": now - 600})  # dead: its backlog does not matter
    await redis.xadd(KEYS.jobs("m", "GPU"), {"job": b"1"})
    assert (await reg.route("m")).stream == KEYS.jobs("m", "CPU")
    await redis.xadd(KEYS.jobs("m", "CPU"), {"job": b"1"})
    assert (await reg.route("m")).stream == KEYS.jobs("m", "GPU")  # a tie: the first announced


async def test_full_backlog_is_429_and_no_live_worker_is_503(registry) -> None:
    redis, reg = registry
    await redis.hset(KEYS.model("m"), "CPU", card("CPU"))
    with pytest.raises(OvqError) as caught:
        await reg.route("m")
    assert caught.value.status == 503
    await redis.zadd(KEYS.workers("m", "CPU"), {"c": time.time()})
    for _ in range(3):
        await redis.xadd(KEYS.jobs("m", "CPU"), {"job": b"1"})
    with pytest.raises(OvqError) as caught:
        await reg.route("m")
    assert caught.value.status == 429
