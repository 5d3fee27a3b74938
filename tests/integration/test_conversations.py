"""The Conversations API end to end with the official `openai` SDK (and the OpenAI Agents SDK's
`OpenAIConversationsSession`): conversations and their items created, paged, retrieved, updated and deleted from any
API process; a response with `conversation` answers as chat does to the conversation's items and its input, and
adds its turn (whole, streamed and background; the background one once however often it is saved); OpenAI's
errors. Every response is checked against the Open Responses schemas."""
from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from tests import openresponses
from tests.conftest import MODEL, ROOT, Stack, free_port
from tests.integration import test_open_responses as spec
from tests.integration.test_responses import GREEDY, chat_text

NAME = "My name is Ada. Say hello to me."
ASK = "What is my name?"
# Each answer ends at its first line: the Agents SDK (0.24 on) raises on a response that ends `incomplete`, and
# whether this model stops by itself within a budget depends on the CPU's numerics (at f32 it repeats "Ada,").
STOP = ["\n"]


@pytest.fixture(scope="module")
def other(stack: Stack) -> Iterator[OpenAI]:
    """A client of a second API process on the stack's Redis: a conversation is any API process's."""
    port = free_port()
    log = stack.logs / "conversations-api.log"
    env = {**stack.env, "OVQ_PORT": str(port), "OVQ_API_PROCESSES": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "api"], env=env, cwd=ROOT, stdout=log.open("wb"),
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the second API did not start"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)
    finally:
        proc.terminate()
        proc.wait(15)


def texts(items: Any) -> list[tuple[str, str]]:
    """(role, text) of listed message items."""
    return [(item.role, "".join(part.text for part in item.content)) for item in items]


