"""The Open Responses specification (tests/specs/openresponses/): every response, item and streaming event ovq sends
validates against the spec's schemas, whole and streamed, on `/v1` and `/v3`; streams end with `data: [DONE]`;
and the spec's compliance templates (a basic answer, streaming, a system prompt, tool calling whole and streamed,
image input, multi-turn) pass on the default model, except image input: a text-only model refuses it with the
spec's error object. The requests here are the templates' kinds, greedy so that every run asks the same."""
from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from tests import openresponses
from tests.conftest import MODEL, TOOLS, Stack
from tests.integration import sse
from tests.integration.test_vision import data_url

PREFIXES = ("/v1", "/v3")
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
                "parameters": {"type": "object", "properties": {"location": {"type": "string"}},
                               "required": ["location"]}}
GREEDY = {"temperature": 0, "max_output_tokens": 128}  # every answer here ends by itself well before


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def create(stack: Stack, prefix: str, body: dict[str, Any]) -> dict[str, Any]:
    """A whole answer: HTTP 200 and a `ResponseResource`."""
    reply = httpx.post(stack.url(f"{prefix}/responses"), json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    response = reply.json()
    openresponses.response(response)
    return response


def stream(stack: Stack, prefix: str, body: dict[str, Any], url: str | None = None) -> list[dict[str, Any]]:
    """A streamed answer's events, each a valid streaming event whose `event:` line names its type, numbered from
    the first; the stream ends with `data: [DONE]` after a terminal event."""
    events: list[dict[str, Any]] = []
    data: list[str] = []
    with httpx.stream("POST" if url is None else "GET", url or stack.url(f"{prefix}/responses"),
                      json={**body, "stream": True} if url is None else None, timeout=300) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in sse.lines(reply):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
                if line[6:] != "[DONE]":
                    event = orjson.loads(line[6:])
                    assert name == event["type"]
                    openresponses.event(event)
                    events.append(event)
    assert data[-1] == "[DONE]" and data.count("[DONE]") == 1
    assert events[-1]["type"] in ("response.completed", "response.incomplete", "response.failed")
    numbers = [e["sequence_number"] for e in events]
    assert numbers == list(range(numbers[0], numbers[0] + len(events)))
    return events


def final(events: list[dict[str, Any]]) -> dict[str, Any]:
    return events[-1]["response"]


# ---- the compliance templates ------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", PREFIXES)
def test_a_basic_answer_is_a_valid_completed_response(stack: Stack, prefix: str) -> None:
    response = create(stack, prefix, {"model": MODEL, "input": [user("Greet me in three words.")], **GREEDY})
    assert response["status"] == "completed" and response["output"]
    assert (response["temperature"], response["top_p"], response["service_tier"]) == (0.0, 0.9, "default")


@pytest.mark.parametrize("prefix", PREFIXES)
def test_a_stream_is_valid_events_then_done(stack: Stack, prefix: str) -> None:
    events = stream(stack, prefix, {"model": MODEL, "input": [user("Count from one to five.")], **GREEDY})
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    assert final(events)["status"] == "completed"
    assert any(e["type"] == "response.output_text.delta" for e in events)


def test_a_system_prompt_is_followed_by_a_valid_answer(stack: Stack) -> None:
    system = {"type": "message", "role": "system", "content": "You are a pirate."}
    # Greedy, this model may repeat its first paragraph to any limit (it does at f32): the answer ends there (ovq's
    # `stop`), so `completed` holds at every precision; what the template checks is the answer's validity.
    response = create(stack, "/v1", {"model": MODEL, "input": [system, user("Say hello.")], **GREEDY,
                                     "stop": ["\n\n"]})
    assert response["status"] == "completed" and response["output"]


def test_multi_turn_history_gives_a_valid_answer(stack: Stack) -> None:
    history = [user("My name is Alice."),
               {"type": "message", "role": "assistant", "content": "Nice to meet you, Alice!"},
               user("What is my name?")]
    response = create(stack, "/v1", {"model": MODEL, "input": history, **GREEDY})
    assert response["status"] == "completed" and "Alice" in "".join(
        part["text"] for item in response["output"] for part in item["content"])


def calls_before(question: str) -> list[dict[str, Any]]:
    """A history of the user asking and the model calling: SmolLM2-135M calls by itself after it (`auto`); asked
    once without it, it answers in text (as the spec's own tool-calling template finds: docs/reference/api)."""
    history: list[dict[str, Any]] = []
    for i, city in enumerate(["London", "Rome", "Madrid"]):
        history += [user(f"What is the weather like in {city} today?"),
                    {"type": "function_call", "call_id": f"call_{i}", "name": "get_weather",
                     "arguments": orjson.dumps({"location": city}).decode()}]
    return [*history, user(question)]


@pytest.mark.parametrize(("model", "choice"), [(MODEL, "auto"), (TOOLS, "auto"), (MODEL, "required")],
                         ids=["guided-auto", "unguided-auto", "guided-required"])
def test_a_function_tool_is_called_with_a_valid_function_call_item(stack: Stack, model: str, choice: str) -> None:
    question = "What's the weather like in San Francisco?"
    body = {"model": model, "input": calls_before(question) if choice == "auto" else [user(question)],
            "tools": [WEATHER_TOOL], "tool_choice": choice, "parallel_tool_calls": False, **GREEDY}
    response = create(stack, "/v1", body)
    calls = [item for item in response["output"] if item["type"] == "function_call"]
    assert calls and calls[0]["name"] == "get_weather" and response["status"] == "completed", response["output"]
    events = stream(stack, "/v1", body)
    types = [e["type"] for e in events]
    assert "response.function_call_arguments.delta" in types and "response.function_call_arguments.done" in types
    for kind in ("response.output_item.added", "response.output_item.done"):
        assert any(e["type"] == kind and e["item"]["type"] == "function_call" for e in events)


def test_image_input_on_a_text_only_model_is_the_specs_error(stack: Stack) -> None:
    content = [{"type": "input_text", "text": "What is in this image?"},
               {"type": "input_image", "image_url": data_url((255, 0, 0))}]
    reply = httpx.post(stack.url("/v1/responses"), timeout=60,
                       json={"model": MODEL, "input": [{"type": "message", "role": "user", "content": content}]})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"].startswith("input") and "'input_image'" in error["message"], error


# ---- everything else a client reads -------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", PREFIXES)
def test_stored_responses_and_their_input_items_are_valid(stack: Stack, prefix: str) -> None:
    first = create(stack, prefix, {"model": MODEL, "input": "Name a colour.", "instructions": "Be brief.",
                                   "metadata": {"k": "v"}, **GREEDY})
    body = {"model": MODEL, "input": [user("And another?")], "previous_response_id": first["id"],
            "include": ["message.output_text.logprobs"], "top_logprobs": 1, "safety_identifier": "user-1",
            "prompt_cache_key": "colours", **GREEDY}
    second = final(stream(stack, prefix, body))
    assert (second["top_logprobs"], second["safety_identifier"], second["prompt_cache_key"]) == (1, "user-1",
                                                                                                   "colours")
    assert second["output"][0]["content"][0]["logprobs"]
    for response in (first, second):
        retrieved = httpx.get(stack.url(f"{prefix}/responses/{response['id']}"), timeout=60).json()
        openresponses.response(retrieved)
        assert retrieved["output"] == response["output"]
        listed = httpx.get(stack.url(f"{prefix}/responses/{response['id']}/input_items"), timeout=60).json()
        assert listed["data"]
        for item in listed["data"]:
            openresponses.item(item)


def test_an_incomplete_and_a_background_response_are_valid(stack: Stack) -> None:
    body = {"model": MODEL, "input": "Tell me a long story.", "max_output_tokens": 16, "ignore_eos": True}
    assert create(stack, "/v1", body)["status"] == "incomplete"
    assert final(stream(stack, "/v1", body))["incomplete_details"] == {"reason": "max_output_tokens"}
    queued = create(stack, "/v3", {**body, "background": True})
    assert queued["status"] == "queued" and queued["background"]
    events = stream(stack, "/v3", {}, url=stack.url(f"/v3/responses/{queued['id']}?stream=true"))
    assert events[0]["sequence_number"] == 0 and final(events)["status"] == "incomplete"
    assert create_again(stack, f"/v3/responses/{queued['id']}")["status"] == "incomplete"


def create_again(stack: Stack, path: str) -> dict[str, Any]:
    """`GET` a response: a valid one."""
    reply = httpx.get(stack.url(path), timeout=60)
    assert reply.status_code == 200, reply.text
    openresponses.response(reply.json())
    return reply.json()


def test_a_reasoning_item_and_its_events_are_valid(stack: Stack) -> None:
    """The tools servable's qwen3 reasoning parser with thinking on: the template opens <think>, and SmolLM2 never
    closes it, so what it writes is a `reasoning` item (cut by the token limit)."""
    body = {"model": TOOLS, "input": "Is seven a prime number?", "max_output_tokens": 16, "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": True}}
    whole = create(stack, "/v1", body)
    assert [item["type"] for item in whole["output"]] == ["reasoning"]
    events = stream(stack, "/v1", body)
    assert "response.reasoning_text.delta" in [e["type"] for e in events]
    assert final(events)["output"][0]["content"] == whole["output"][0]["content"]


