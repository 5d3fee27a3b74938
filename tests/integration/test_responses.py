"""The Responses API end to end with the official `openai` SDK (and the OpenAI Agents SDK): whole and streamed
answers that are the chat answers of the same conversation, stored responses any API process can read, list,
delete and continue, function calls, structured output, and OpenAI's errors."""
from __future__ import annotations

import json
import time
from typing import Any

import httpx
import jsonschema
import openai
import orjson
import pytest
from openai import OpenAI
from pydantic import BaseModel

from tests.conftest import LOCATION, MODEL, STATEFUL, STATEFUL_VLM, VLM, Stack
from tests.integration import sse
from tests.integration.conftest import Guarded
from tests.integration.test_vision import data_url

QUESTION = "What is the capital of France?"
WEATHER = "What is the weather like in Paris today?"
TOOL = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
        "parameters": LOCATION}
GREEDY: dict[str, Any] = {"model": MODEL, "temperature": 0, "max_output_tokens": 32}


def chat_text(client: OpenAI, messages: list[dict[str, Any]], max_tokens: int = 32,
              stop: list[str] | None = None) -> tuple[str, int]:
    """What chat answers for the same conversation, greedy, and its prompt's tokens."""
    reply = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=max_tokens,
                                           stop=stop)
    return reply.choices[0].message.content or "", reply.usage.prompt_tokens


def test_a_string_input_is_the_chat_answer_to_one_user_message(client: OpenAI) -> None:
    response = client.responses.create(input=QUESTION, **GREEDY)
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "completed" and response.error is None
    assert [item.type for item in response.output] == ["message"]
    text, prompt_tokens = chat_text(client, [{"role": "user", "content": QUESTION}])
    assert response.output_text == text and "Paris" in text
    usage = response.usage
    assert (usage.input_tokens, usage.total_tokens) == (prompt_tokens, usage.input_tokens + usage.output_tokens)
    assert 0 < usage.output_tokens <= 32


def test_instructions_and_input_items_are_the_chat_conversation(client: OpenAI) -> None:
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Name a colour."}]},
             {"role": "assistant", "content": [{"type": "output_text", "text": "Blue."}]},
             {"type": "message", "role": "user", "content": QUESTION}]
    response = client.responses.create(input=items, instructions="Answer in a few words.", **GREEDY)
    text, prompt_tokens = chat_text(client, [{"role": "system", "content": "Answer in a few words."},
                                             {"role": "user", "content": "Name a colour."},
                                             {"role": "assistant", "content": "Blue."},
                                             {"role": "user", "content": QUESTION}])
    assert (response.output_text, response.usage.input_tokens) == (text, prompt_tokens)
    assert response.instructions == "Answer in a few words."


@pytest.mark.parametrize("model", [VLM, STATEFUL_VLM])
def test_an_input_image_reaches_a_vision_servable_as_in_chat(client: OpenAI, model: str) -> None:
    url = data_url((255, 0, 0))
    content = [{"type": "input_image", "image_url": url}, {"type": "input_text", "text": "Describe this image."}]
    args: dict[str, Any] = {"model": model, "temperature": 0, "max_output_tokens": 16}
    response = client.responses.create(input=[{"role": "user", "content": content}], **args,
                                       extra_body={"ignore_eos": True})
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                              {"type": "text", "text": "Describe this image."}]}],
        temperature=0, max_tokens=16, extra_body={"ignore_eos": True})
    assert response.status == "incomplete" and response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == chat.usage.prompt_tokens


def test_a_stateful_servable_answers_whole_and_streamed(client: OpenAI) -> None:
    args = {"model": STATEFUL, "input": QUESTION, "temperature": 0, "max_output_tokens": 24}
    whole = client.responses.create(**args)
    with client.responses.stream(**args) as stream:
        streamed = stream.get_final_response()
    assert whole.status == streamed.status and whole.output_text == streamed.output_text
    assert whole.output_text.strip()


def test_the_token_limit_makes_an_incomplete_response(client: OpenAI) -> None:
    response = client.responses.create(input=QUESTION, **{**GREEDY, "max_output_tokens": 16},
                                       extra_body={"ignore_eos": True})  # ovq's sampling extensions pass on
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 16 and response.output[0].status == "incomplete"
    assert client.responses.retrieve(response.id).status == "incomplete"


def test_a_stream_numbers_its_events_and_its_deltas_make_the_final_text(client: OpenAI) -> None:
    with client.responses.stream(input=QUESTION, **GREEDY) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == client.responses.create(input=QUESTION, **GREEDY).output_text
    assert events[-1].response.usage.output_tokens == final.usage.output_tokens > 0
    assert client.responses.retrieve(final.id).output_text == deltas  # stored before its last event went out


