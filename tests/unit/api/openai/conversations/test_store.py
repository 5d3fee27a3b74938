"""Conversations on the real redis-server: items kept in order and paged both ways, the caps refusing before
anything is written, a turn appended once however often it is saved, the TTL on all three keys, owners."""
from __future__ import annotations

import time
from typing import Any

import pytest
import redis.asyncio as aioredis

from api.openai.conversations.store import ConversationStore
from common.errors import OvqError
from common.keys import Keys
from common.owner import Caller
from common.settings import Settings

TTL = 3600
A, B, ADMIN = Caller("a"), Caller("b"), Caller("ops", admin=True)


@pytest.fixture()
async def setup(redis_url: str):
    keys = Keys(f"unit{time.time_ns()}")
    redis = aioredis.Redis.from_url(redis_url)
    settings = Settings(conversations_ttl_s=TTL, conversation_max_items=8, conversation_max_bytes=2000)
    yield redis, keys, ConversationStore(redis, keys, settings)
    await redis.aclose()


def message(n: int, role: str = "user") -> dict[str, Any]:
    return {"type": "message", "id": f"msg_{n}", "role": role, "content": f"text {n}", "status": "completed"}


def ids(items: list[dict[str, Any]]) -> list[str]:
    return [item["id"] for item in items]


async def test_items_keep_their_order_and_page_both_ways(setup) -> None:
    redis, keys, store = setup
    await store.create("conv_1", [message(0), message(1)], {"k": "v"}, "a")
    await store.add("conv_1", A, [message(2), message(3), message(4)])
    _, page, more = await store.page("conv_1", A, 2, "asc")
    assert (ids(page), more) == (["msg_0", "msg_1"], True)
    _, page, more = await store.page("conv_1", A, 2, "asc", after="msg_1")
    assert (ids(page), more) == (["msg_2", "msg_3"], True)
    _, page, more = await store.page("conv_1", A, 2, "asc", after="msg_3")
    assert (ids(page), more) == (["msg_4"], False)
    _, page, more = await store.page("conv_1", A, 3, "desc", after="msg_4")
    assert (ids(page), more) == (["msg_3", "msg_2", "msg_1"], True)
    stored, everything, more = await store.page("conv_1", A, None, "asc")
    assert ids(everything) == [f"msg_{n}" for n in range(5)] and not more
    assert (stored.count, stored.conversation.metadata) == (5, {"k": "v"})
    with pytest.raises(OvqError) as caught:
        await store.page("conv_1", A, 2, "asc", after="msg_nothere")
    assert (caught.value.status, caught.value.body.param) == (400, "after")
    for key in (keys.conversation("conv_1"), keys.conversation_items("conv_1"), keys.conversation_order("conv_1")):
        assert 0 < await redis.ttl(key) <= TTL


async def test_the_caps_refuse_items_before_anything_is_written(setup) -> None:
    redis, keys, store = setup
    await store.create("conv_2", [message(n) for n in range(6)], None, "a")
    with pytest.raises(OvqError) as caught:  # 6 + 3 > 8 items
        await store.add("conv_2", A, [message(n) for n in range(6, 9)])
    assert (caught.value.status, caught.value.body.code) == (400, "conversation_too_large")
    with pytest.raises(OvqError) as caught:  # 2 items, but over 2000 bytes
        await store.add("conv_2", A, [{**message(10), "content": "x" * 1500}, message(11)])
    assert caught.value.body.code == "conversation_too_large"
    stored = await store.get("conv_2", A)
    assert stored.count == 6 and await redis.hlen(keys.conversation_items("conv_2")) == 6
    with pytest.raises(OvqError) as caught:  # an id already there
        await store.add("conv_2", A, [message(0)])
    assert caught.value.body.code == "duplicate_item_id"
    await store.add("conv_2", A, [message(6), message(7)])  # up to the cap exactly
    assert (await store.get("conv_2", A)).count == 8


async def test_a_turn_is_appended_once_however_often_it_is_saved_and_past_the_caps(setup) -> None:
    _, _, store = setup
    await store.create("conv_3", [message(n) for n in range(7)], None, "a")
    turn = [message(7), message(8, "assistant")]
    assert await store.append_turn("conv_3", turn)  # 9 items: a turn that ran is never lost
    assert await store.append_turn("conv_3", [message(9)])  # the next turn
    size = (await store.get("conv_3", A)).size
    assert await store.append_turn("conv_3", turn)  # the first saved again (another API process): nothing added
    stored, items, _ = await store.page("conv_3", A, None, "asc")
    assert ids(items) == [f"msg_{n}" for n in range(10)] and (stored.count, stored.size) == (10, size)
    with pytest.raises(OvqError):  # ... but nothing more goes in through items.create
        await store.add("conv_3", A, [message(9)])
    assert not await store.append_turn("conv_nothere", turn)


async def test_deleting_an_item_frees_its_place_and_its_bytes(setup) -> None:
    _, _, store = setup
    await store.create("conv_4", [message(0), message(1), message(2)], None, "a")
    before = (await store.get("conv_4", A)).size
    conversation = await store.delete_item("conv_4", A, "msg_1")
    assert conversation.id == "conv_4"
    stored, items, _ = await store.page("conv_4", A, None, "asc")
    assert ids(items) == ["msg_0", "msg_2"] and stored.size < before and stored.count == 2
    with pytest.raises(OvqError) as caught:
        await store.delete_item("conv_4", A, "msg_1")
    assert caught.value.status == 404 and "msg_1" in caught.value.body.message
    await store.delete("conv_4", A)
    with pytest.raises(OvqError) as caught:
        await store.get("conv_4", A)
    assert caught.value.status == 404


async def test_another_owners_conversation_is_exactly_a_missing_one(setup) -> None:
    _, _, store = setup
    await store.create("conv_5", [message(0)], None, "a")
    errors = []
    for conversation_id in ("conv_5", "conv_never"):
        for call in (lambda c: store.get(c, B), lambda c: store.page(c, B, 5), lambda c: store.item(c, B, "msg_0"),
                     lambda c: store.add(c, B, [message(1)]), lambda c: store.delete_item(c, B, "msg_0"),
                     lambda c: store.update(c, B, {}), lambda c: store.delete(c, B)):
            with pytest.raises(OvqError) as caught:
                await call(conversation_id)
            errors.append((caught.value.status, caught.value.body.message.replace(conversation_id, "ID")))
    assert errors[:7] == errors[7:] and {status for status, _ in errors} == {404}
    assert (await store.get("conv_5", ADMIN)).count == 1 and (await store.item("conv_5", A, "msg_0"))["id"] == "msg_0"
