"""Conversations in Redis: any API process can read, page, extend and delete any of them.

A conversation is three keys in one slot (common/keys.py): its hash (`created_at`, `metadata`, `owner`, `next`,
`bytes`), its items by id (a hash), and their order (a sorted set of ids scored by sequence number). So appending k
items costs O(k log N) whatever the conversation's length N, a page of n items O(n + log N) (the `after` id's rank,
then a range), retrieving or deleting one item O(log N), and a turn's whole history O(N), bounded by the caps
(`conversation_max_items`, `conversation_max_bytes`). Every write renews the three TTLs together
(`conversations_ttl_s`); appends and deletes of items run as scripts, so the count, the size and the order never
disagree, whichever API processes write at once.

Each conversation records its owner (common/owner.py) when it is created; one the caller may not see answers exactly
as a missing one, after the same reads.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

import orjson
import redis.asyncio as aioredis

from api.openai.conversations.protocol import Conversation
from common.errors import OvqError
from common.keys import Keys
from common.owner import OWNER_FIELD, Caller
from common.settings import Settings

MAX_PAGE = 1000  # the most items a page script reads: Lua's unpack() takes only so many (routes ask 100 at most)

# KEYS: the conversation, its items, its order. ARGV: ttl, max items, max bytes, strict, then id, JSON pairs.
# Strict (`items.create`): over a cap -> -2, an id already there -> -3, nothing written. Not strict (a response's
# turn, which ran already): written whatever the caps; an id already there is rewritten in place (its position
# kept), so appending the same turn twice (a background response saved by two API processes) adds it once.
APPEND = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local strict = ARGV[4] == '1'
local added, grown = 0, 0
for i = 5, #ARGV, 2 do
  local old = redis.call('HSTRLEN', KEYS[2], ARGV[i])
  if old == 0 then added = added + 1 elseif strict then return -3 end
  grown = grown + #ARGV[i + 1] - old
end
local count = redis.call('ZCARD', KEYS[3])
local size = tonumber(redis.call('HGET', KEYS[1], 'bytes') or '0')
if strict and (count + added > tonumber(ARGV[2]) or size + grown > tonumber(ARGV[3])) then return -2 end
local n = (#ARGV - 4) / 2
local first = redis.call('HINCRBY', KEYS[1], 'next', n) - n
for i = 5, #ARGV, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
  redis.call('ZADD', KEYS[3], 'NX', first + (i - 5) / 2, ARGV[i])
end
redis.call('HINCRBY', KEYS[1], 'bytes', grown)
for k = 1, 3 do redis.call('EXPIRE', KEYS[k], ARGV[1]) end
return 1
"""

# KEYS: the conversation, its items, its order. ARGV: how many items (at most MAX_PAGE), '1' for newest first,
# the id to start after ('' for none). Returns {the conversation's fields (FIELDS), its item count, 1 (or 0 when
# `after` is not in it), the items}: O(log N + n) for n items of N.
PAGE = """
local fields = redis.call('HMGET', KEYS[1], unpack(ARGV, 4))
local count = redis.call('ZCARD', KEYS[3])
local desc = ARGV[2] == '1'
local start = 0
if ARGV[3] ~= '' then
  local rank = desc and redis.call('ZREVRANK', KEYS[3], ARGV[3]) or redis.call('ZRANK', KEYS[3], ARGV[3])
  if not rank then return {fields, count, 0, {}} end
  start = rank + 1
end
local stop = start + tonumber(ARGV[1]) - 1
local ids = desc and redis.call('ZREVRANGE', KEYS[3], start, stop) or redis.call('ZRANGE', KEYS[3], start, stop)
if #ids == 0 then return {fields, count, 1, {}} end
return {fields, count, 1, redis.call('HMGET', KEYS[2], unpack(ids))}
"""
FIELDS = ["created_at", "metadata", OWNER_FIELD, "bytes"]

# KEYS: the conversation, its items, its order. ARGV: the item's id, ttl. 1 when it was there, else 0.
DELETE_ITEM = """
local size = redis.call('HSTRLEN', KEYS[2], ARGV[1])
if size == 0 then return 0 end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HINCRBY', KEYS[1], 'bytes', -size)
for k = 1, 3 do redis.call('EXPIRE', KEYS[k], ARGV[2]) end
return 1
"""