def test_log_probabilities_come_with_the_text_whole_and_streamed(client: OpenAI) -> None:
    args = {**GREEDY, "input": QUESTION, "include": ["message.output_text.logprobs"], "top_logprobs": 1}
    whole = client.responses.create(**args)
    logprobs = whole.output[0].content[0].logprobs
    # An answer that ended on end-of-sequence counts that token (as OpenAI does) but it has no text or logprob.
    eos = 1 if whole.status == "completed" else 0
    assert len(logprobs) == whole.usage.output_tokens - eos
    assert "".join(lp.token for lp in logprobs) == whole.output_text
    assert all(lp.logprob <= 0 and [t.token for t in lp.top_logprobs] == [lp.token] for lp in logprobs)
    with client.responses.stream(**args) as stream:
        deltas = [e for e in stream if e.type == "response.output_text.delta"]
    assert [lp.token for e in deltas for lp in e.logprobs] == [lp.token for lp in logprobs]


def test_a_raw_stream_names_each_event_and_ends_with_done(stack: Stack) -> None:
    """`data: [DONE]` last, as the Open Responses spec ends a stream (the SDK stops reading there)."""
    body = {"model": MODEL, "input": QUESTION, "max_output_tokens": 16, "stream": True}
    with httpx.stream("POST", stack.url("/v1/responses"), json=body, timeout=120) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        frames = [f for f in reply.read().decode().split("\n\n") if f and not f.startswith(":")]
    assert frames.pop() == "data: [DONE]" and "[DONE]" not in "".join(frames)
    for frame in frames:
        event, data = frame.split("\n")
        assert event == "event: " + json.loads(data.removeprefix("data: "))["type"]
    assert json.loads(frames[-1].split("\n")[1][6:])["type"] in ("response.completed", "response.incomplete")


def test_a_stored_response_is_retrieved_and_deleted(client: OpenAI) -> None:
    response = client.responses.create(input=QUESTION, metadata={"case": "retrieve"}, **GREEDY)
    stored = client.responses.retrieve(response.id)
    assert stored.model_dump() == response.model_dump()
    deleted = client.responses.delete(response.id)  # the SDK returns nothing: check the wire
    assert deleted is None
    with pytest.raises(openai.NotFoundError, match=response.id):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(response.id)


def test_delete_answers_openais_deletion_object(stack: Stack, client: OpenAI) -> None:
    response = client.responses.create(input=QUESTION, **GREEDY)
    reply = httpx.delete(stack.url(f"/v1/responses/{response.id}"), timeout=30)
    assert (reply.status_code, reply.json()) == (200, {"id": response.id, "object": "response", "deleted": True})


def test_input_items_are_listed_newest_first_in_pages(client: OpenAI) -> None:
    items = [{"role": "user", "content": f"Say {word}."} for word in ("one", "two", "three")]
    response = client.responses.create(input=items, **GREEDY)
    listed = client.responses.input_items.list(response.id)
    texts = [item.content[0].text for item in listed.data]
    assert texts == ["Say three.", "Say two.", "Say one."]
    assert all(item.id.startswith("msg_") for item in listed.data)
    assert (listed.first_id, listed.last_id, listed.has_more) == (listed.data[0].id, listed.data[-1].id, False)
    first = client.responses.input_items.list(response.id, limit=1, order="asc")
    assert ([i.content[0].text for i in first.data], first.has_more) == (["Say one."], True)
    rest = client.responses.input_items.list(response.id, order="asc", after=first.last_id)
    assert [i.content[0].text for i in rest.data] == ["Say two.", "Say three."]
    paged = client.responses.input_items.list(response.id, order="asc", limit=1)  # the SDK pages on by `after`
    assert [i.content[0].text for i in paged] == ["Say one.", "Say two.", "Say three."]


class Capital(BaseModel):
    country: str
    city: str


def test_parse_with_a_pydantic_model_gives_a_valid_object(client: OpenAI) -> None:
    response = client.responses.parse(model=MODEL, input=QUESTION, text_format=Capital, temperature=0,
                                      max_output_tokens=64)
    assert response.status == "completed"
    parsed = response.output_parsed
    assert isinstance(parsed, Capital)
    assert Capital.model_validate_json(response.output_text) == parsed


