"""api/batch/lines.py: a batch line whose batch cannot be looked up because Redis is away is a 503 with Retry-After
(which the batch worker sends again), never a 500 (which it would record as the line's answer)."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import redis

from api.batch.lines import HEADER, BatchLines
from api.http.auth import KeySet
from common.keys import Keys


class _AwayRedis:
    async def hmget(self, *args: Any) -> list[bytes | None]:
        raise redis.ConnectionError("Error -2 connecting to redis:6379. Name or service not known.")


async def _inner(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("a line whose batch cannot be looked up must not run")


async def test_a_line_while_redis_is_away_is_a_503_with_retry_after() -> None:
    registry = SimpleNamespace(redis=_AwayRedis(), keys=Keys("t"))
    scope = {"type": "http", "headers": [(HEADER, b"batch_1:token")],
             "app": SimpleNamespace(state=SimpleNamespace(registry=registry))}
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await BatchLines(_inner, KeySet(["sk-a"]))(scope, None, send)  # type: ignore[arg-type]
    assert sent[0]["status"] == 503
    assert (b"retry-after", b"2") in sent[0]["headers"]
    assert b'"code":"service_unavailable"' in sent[1]["body"]
