"""A Batch API line runs as its batch's owner (issue 37): its fair share, priority limit and token quota, not the
batch worker key's tenant.

The batch worker sends each line with the key it has (OVQ_BATCH_API_KEY) and `X-Ovq-Batch: BATCH_ID:RUN_TOKEN`
(workers/batch/runner.py). The token is a secret the API drew when it created the batch and keeps in the batch's
hash (common/batch/store.py), never in an answer: only what reads Redis (a batch worker) knows it. This middleware,
inside the key check, reads the batch's owner and token, and on a match makes the request the owner's: its key
attributes (the owner's first key: weight, quota, max_priority; an owner with no API key, as an admin key's batch
or a revoked key's, runs with the defaults under its own name) and its caller (common/owner.py). A wrong token is
refused (403); with API keys off there is one tenant and nothing to change.
"""
from __future__ import annotations

import hmac
import logging
from typing import Any

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from api.http.auth import CALLER_STATE, KEY_STATE, KeyAttributes, KeySet
from api.queue.tenant import BATCH_LINE
from common.batch.store import RUN_AS_HEADER
from common.owner import OWNER_FIELD, Caller
from common.redis.client import UNAVAILABLE

log = logging.getLogger("ovq.api")
HEADER = RUN_AS_HEADER.lower().encode()


def _given(scope: Scope) -> bytes | None:
    for name, value in scope["headers"]:
        if name == HEADER:
            return value
    return None


async def _answer(send: Send, status: int, error: dict[str, Any], headers: list[tuple[bytes, bytes]]) -> None:
    body = orjson.dumps({"error": error})
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


async def _refuse(send: Send, message: str) -> None:
    await _answer(send, 403, {"message": message, "type": "permission_error", "param": RUN_AS_HEADER,
                              "code": "batch_not_runnable"}, [])


async def _unavailable(send: Send) -> None:
    """Redis away while the line's batch is looked up: the 503 with Retry-After the app's own handler gives (this
    middleware runs outside it; before, the line got a 500 and counted as answered: seen in benchmarks/chaos.py's
    Sentinel failover). The batch worker sends a 503'd line again."""
    await _answer(send, 503, {"message": "The job queue is unavailable right now; retry shortly",
                              "type": "service_unavailable", "param": None, "code": "service_unavailable"},
                  [(b"retry-after", b"2")])


class BatchLines:
    def __init__(self, app: ASGIApp, api_keys: KeySet) -> None:
        self.app, self.api_keys = app, api_keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        given = _given(scope) if scope["type"] == "http" and self.api_keys else None
        if given is not None:
            try:
                refusal = await self._run_as_owner(scope, given)
            except UNAVAILABLE as exc:
                log.warning("Redis unavailable while a batch line's batch was looked up: %s", exc)
                return await _unavailable(send)
            if refusal is not None:
                return await _refuse(send, refusal)
        await self.app(scope, receive, send)

    async def _run_as_owner(self, scope: Scope, given: bytes) -> str | None:
        """Make the request its batch's owner's; why not, when it cannot be."""
        batch_id, _, token = given.decode("latin-1").strip().rpartition(":")
        registry: Any = scope["app"].state.registry
        owner, kept = await registry.redis.hmget(registry.keys.batch(batch_id), [OWNER_FIELD, "run_token"]) \
            if batch_id else (None, None)
        if kept is None or owner is None or not hmac.compare_digest(kept, token.encode("latin-1")):
            return f"{RUN_AS_HEADER} does not name a batch with that run token"
        tenant = owner.decode()
        attributes = self.api_keys.of_tenant(tenant) or KeyAttributes(key="", tenant=tenant)
        state = scope.setdefault("state", {})
        state[KEY_STATE], state[CALLER_STATE], state[BATCH_LINE] = attributes, Caller(tenant), True
        return None