def test_previous_response_id_continues_the_conversation(client: OpenAI) -> None:
    first = client.responses.create(input="My name is Ada. Say hello to me.", **GREEDY)
    second = client.responses.create(input="What is my name?", previous_response_id=first.id, **GREEDY)
    assert second.previous_response_id == first.id
    text, prompt_tokens = chat_text(client, [{"role": "user", "content": "My name is Ada. Say hello to me."},
                                             {"role": "assistant", "content": first.output_text},
                                             {"role": "user", "content": "What is my name?"}])
    assert (second.output_text, second.usage.input_tokens) == (text, prompt_tokens)
    third = client.responses.create(input="Thank you.", previous_response_id=second.id, **GREEDY)
    assert third.usage.input_tokens > second.usage.input_tokens + second.usage.output_tokens
    # Each response lists its own input items only.
    assert [i.content[0].text for i in client.responses.input_items.list(third.id)] == ["Thank you."]


def test_previous_response_id_that_was_not_stored_or_deleted_is_404(client: OpenAI) -> None:
    unstored = client.responses.create(input=QUESTION, store=False, **GREEDY)
    with pytest.raises(openai.NotFoundError, match="Previous response"):
        client.responses.create(input="Why?", previous_response_id=unstored.id, **GREEDY)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    first = client.responses.create(input=QUESTION, **GREEDY)
    second = client.responses.create(input="Why?", previous_response_id=first.id, **GREEDY)
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError, match=first.id):  # a chain that lost a member cannot go on
        client.responses.create(input="And?", previous_response_id=second.id, **GREEDY)
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(input="Why?", previous_response_id="resp_nosuchresponse", **GREEDY)
    assert caught.value.body["param"] == "previous_response_id"


def test_a_required_tool_call_is_a_function_call_item_then_its_output_completes(client: OpenAI) -> None:
    # One call: greedy parallel calls repeat the same call until the token limit (as chat's do).
    call_args = {"model": MODEL, "tools": [TOOL], "temperature": 0, "max_output_tokens": 80,
                 "parallel_tool_calls": False}
    first = client.responses.create(input=WEATHER, tool_choice="required", **call_args)
    assert first.status == "completed"
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].call_id
    jsonschema.validate(json.loads(calls[0].arguments), LOCATION)
    with client.responses.stream(input=WEATHER, tool_choice="required", **call_args) as stream:
        events = list(stream)
        streamed = stream.get_final_response()
    assert [(i.name, i.arguments) for i in streamed.output if i.type == "function_call"] == \
        [(c.name, c.arguments) for c in calls]
    assert "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta") == \
        "".join(c.arguments for c in calls)
    outputs = [{"type": "function_call_output", "call_id": c.call_id, "output": '{"temperature": 21, "sky": "clear"}'}
               for c in calls]
    second = client.responses.create(input=outputs, previous_response_id=first.id, **call_args)
    assert second.status == "completed" and second.output
    # The same turn sent whole, without the store: the history as items.
    history = [{"role": "user", "content": WEATHER}, *[c.model_dump(exclude_none=True) for c in calls], *outputs]
    again = client.responses.create(input=history, store=False, **call_args)
    assert (again.usage.input_tokens, again.output_text) == (second.usage.input_tokens, second.output_text)


def test_a_client_that_leaves_a_stream_leaves_a_cancelled_response(stack: Stack, client: OpenAI) -> None:
    body = {"model": MODEL, "input": "Count to one thousand.", "max_output_tokens": 2000, "stream": True,
            "ignore_eos": True}
    response_id = None
    with httpx.stream("POST", stack.url("/v1/responses"), json=body, timeout=120) as reply:
        for line in sse.lines(reply):
            if line.startswith("data: "):
                event = orjson.loads(line[6:])
                response_id = response_id or event["response"]["id"]
                if event["type"] == "response.output_text.delta":
                    break
    assert response_id is not None
    deadline = time.monotonic() + 60
    status = None
    while time.monotonic() < deadline:
        try:
            status = client.responses.retrieve(response_id).status
        except openai.NotFoundError:
            status = None
        if status is not None:
            break
        time.sleep(0.2)
    stored = client.responses.retrieve(response_id)
    assert stored.status == "cancelled" and stored.usage is None
    assert stored.output[0].status == "incomplete" and stored.output_text


