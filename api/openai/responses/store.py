"""Stored responses in Redis: any API process can retrieve, list, delete and continue any of them.

One hash per response (`Keys.response`, its fields documented there), written once, when the response ends, in
one MULTI round trip that also renews the TTL of the responses it may still need (its window: chain.py).
Continuing a chain reads the previous response's window and items, then the items of the window's responses a
prompt can reach: two round trips, and never more than a context's worth of responses, whatever the chain's
length. A response whose window lost a member (deleted, or expired) cannot be continued: a 404 naming it.

Each response records its owner (common/owner.py) in the same write; one the caller may not see answers exactly as
a missing one (retrieve, delete, input items, previous_response_id).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
import redis.asyncio as aioredis

from api.openai.responses.chain import Chain
from api.openai.responses.protocol import Response, ResponsesRequest
from common.errors import OvqError
from common.keys import Keys
from common.owner import OWNER_FIELD, Caller
from common.settings import Settings

log = logging.getLogger("ovq.api.responses")
MAX_LIST = 100


@dataclass
class History:
    """A continuation's chain and the items it read, oldest first, with each item's token count (None: unknown)."""

    chain: Chain
    items: list[dict[str, Any]] = field(default_factory=list)
    tokens: list[int | None] = field(default_factory=list)

    def add(self, items: list[dict[str, Any]], tokens: list[int | None]) -> None:
        self.items += items
        self.tokens += tokens


def context_exceeded() -> OvqError:
    """OpenAI's answer to an input over the context with `truncation: disabled`."""
    return OvqError("Your input exceeds the context window of this model. Please adjust your input and try again, "
                    "or send `truncation: auto`.", param="input", code="context_length_exceeded")


def _counted(items_json: bytes, tokens_json: bytes | None) -> tuple[list[dict[str, Any]], list[int | None]]:
    items: list[dict[str, Any]] = orjson.loads(items_json)
    tokens = orjson.loads(tokens_json) if tokens_json is not None else None
    return items, tokens if tokens is not None and len(tokens) == len(items) else [None] * len(items)


def _sum(tokens: list[int | None]) -> int | None:
    return None if any(t is None for t in tokens) else sum(t for t in tokens if t is not None)


def _needed(window: list[tuple[str, int | None]], budget: int | None, newest: int | None) -> list[str]:
    """The ids of `window` (oldest first) a prompt of `budget` tokens could reach after the newest response's
    `newest` tokens: all of them without a budget, or where a count is unknown."""
    if budget is None or newest is None:
        return [response_id for response_id, _ in window]
    total, keep = newest, 0
    for _, tokens in reversed(window):
        if total >= budget:
            break
        if tokens is None:
            return [response_id for response_id, _ in window]
        total += tokens
        keep += 1
    return [response_id for response_id, _ in window[len(window) - keep:]]


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

    async def history(self, previous_id: str, caller: Caller, budget: int | None = None) -> History:
        """What a response continuing `previous_id` joins: its chain (`chain.py`: the previous response's window,
        then the previous response) and the items of that chain's responses in order, each response's input items
        then its output items (`convert.to_chat`'s history), with their token counts.

        Without `budget` every response of the window is read, and a chain longer than any prompt is a 400
        (`truncation: disabled`); with it, only the newest responses whose counts reach `budget` tokens (what
        `truncation: auto` may keep). Two round trips, whatever the chain's length."""
        fields = await self.redis.hmget(self.keys.response(previous_id),
                                        ["window", "depth", "chain", "items", "tokens", OWNER_FIELD])
        window_json, depth, chain_json, items_json, tokens_json, owner = fields
        if items_json is None or (window_json is None and chain_json is None) or not caller.sees(owner):
            raise OvqError(f"Previous response with id '{previous_id}' not found.", 404, "invalid_request_error",
                           "previous_response_id", "previous_response_not_found")
        items, tokens = _counted(items_json, tokens_json)
        chain = Chain.of(orjson.loads(window_json if window_json is not None else chain_json),
                         int(depth) if depth is not None else None).then(previous_id, _sum(tokens))
        if budget is None and chain.cut:
            raise context_exceeded()
        older = _needed(chain.window[:-1], budget, _sum(tokens))
        pipe = self.redis.pipeline(transaction=False)
        for response_id in older:
            pipe.hmget(self.keys.response(response_id), ["items", "tokens"])
        found = await pipe.execute() if older else []
        history = History(chain)
        for response_id, (stored, counts) in zip(older, found, strict=True):
            if stored is None:
                raise OvqError(f"Response with id '{response_id}', earlier in the chain of previous_response_id "
                               f"'{previous_id}', no longer exists (deleted or expired).", 404,
                               "invalid_request_error", "previous_response_id", "previous_response_not_found")
            history.add(*_counted(stored, counts))
        history.add(items, tokens)
        return history

    async def save(self, response: Response, items: list[dict[str, Any]], inputs: int, chain: Chain,
                   owner: str | None, tokens: list[int] | None = None) -> bool:
        """Store a response that ended, with its items (`inputs` of them input, `tokens` their counts), the chain
        it continues and its owner; the TTLs of the chain's window are renewed with it (older responses are out
        of any prompt's reach: they keep their own). False when it is over the cap: then nothing is stored."""
        record: dict[str, Any] = {"response": orjson.dumps(response.model_dump(by_alias=True)),
                                  "items": orjson.dumps(items), "inputs": inputs,
                                  "window": orjson.dumps(chain.dumped()), "depth": chain.depth}
        if tokens is not None:
            record["tokens"] = orjson.dumps(tokens)
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
        # On a Cluster each response has its own slot: the window's are renewed beside the transaction, not in it.
        renew = self.redis.pipeline(transaction=False) if self.keys.cluster else pipe
        for earlier in chain.ids:
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