def conversation_not_found(conversation_id: str, param: str | None = None) -> OvqError:
    return OvqError(f"Conversation with id '{conversation_id}' not found.", 404, "invalid_request_error", param,
                    "not_found")


def item_not_found(item_id: str) -> OvqError:
    return OvqError(f"Item with id '{item_id}' not found.", 404, "invalid_request_error", code="not_found")


def too_large(conversation_id: str, count: int, size: int, settings: Settings, param: str) -> OvqError:
    return OvqError(f"Conversation '{conversation_id}' would hold {count} items ({size} bytes): more than a "
                    f"conversation may ({settings.conversation_max_items} items, conversation_max_items; "
                    f"{settings.conversation_max_bytes} bytes, conversation_max_bytes). Delete some of its items, or "
                    "start a new conversation.", param=param, code="conversation_too_large")


@dataclass
class Stored:
    """A conversation's hash as read: the object, its owner, and its item count and size."""

    conversation: Conversation
    owner: bytes | None
    count: int
    size: int


class ConversationStore:
    def __init__(self, redis: aioredis.Redis, keys: Keys, settings: Settings) -> None:
        self.redis, self.keys, self.settings = redis, keys, settings
        self.ttl_s = settings.conversations_ttl_s
        self._append = redis.register_script(APPEND)
        self._page = redis.register_script(PAGE)
        self._delete_item = redis.register_script(DELETE_ITEM)

    def _keys(self, conversation_id: str) -> list[str]:
        k = self.keys
        return [k.conversation(conversation_id), k.conversation_items(conversation_id),
                k.conversation_order(conversation_id)]

    async def create(self, conversation_id: str, items: list[dict[str, Any]], metadata: dict[str, str] | None,
                     owner: str) -> Conversation:
        """A new conversation with its first items (ids given), in one transaction."""
        encoded = {item["id"]: orjson.dumps(item) for item in items}
        if len(encoded) < len(items):
            raise OvqError("Item ids must be unique within a conversation.", param="items", code="duplicate_item_id")
        size = sum(map(len, encoded.values()))
        if len(items) > self.settings.conversation_max_items or size > self.settings.conversation_max_bytes:
            raise too_large(conversation_id, len(items), size, self.settings, "items")
        conversation = Conversation(id=conversation_id, created_at=int(time.time()), metadata=metadata or {})
        meta, items_key, order = self._keys(conversation_id)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(meta, mapping={"created_at": conversation.created_at, "metadata": orjson.dumps(conversation.metadata),
                                 OWNER_FIELD: owner, "next": len(items), "bytes": size})
        if items:
            pipe.hset(items_key, mapping=encoded)
            pipe.zadd(order, {item_id: i for i, item_id in enumerate(encoded)})
        for key in (meta, items_key, order):
            pipe.expire(key, self.ttl_s)
        await pipe.execute()
        return conversation

    async def get(self, conversation_id: str, caller: Caller, param: str | None = None) -> Stored:
        """The conversation, its owner, count and size; a 404 when there is none the caller may see."""
        meta, _, order = self._keys(conversation_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hmget(meta, ["created_at", "metadata", OWNER_FIELD, "bytes"])
        pipe.zcard(order)
        (created, metadata, owner, size), count = await pipe.execute()
        if created is None or not caller.sees(owner):
            raise conversation_not_found(conversation_id, param)
        return Stored(Conversation(id=conversation_id, created_at=int(created), metadata=orjson.loads(metadata)),
                      owner, count, int(size or 0))

    async def update(self, conversation_id: str, caller: Caller, metadata: dict[str, str] | None) -> Conversation:
        """Its metadata replaced whole; the TTLs renewed."""
        conversation = (await self.get(conversation_id, caller)).conversation
        conversation.metadata = metadata or {}
        meta, items_key, order = self._keys(conversation_id)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(meta, "metadata", orjson.dumps(conversation.metadata))
        for key in (meta, items_key, order):
            pipe.expire(key, self.ttl_s)
        await pipe.execute()
        return conversation

    async def delete(self, conversation_id: str, caller: Caller) -> None:
        """The conversation and its items (OpenAI keeps the items; nothing could reach them here: they go too)."""
        await self.get(conversation_id, caller)
        if not await self.redis.delete(*self._keys(conversation_id)):
            raise conversation_not_found(conversation_id)

    async def add(self, conversation_id: str, caller: Caller, items: list[dict[str, Any]]) -> None:
        """`items.create`: items (ids given) appended in order, within the caps; an id already in it is a 400."""
        stored = await self.get(conversation_id, caller)
        if len({item["id"] for item in items}) < len(items):
            raise OvqError("Item ids must be unique within a conversation.", param="items", code="duplicate_item_id")
        done = await self._write(conversation_id, items, strict=True)
        if done == -2:
            size = stored.size + sum(len(orjson.dumps(item)) for item in items)
            raise too_large(conversation_id, stored.count + len(items), size, self.settings, "items")
        if done == -3:
            raise OvqError(f"An item with one of these ids is already in conversation '{conversation_id}'.",
                           param="items", code="duplicate_item_id")
        if done == -1:  # deleted (or expired) since it was read
            raise conversation_not_found(conversation_id)

    async def append_turn(self, conversation_id: str, items: list[dict[str, Any]]) -> bool:
        """A response's input and output items, appended whatever the caps (it ran: its turn is never lost; its
        input was checked against them before it ran). False when the conversation is gone meanwhile."""
        return await self._write(conversation_id, items, strict=False) == 1

    async def _write(self, conversation_id: str, items: list[dict[str, Any]], strict: bool) -> int:
        args: list[Any] = [self.ttl_s, self.settings.conversation_max_items, self.settings.conversation_max_bytes,
                           "1" if strict else "0"]
        for item in items:
            args += [item["id"], orjson.dumps(item)]
        return int(await self._append(keys=self._keys(conversation_id), args=args))

    async def page(self, conversation_id: str, caller: Caller, limit: int | None,
                   order: Literal["asc", "desc"] = "desc", after: str | None = None,
                   param: str | None = None) -> tuple[Stored, list[dict[str, Any]], bool]:
        """Up to `limit` items after the item `after`, oldest or newest first, and whether more follow (None: all
        the items, `after` unused); with the conversation as `get` reads it (in the same round trip)."""
        keys = self._keys(conversation_id)
        if limit is None:  # every item: read as they are in one transaction, ordered here (O(N))
            pipe = self.redis.pipeline(transaction=True)
            pipe.hmget(keys[0], FIELDS)
            pipe.zrange(keys[2], 0, -1)
            pipe.hgetall(keys[1])
            (created, metadata, owner, size), ids, by_id = await pipe.execute()
            count, found = len(ids), 1
            items = [by_id.get(i) for i in (ids if order == "asc" else reversed(ids))]
        else:  # a page: one script, `limit` + 1 items (whether more follow)
            fields, count, found, items = await self._page(keys=keys, args=[
                min(limit, MAX_PAGE) + 1, "1" if order == "desc" else "0", after or "", *FIELDS])
            created, metadata, owner, size = fields
        if created is None or not caller.sees(owner):
            raise conversation_not_found(conversation_id, param)
        if not found:
            raise OvqError(f"No item with id '{after}' in conversation '{conversation_id}'.", param="after",
                           code="invalid_value")
        stored = Stored(Conversation(id=conversation_id, created_at=int(created), metadata=orjson.loads(metadata)),
                        owner, count, int(size or 0))
        found_items = [orjson.loads(item) for item in items if item is not None]
        if limit is None:
            return stored, found_items, False
        return stored, found_items[:limit], len(found_items) > limit

    async def item(self, conversation_id: str, caller: Caller, item_id: str) -> dict[str, Any]:
        meta, items_key, _ = self._keys(conversation_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hmget(meta, ["created_at", OWNER_FIELD])
        pipe.hget(items_key, item_id)
        (created, owner), item = await pipe.execute()
        if created is None or not caller.sees(owner):
            raise conversation_not_found(conversation_id)
        if item is None:
            raise item_not_found(item_id)
        loaded: dict[str, Any] = orjson.loads(item)
        return loaded

    async def delete_item(self, conversation_id: str, caller: Caller, item_id: str) -> Conversation:
        """The item removed; the conversation as it is then (OpenAI answers with it)."""
        conversation = (await self.get(conversation_id, caller)).conversation
        if not await self._delete_item(keys=self._keys(conversation_id), args=[item_id, self.ttl_s]):
            raise item_not_found(item_id)
        return conversation