def test_a_conversation_is_created_retrieved_updated_and_deleted_on_any_api_process(client: OpenAI,
                                                                                    other: OpenAI) -> None:
    created = client.conversations.create(items=[{"role": "user", "content": "Hello"}], metadata={"topic": "demo"})
    assert created.id.startswith("conv_") and created.object == "conversation"
    assert created.metadata == {"topic": "demo"} and created.created_at <= time.time()
    assert other.conversations.retrieve(created.id).model_dump() == created.model_dump()
    updated = other.conversations.update(created.id, metadata={"topic": "changed", "user": "ada"})
    assert updated.metadata == {"topic": "changed", "user": "ada"}
    assert client.conversations.retrieve(created.id).metadata == updated.metadata
    deleted = client.conversations.delete(created.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (created.id, "conversation.deleted", True)
    for call in (lambda: other.conversations.retrieve(created.id), lambda: client.conversations.delete(created.id),
                 lambda: other.conversations.items.list(created.id)):
        with pytest.raises(openai.NotFoundError, match=created.id):
            call()
    assert client.conversations.create().metadata == {}  # no items, no metadata


def test_items_are_added_paged_both_ways_retrieved_and_deleted(client: OpenAI, other: OpenAI) -> None:
    conversation = client.conversations.create(items=[{"role": "user", "content": f"Say {n}."} for n in (0, 1)])
    added = other.conversations.items.create(conversation.id, items=[
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Two."}]},
        {"role": "user", "content": [{"type": "input_text", "text": "Say 3."}]},
        {"type": "message", "role": "user", "content": "Say 4."}])
    assert added.object == "list" and len(added.data) == 3 and not added.has_more
    assert (added.first_id, added.last_id) == (added.data[0].id, added.data[-1].id)
    assert all(item.id.startswith("msg_") and item.status == "completed" for item in added.data)
    expected = [("user", "Say 0."), ("user", "Say 1."), ("assistant", "Two."), ("user", "Say 3."), ("user", "Say 4.")]
    assert texts(client.conversations.items.list(conversation.id, order="asc")) == expected  # one page
    newest = client.conversations.items.list(conversation.id, limit=2)  # newest first by default
    assert texts(newest.data) == expected[:2:-1] and newest.has_more
    assert texts(client.conversations.items.list(conversation.id, order="asc", limit=2)) == expected  # every page
    after = client.conversations.items.list(conversation.id, order="asc", after=added.first_id, limit=10)
    assert texts(after.data) == expected[3:] and not after.has_more
    one = other.conversations.items.retrieve(added.data[0].id, conversation_id=conversation.id)
    assert one.model_dump() == added.data[0].model_dump()
    after_delete = client.conversations.items.delete(added.data[0].id, conversation_id=conversation.id)
    assert after_delete.id == conversation.id and after_delete.object == "conversation"
    assert texts(other.conversations.items.list(conversation.id, order="asc")) == expected[:2] + expected[3:]
    with pytest.raises(openai.NotFoundError, match=added.data[0].id):
        client.conversations.items.retrieve(added.data[0].id, conversation_id=conversation.id)
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.delete(added.data[0].id, conversation_id=conversation.id)


def test_a_response_in_a_conversation_answers_to_its_items_and_adds_its_turn(stack: Stack, client: OpenAI,
                                                                            other: OpenAI) -> None:
    """The conversation's items are the response's history (the answer and its prompt are chat's for the same
    messages); its input and output items are added after it, with the response's ids; the next turn, streamed on
    /v3 by another API process with `{"id": ...}`, reads them. Every response and event is a valid Open Responses
    one."""
    conversation = client.conversations.create(items=[{"role": "user", "content": NAME}])
    first = spec.create(stack, "/v1", {"model": MODEL, "input": "Hello!", "conversation": conversation.id, **GREEDY})
    assert first["conversation"] == {"id": conversation.id} and first["previous_response_id"] is None
    text, prompt_tokens = chat_text(client, [{"role": "user", "content": NAME}, {"role": "user", "content": "Hello!"}])
    assert (first["output"][0]["content"][0]["text"], first["usage"]["input_tokens"]) == (text, prompt_tokens)
    items = client.conversations.items.list(conversation.id, order="asc").data
    assert texts(items) == [("user", NAME), ("user", "Hello!"), ("assistant", text)]
    assert items[2].id == first["output"][0]["id"]
    assert items[1].id == client.responses.input_items.list(first["id"]).data[0].id  # the same input item
    counted = other.responses.input_tokens.count(model=MODEL, input=ASK, conversation=conversation.id).input_tokens
    events = spec.stream(stack, "/v3", {"model": MODEL, "input": ASK, "conversation": {"id": conversation.id},
                                        **GREEDY}, url=None)
    second = spec.final(events)
    assert second["conversation"] == {"id": conversation.id} and second["usage"]["input_tokens"] == counted
    text, prompt_tokens = chat_text(client, [{"role": "user", "content": NAME}, {"role": "user", "content": "Hello!"},
                                             {"role": "assistant", "content": text}, {"role": "user", "content": ASK}])
    assert (second["output"][0]["content"][0]["text"], second["usage"]["input_tokens"]) == (text, prompt_tokens)
    listed = other.conversations.items.list(conversation.id, order="asc").data
    assert texts(listed)[3:] == [("user", ASK), ("assistant", text)] and len(listed) == 5
    stored = httpx.get(stack.url(f"/v1/responses/{second['id']}"), timeout=30).json()
    openresponses.response(stored)
    assert stored["conversation"] == {"id": conversation.id}


def test_a_background_response_in_a_conversation_adds_its_turn_once(client: OpenAI) -> None:
    """Any API process that sees a background response end stores it and adds its turn (the keeper, a retrieve, a
    cancel, a stream read again): the turn is in the conversation once."""
    conversation = client.conversations.create(items=[{"role": "user", "content": NAME}])
    created = client.responses.create(input=ASK, conversation=conversation.id, background=True, **GREEDY)
    assert created.status == "queued" and created.conversation.id == conversation.id
    deadline, current = time.monotonic() + 60, created
    while current.status in ("queued", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.1)
        current = client.responses.retrieve(created.id)
    assert current.status == "completed"
    for _ in range(2):  # each folds the journal again, sees the end, and saves it
        assert client.responses.cancel(created.id).status == "completed"
        assert list(client.responses.retrieve(created.id, stream=True))[-1].type == "response.completed"
    items = client.conversations.items.list(conversation.id, order="asc").data
    assert texts(items) == [("user", NAME), ("user", ASK), ("assistant", current.output_text)]
    assert items[2].id == current.output[0].id
    text, _ = chat_text(client, [{"role": "user", "content": NAME}, {"role": "user", "content": ASK}])
    assert current.output_text == text


def test_conversation_errors_are_openais(stack: Stack, client: OpenAI) -> None:
    conversation = client.conversations.create(items=[{"role": "user", "content": NAME}])
    first = client.responses.create(input=ASK, **GREEDY)
    with pytest.raises(openai.BadRequestError) as caught:  # as OpenAI: one or the other
        client.responses.create(input=ASK, conversation=conversation.id, previous_response_id=first.id, **GREEDY)
    assert (caught.value.body["code"], caught.value.body["param"]) == ("mutually_exclusive_parameters", None)
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(input=ASK, conversation="conv_nosuchconversation", **GREEDY)
    assert caught.value.body["param"] == "conversation"
    with pytest.raises(openai.BadRequestError, match="begins with 'conv_'"):
        client.responses.create(input=ASK, conversation="resp_123", **GREEDY)
    with pytest.raises(openai.BadRequestError) as caught:  # an item already in it
        item = client.conversations.items.list(conversation.id).data[0]
        client.responses.create(input=[{"type": "message", "id": item.id, "role": "user", "content": "Hi"}],
                                conversation=conversation.id, **GREEDY)
    assert caught.value.body["code"] == "duplicate_item_id"
    with pytest.raises(openai.BadRequestError) as caught:
        client.conversations.items.create(conversation.id, items=[{"role": "user", "content": "x"}] * 21)
    assert caught.value.body["param"] == "items"
    with pytest.raises(openai.BadRequestError) as caught:
        client.conversations.create(items=[{"type": "message", "role": "robot", "content": "x"}])
    assert caught.value.body["param"].startswith("items[0]")
    with pytest.raises(openai.BadRequestError) as caught:
        client.conversations.items.list(conversation.id, order="sideways")  # type: ignore[arg-type]
    assert caught.value.body["param"] == "order"
    with pytest.raises(openai.BadRequestError) as caught:
        client.conversations.items.list(conversation.id, include=["everything"])  # type: ignore[list-item]
    assert caught.value.body["param"] == "include[0]"
    with pytest.raises(openai.BadRequestError) as caught:
        client.conversations.items.list(conversation.id, after="msg_nothere")
    assert caught.value.body["param"] == "after"
    with pytest.raises(openai.BadRequestError) as caught:
        client.conversations.update(conversation.id, metadata={f"k{i}": "v" for i in range(17)})
    assert caught.value.body["param"] == "metadata"
    reply = httpx.get(stack.url("/v1/conversations/conv_nosuchconversation"), timeout=30)
    assert reply.status_code == 404 and set(reply.json()["error"]) == {"message", "type", "param", "code"}
    # Nothing refused was added.
    assert len(client.conversations.items.list(conversation.id).data) == 1


async def test_the_agents_sdks_conversations_session_remembers_over_two_turns(stack: Stack, client: OpenAI) -> None:
    """The Agents SDK's `OpenAIConversationsSession`, unchanged, keeps an agent's memory in a conversation here:
    the second turn's model input is the first turn's items and the new question (its answer and prompt are chat's
    for those messages), and the conversation holds both turns."""
    from agents import Agent, ModelSettings, Runner, set_tracing_disabled
    from agents.memory import OpenAIConversationsSession
    from agents.models.openai_responses import OpenAIResponsesModel
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    sdk = AsyncOpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=120)
    session = OpenAIConversationsSession(openai_client=sdk)
    agent = Agent(name="memory", instructions="Answer in a few words.",
                  model=OpenAIResponsesModel(model=MODEL, openai_client=sdk),
                  model_settings=ModelSettings(temperature=0, max_tokens=64, extra_body={"stop": STOP}))
    first = await Runner.run(agent, NAME, session=session)
    second = await Runner.run(agent, ASK, session=session)
    system = {"role": "system", "content": "Answer in a few words."}
    text, prompt_tokens = chat_text(client, [system, {"role": "user", "content": NAME},
                                             {"role": "assistant", "content": first.final_output},
                                             {"role": "user", "content": ASK}], 64, STOP)
    assert (second.final_output, second.raw_responses[0].usage.input_tokens) == (text, prompt_tokens)
    listed = client.conversations.items.list(session.session_id, order="asc").data
    assert texts(listed) == [("user", NAME), ("assistant", first.final_output), ("user", ASK),
                             ("assistant", second.final_output)]
    assert [item["role"] for item in await session.get_items()] == ["user", "assistant", "user", "assistant"]
    conversation_id = session.session_id
    popped = await session.pop_item()
    assert popped is not None and len(client.conversations.items.list(conversation_id).data) == 3
    await session.clear_session()
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conversation_id)
