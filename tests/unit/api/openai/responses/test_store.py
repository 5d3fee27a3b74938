"""Stored responses on the real redis-server: written whole with a TTL, chains read back in order, pages listed."""
from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis

from api.openai.parsers import Parsed
from api.openai.responses.chain import Chain
from api.openai.responses.convert import stored_items, to_chat
from api.openai.responses.events import ResponseStream, initial_response
from api.openai.responses.protocol import Response, ResponsesRequest
from api.openai.responses.store import ResponseStore
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
    yield redis, keys, ResponseStore(redis, keys, Settings(responses_ttl_s=TTL, responses_max_bytes=4096))
    await redis.aclose()


def turn(text: str, answer: str, previous: str | None = None, **fields) -> tuple[ResponsesRequest, Response]:
    body = ResponsesRequest.model_validate({"model": "m", "input": text, "previous_response_id": previous, **fields})
    return body, ResponseStream(initial_response(body)).whole(Parsed(answer, None, []), "stop")


async def save(store: ResponseStore, body: ResponsesRequest, response: Response, chain: Chain | None = None,
               owner: str | None = "a", tokens: list[int] | None = None) -> bool:
    items = stored_items(body, response)
    return await store.save(response, items, len(items) - len(response.output), chain or Chain(), owner, tokens)


async def test_a_chain_reads_back_as_the_conversation_in_order(setup) -> None:
    redis, keys, store = setup
    chain = Chain()
    previous = None
    for i in range(3):
        body, response = turn(f"question {i}", f"answer {i}", previous)
        if previous:
            chain = (await store.history(previous, A)).chain
        assert await save(store, body, response, chain)
        previous = response.id
    history = await store.history(previous, A)
    ids = history.chain.ids
    assert len(ids) == 3 and ids[-1] == previous
    messages = to_chat(ResponsesRequest(model="m", input="next"), history.items).messages
    assert [(m.role, m.content) for m in messages] == [
        ("user", "question 0"), ("assistant", "answer 0"), ("user", "question 1"), ("assistant", "answer 1"),
        ("user", "question 2"), ("assistant", "answer 2"), ("user", "next")]
    for response_id in ids:
        assert 0 < await redis.ttl(keys.response(response_id)) <= TTL


async def test_chaining_renews_the_windows_ttl(setup) -> None:
    redis, keys, store = setup
    body, first = turn("a", "b")
    await save(store, body, first)
    await redis.expire(keys.response(first.id), 5)
    body, second = turn("c", "d", first.id)
    await save(store, body, second, (await store.history(first.id, A)).chain)
    assert await redis.ttl(keys.response(first.id)) > 5


async def test_an_unknown_previous_response_or_a_lost_member_is_404(setup) -> None:
    _, _, store = setup
    with pytest.raises(OvqError, match="Previous response with id 'resp_x' not found") as caught:
        await store.history("resp_x", A)
    assert (caught.value.status, caught.value.body.param) == (404, "previous_response_id")
    body, first = turn("a", "b")
    await save(store, body, first)
    body, second = turn("c", "d", first.id)
    await save(store, body, second, (await store.history(first.id, A)).chain)
    await store.delete(first.id, A)
    with pytest.raises(OvqError, match=first.id) as caught:
        await store.history(second.id, A)
    assert caught.value.status == 404


async def test_get_and_delete(setup) -> None:
    _, _, store = setup
    body, response = turn("a", "b", metadata={"k": "v"})
    await save(store, body, response)
    assert Response.model_validate_json(await store.get(response.id, A)) == response
    await store.delete(response.id, A)
    for call in (store.get, store.delete):
        with pytest.raises(OvqError, match=f"Response with id '{response.id}' not found") as caught:
            await call(response.id, A)
        assert caught.value.status == 404