def test_errors_are_openais(stack: Stack, client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="no-such-model"):
        client.responses.create(model="no-such-model", input=QUESTION)
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input=[{"type": "message", "role": "robot", "content": "hi"}])
    assert caught.value.body["param"].startswith("input[0]") and caught.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError, match="max_output_tokens"):
        client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=8)
    with pytest.raises(openai.BadRequestError) as caught:  # chat's own checks, naming the Responses field
        client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=5000)  # max_tokens_limit 4096
    assert caught.value.body["param"] == "max_output_tokens"
    with pytest.raises(openai.BadRequestError) as caught:  # the worker's refusal
        client.responses.create(model=MODEL, input="word " * 9000, max_output_tokens=16)
    assert (caught.value.body["code"], caught.value.body["param"]) == ("context_length_exceeded", "input")
    with pytest.raises(openai.BadRequestError, match="background mode requires store"):
        client.responses.create(model=MODEL, input=QUESTION, background=True, store=False)
    with pytest.raises(openai.BadRequestError, match="web_search"):
        client.responses.create(model=MODEL, input=QUESTION, tools=[{"type": "web_search"}])
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_nosuchresponse")
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list("resp_nosuchresponse")
    reply = httpx.get(stack.url("/v1/responses/resp_nosuchresponse"), timeout=30)
    assert reply.status_code == 404 and set(reply.json()["error"]) == {"message", "type", "param", "code"}
    reply = httpx.post(stack.url("/v1/responses"), content=b"{", headers={"content-type": "application/json"})
    assert reply.status_code == 400 and "error" in reply.json()


def test_a_background_response_through_the_sdk_is_the_same_answer(client: OpenAI) -> None:
    """`background=True` answers `queued` at once; `retrieve` then shows it to its end; `cancel` on an ended one
    gives it as it is."""
    created = client.responses.create(input=QUESTION, background=True, **GREEDY)
    assert created.status == "queued" and created.background
    deadline, current = time.monotonic() + 60, created
    while current.status in ("queued", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.1)
        current = client.responses.retrieve(created.id)
    assert current.status == "completed"
    assert current.output_text == client.responses.create(input=QUESTION, **GREEDY).output_text
    assert client.responses.cancel(created.id).status == "completed"


async def test_an_agent_runs_a_function_tool_to_completion(stack: Stack) -> None:
    """The OpenAI Agents SDK on ovq's Responses API: the first turn must call the tool, the next one answers."""
    from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
    from agents.models.openai_responses import OpenAIResponsesModel
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        asked.append(city)
        return f"It is sunny and 21 degrees in {city}."

    model = OpenAIResponsesModel(model=MODEL, openai_client=AsyncOpenAI(base_url=stack.base_url, api_key="unused",
                                                                         max_retries=0))
    agent = Agent(name="weather", instructions="You answer questions about the weather.", tools=[get_weather],
                  model=model, model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=64,
                                                parallel_tool_calls=False))
    result = await Runner.run(agent, WEATHER, max_turns=3)
    assert asked and asked[0]
    assert isinstance(result.final_output, str) and result.final_output.strip()
    kinds = [item.type for item in result.new_items]
    assert kinds == ["tool_call_item", "tool_call_output_item", "message_output_item"], kinds


def test_api_keys_guard_every_responses_route(guarded: Guarded) -> None:
    routes = [("POST", "/v1/responses"), ("GET", "/v1/responses/resp_x"), ("DELETE", "/v3/responses/resp_x"),
              ("GET", "/v3/responses/resp_x/input_items"), ("POST", "/v1/responses/compact"),
              ("POST", "/v3/responses/input_tokens")]
    body = {"model": MODEL, "input": QUESTION, "max_output_tokens": 16}
    for method, path in routes:
        reply = httpx.request(method, guarded.url(path), json=body if method == "POST" else None, timeout=60)
        assert reply.status_code == 401, (method, path)
    keyed = OpenAI(base_url=guarded.url("/v1"), api_key=guarded.api_key, max_retries=0, timeout=120)
    response = keyed.responses.create(**body)
    assert keyed.responses.retrieve(response.id).output_text == response.output_text


def test_input_tokens_counts_what_create_would_without_generating(client: OpenAI) -> None:
    """`POST /responses/input_tokens` (`client.responses.input_tokens.count`): the prompt's tokens as a response
    of the same body counts them, its chain, instructions and tools included."""
    first = client.responses.create(input=QUESTION, **GREEDY)
    count = client.responses.input_tokens.count(model=MODEL, input=QUESTION)
    assert count.object == "response.input_tokens" and count.input_tokens == first.usage.input_tokens
    turn = {"input": [{"role": "user", "content": "And of Italy?"}], "previous_response_id": first.id,
            "instructions": "Answer in a few words.", "tools": [TOOL]}
    second = client.responses.create(**turn, **GREEDY)
    assert client.responses.input_tokens.count(model=MODEL, **turn).input_tokens == second.usage.input_tokens
    with pytest.raises(openai.BadRequestError) as caught:  # images' tokens only a worker knows
        client.responses.input_tokens.count(model=VLM, input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": data_url((255, 0, 0))}, {"type": "input_text", "text": "What?"}]}])
    assert caught.value.body["param"] == "input"
    with pytest.raises(openai.NotFoundError):
        client.responses.input_tokens.count(model="no-such-model", input=QUESTION)