# ---- service tiers ---------------------------------------------------------------------------------------------


def test_the_service_tier_is_echoed_and_priority_takes_a_key_that_may_raise_it(stack: Stack) -> None:
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    for tier, echoed in (("flex", "flex"), ("auto", "default"), (None, "default")):
        extra = {"service_tier": tier} if tier else {}
        reply = httpx.post(stack.url("/v1/chat/completions"), json={**chat, **extra}, timeout=120)
        assert reply.status_code == 200 and reply.json()["service_tier"] == echoed, reply.text
        response = create(stack, "/v1", {"model": MODEL, "input": "Hi", "max_output_tokens": 16, **extra})
        assert response["service_tier"] == echoed
    with httpx.stream("POST", stack.url("/v1/chat/completions"), timeout=120,
                      json={**chat, "stream": True, "service_tier": "flex"}) as reply:
        chunks = [orjson.loads(line[6:]) for line in sse.lines(reply) if line.startswith("data: {")]
    assert chunks and all(chunk["service_tier"] == "flex" for chunk in chunks)
    for path, body in (("/v1/chat/completions", chat), ("/v1/responses", {"model": MODEL, "input": "Hi"})):
        reply = httpx.post(stack.url(path), json={**body, "service_tier": "priority"}, timeout=60)
        assert reply.status_code == 403, reply.text  # this stack has no keys: nobody may raise priority
        assert reply.json()["error"]["code"] == "priority_not_allowed"
        assert reply.json()["error"]["param"] == "service_tier"
        reply = httpx.post(stack.url(path), json={**body, "service_tier": "scale"}, timeout=60)
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "service_tier", reply.text