async def test_input_items_are_pages_of_the_input_only(setup) -> None:
    _, _, store = setup
    body = ResponsesRequest.model_validate({"model": "m", "input": [
        {"role": "user", "content": "one"}, {"role": "assistant", "content": "two"},
        {"role": "user", "content": [{"type": "input_text", "text": "three"}]}]})
    response = ResponseStream(initial_response(body)).whole(Parsed("answer", None, []), "stop")
    await save(store, body, response)
    listed = await store.input_items(response.id, A)
    assert [item["content"][0]["text"] for item in listed["data"]] == ["three", "two", "one"]
    assert listed["data"][1]["content"][0] == {"type": "output_text", "text": "two", "annotations": []}
    assert all(item["status"] == "completed" for item in listed["data"])
    assert (listed["object"], listed["has_more"], listed["first_id"], listed["last_id"]) == \
        ("list", False, listed["data"][0]["id"], listed["data"][2]["id"])
    page = await store.input_items(response.id, A, limit=2, order="asc")
    assert ([i["content"][0]["text"] for i in page["data"]], page["has_more"]) == (["one", "two"], True)
    rest = await store.input_items(response.id, A, limit=2, order="asc", after=page["last_id"])
    assert ([i["content"][0]["text"] for i in rest["data"]], rest["has_more"]) == (["three"], False)
    with pytest.raises(OvqError, match="No input item"):
        await store.input_items(response.id, A, after="msg_nope")


async def test_the_size_cap(setup) -> None:
    redis, keys, store = setup
    big = ResponsesRequest.model_validate({"model": "m", "input": "x" * 5000})
    with pytest.raises(OvqError, match="responses_max_bytes") as caught:
        store.check_input(big)
    assert caught.value.body.param == "store"
    store.check_input(big.model_copy(update={"store": False}))  # not stored: no cap
    body, response = turn("short", "y" * 5000)  # the output takes it over: not stored
    assert not await save(store, body, response)
    assert not await redis.exists(keys.response(response.id))


async def test_another_tenants_response_is_a_missing_one(setup) -> None:
    """Retrieve, input items, previous_response_id and delete answer B exactly as for an id that never existed."""
    _, _, store = setup
    body, response = turn("a's question", "a's answer")
    await save(store, body, response, owner="a")
    old_body, old = turn("legacy", "legacy")
    await save(store, old_body, old, owner=None)  # stored before owners were: the admin's only

    async def refusals(response_id: str, caller: Caller) -> list[tuple[int, dict]]:
        out = []
        for call in (store.get, store.delete, store.input_items, store.history):
            with pytest.raises(OvqError) as caught:
                await call(response_id, caller)
            out.append((caught.value.status, caught.value.body.model_dump()))
        return out

    missing = await refusals("resp_never", B)
    assert await refusals(response.id, B) == [(s, {**e, "message": e["message"].replace("resp_never", response.id)})
                                              for s, e in missing]
    assert await refusals(old.id, A) == [(s, {**e, "message": e["message"].replace("resp_never", old.id)})
                                         for s, e in missing]
    assert Response.model_validate_json(await store.get(response.id, A)) == response  # untouched by B's delete
    assert Response.model_validate_json(await store.get(old.id, ADMIN)) == old
    assert (await store.history(response.id, ADMIN)).chain.ids == [response.id]


async def test_a_long_chain_reads_its_window_only_and_without_truncation_is_a_400(setup) -> None:
    """Each response records the newest responses a prompt could reach (here a 1,000-token context, 100 tokens a
    turn): a continuation reads those, with a budget only those its budget reaches; without one the chain that no
    prompt holds whole is OpenAI's context_length_exceeded."""
    _, _, store = setup
    chain, previous = Chain(), None
    for i in range(30):
        body, response = turn(f"q{i}", f"a{i}", previous)
        if previous:
            chain = (await store.history(previous, A, budget=10_000)).chain.fitted(1000)
        assert await save(store, body, response, chain, tokens=[50, 50])
        previous = response.id
    history = await store.history(previous, A, budget=10_000)
    assert len(history.chain.window) == 11 and history.chain.depth == 30  # 10 reach 1,000 tokens, then previous
    assert [i["content"] for i in history.items[::2]] == [f"q{i}" for i in range(19, 30)]
    assert history.tokens == [50] * 22
    few = await store.history(previous, A, budget=250)
    assert [i["content"] for i in few.items[::2]] == ["q27", "q28", "q29"]
    with pytest.raises(OvqError) as caught:
        await store.history(previous, A)
    assert (caught.value.status, caught.value.body.code) == (400, "context_length_exceeded")
