"""Stored responses in Redis: any API process can retrieve, list, delete and continue any of them.

One hash per response (`Keys.response`, its fields documented there), written once, when the response ends, in
one MULTI round trip that also renews the TTL of the chain it continues. Continuing a chain reads the previous
response's chain of ids and items, then every older response's items: two round trips, whatever the chain's
length. A response whose chain lost a member (deleted, or expired) cannot be continued: a 404 naming it.

Each response records its owner (common/owner.py) in the same write; one the caller may not see answers exactly as
a missing one (retrieve, delete, input items, previous_response_id).
"""
from __future__ import annotations

import logging
from typing import Any, Literal

import orjson
import redis.asyncio as aioredis

from api.openai.responses.protocol import Response, ResponsesRequest
from common.errors import OvqError
from common.keys import Keys
from common.owner import OWNER_FIELD, Caller
from common.settings import Settings

log = logging.getLogger("ovq.api.responses")
MAX_LIST = 100


def response_not_found(response_id: str) -> OvqError:
    return OvqError(f"Response with id '{response_id}' not found.", 404, "invalid_request_error", code="not_found")


class ResponseStore:
    def __init__(self, redis: aioredis.Redis, keys: Keys, settings: Settings) -> None:
        self.redis, self.keys = redis, keys
        self.ttl_s, self.max_bytes = settings.responses_ttl_s, settings.responses_max_bytes

    def check_input(self, body: ResponsesRequest) -> None:
        """A request to store whose input alone is over the cap is refused before anything runs."""
        if not body.store:
            return
        size = len(orjson.dumps([item.model_dump(by_alias=True, exclude_none=True) for item in body.items()]))
        if size > self.max_bytes:
            raise OvqError(f"The input takes {size} bytes: more than a stored response may ({self.max_bytes}, "
                           "responses_max_bytes). Send `store: false`, or a smaller input.", param="store",
                           code="input_too_large")

    async def history(self, previous_id: str, caller: Caller) -> tuple[list[str], list[dict[str, Any]]]:
        """The chain a response continuing `previous_id` joins (the ids, oldest first, `previous_id` last) and its
        items in order: each response's input items, then its output items (`convert.to_chat`'s history)."""
        chain_json, items_json, owner = await self.redis.hmget(self.keys.response(previous_id),
                                                               ["chain", "items", OWNER_FIELD])
        if chain_json is None or items_json is None or not caller.sees(owner):
            raise OvqError(f"Previous response with id '{previous_id}' not found.", 404, "invalid_request_error",
                           "previous_response_id", "previous_response_not_found")
        older: list[str] = orjson.loads(chain_json)
        pipe = self.redis.pipeline(transaction=False)
        for response_id in older:
            pipe.hget(self.keys.response(response_id), "items")
        found = await pipe.execute() if older else []
        items: list[dict[str, Any]] = []
        for response_id, stored in zip(older, found, strict=True):
            if stored is None:
                raise OvqError(f"Response with id '{response_id}', earlier in the chain of previous_response_id "
                               f"'{previous_id}', no longer exists (deleted or expired).", 404,
                               "invalid_request_error", "previous_response_id", "previous_response_not_found")
            items += orjson.loads(stored)
        return [*older, previous_id], items + orjson.loads(items_json)

    async def save(self, response: Response, items: list[dict[str, Any]], inputs: int, chain: list[str],
                   owner: str | None) -> bool:
        """Store a response that ended, with its items (`inputs` of them input), the chain it continues and its
        owner; the chain's TTLs are renewed with it. False when it is over the cap: then nothing is stored."""
        record: dict[str, Any] = {"response": orjson.dumps(response.model_dump(by_alias=True)),
                                  "items": orjson.dumps(items), "inputs": inputs, "chain": orjson.dumps(chain)}
        if owner is not None:  # (None: a background response recorded before owners were: it stays without one)
            record[OWNER_FIELD] = owner
        size = sum(len(v) for v in record.values() if isinstance(v, bytes))
        if size > self.max_bytes:
            log.warning("response %s not stored: %d bytes, over responses_max_bytes (%d)", response.id, size,
                        self.max_bytes)
            return False
        pipe = self.redis.pipeline(transaction=True)  # the hash appears whole, with its TTL
        key = self.keys.response(response.id)
        pipe.hset(key, mapping=record)
        pipe.expire(key, self.ttl_s)
        # On a Cluster each response has its own slot: the chain's are renewed beside the transaction, not in it.
        renew = self.redis.pipeline(transaction=False) if self.keys.cluster else pipe
        for earlier in chain:
            renew.expire(self.keys.response(earlier), self.ttl_s)
        await pipe.execute()
        if renew is not pipe:
            await renew.execute()
        return True

    async def stored(self, response_id: str, caller: Caller) -> bytes | None:
        """The stored response object, as JSON; None when there is none the caller may see."""
        stored, owner = await self.redis.hmget(self.keys.response(response_id), ["response", OWNER_FIELD])
        return stored if stored is not None and caller.sees(owner) else None

    async def get(self, response_id: str, caller: Caller) -> bytes:
        """The stored response object, as JSON."""
        stored = await self.stored(response_id, caller)
        if stored is None:
            raise response_not_found(response_id)
        return stored

    async def delete(self, response_id: str, caller: Caller) -> None:
        # A background response's record goes too: its journal must not bring it back (background.py). Its owner
        # is read first (from either: a running background response has no stored one yet); owners never change.
        pipe = self.redis.pipeline(transaction=False)
        pipe.hmget(self.keys.response(response_id), ["response", OWNER_FIELD])
        pipe.hmget(self.keys.background(response_id), ["job", OWNER_FIELD])
        (stored, owner), (job, background_owner) = await pipe.execute()
        if stored is None and job is None:
            raise response_not_found(response_id)
        if not caller.sees(owner if stored is not None else background_owner):
            raise response_not_found(response_id)
        if not await self.redis.delete(self.keys.response(response_id), self.keys.background(response_id)):
            raise response_not_found(response_id)

    async def input_items(self, response_id: str, caller: Caller, limit: int = 20,
                          order: Literal["asc", "desc"] = "desc", after: str | None = None) -> dict[str, Any]:
        """`GET /responses/{id}/input_items`: a page of the response's input items, as OpenAI lists them (newest
        first unless `order` is `asc`; `after`: the last id of the previous page)."""
        items_json, inputs, owner = await self.redis.hmget(self.keys.response(response_id),
                                                           ["items", "inputs", OWNER_FIELD])
        if items_json is None or inputs is None or not caller.sees(owner):
            raise response_not_found(response_id)
        items: list[dict[str, Any]] = orjson.loads(items_json)[:int(inputs)]
        if order == "desc":
            items.reverse()
        if after is not None:
            ids = [item.get("id") for item in items]
            if after not in ids:
                raise OvqError(f"No input item with id '{after}' in response '{response_id}'.", param="after")
            items = items[ids.index(after) + 1:]
        page = [_listed(item) for item in items[:limit]]
        return {"object": "list", "data": page, "first_id": page[0].get("id") if page else None,
                "last_id": page[-1].get("id") if page else None, "has_more": len(items) > limit}


def _listed(item: dict[str, Any]) -> dict[str, Any]:
    """An input item as OpenAI lists it: a message's text as one part (the SDK's item types take no string)."""
    content = item.get("content")
    if item.get("type") != "message" or not isinstance(content, str):
        return item
    part = {"type": "output_text", "text": content, "annotations": []} if item.get("role") == "assistant" else \
        {"type": "input_text", "text": content}
    return {**item, "content": [part]}
