"""Bad input gets the OpenAI error envelope and a 4xx; nothing a client sends gives a 500 or stops a worker."""
from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
from openai import OpenAI

from common.modelcard import ModelCard
from common.redis.client import sync_client
from common.servable import ServableType
from tests.conftest import MODEL, VLM, Stack, test_keys

HELLO = [{"role": "user", "content": "hi"}]


def post(stack: Stack, path: str, body: object, content_type: str = "application/json") -> httpx.Response:
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return httpx.post(stack.base_url + path, content=data, headers={"content-type": content_type}, timeout=60)


def assert_envelope(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    return error


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL}, "messages"),
        ({"model": MODEL, "messages": []}, "messages"),
        ({"model": MODEL, "messages": "hello"}, "messages"),
        ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        ({"model": MODEL, "messages": HELLO, "max_tokens": "many"}, "max_tokens"),
        ({"model": MODEL, "messages": HELLO, "max_tokens": 0}, "max_tokens"),
        ({"model": MODEL, "messages": HELLO, "temperature": 3}, "temperature"),
        ({"model": MODEL, "messages": HELLO, "top_p": 0}, "top_p"),
        ({"model": MODEL, "messages": HELLO, "seed": -1}, "seed"),
        ({"model": MODEL, "messages": HELLO, "presence_penalty": 9}, "presence_penalty"),
        ({"model": MODEL, "messages": HELLO, "stream_options": {"include_usage": True}}, "stream_options"),
        ({"model": MODEL, "messages": HELLO, "n": 3, "best_of": 2}, "n"),
        ({"model": MODEL, "messages": HELLO, "best_of": 21}, "best_of"),
        ({"model": MODEL, "messages": HELLO, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "foo"}}}}, "response_format.json_schema.schema"),
        ({"model": MODEL, "messages": HELLO, "num_assistant_tokens": 3}, "num_assistant_tokens"),
        ({"model": VLM, "messages": HELLO, "tool_choice": "required", "tools": [
            {"type": "function", "function": {"name": "f"}}]}, "tool_choice"),  # a model without a tool parser
        ({"model": MODEL, "messages": HELLO, "stop_token_ids": [49152]}, "stop_token_ids"),  # vocabulary: 49152
        ({"model": MODEL, "messages": HELLO, "stop_token_ids": [-1]}, "stop_token_ids"),
        ({"messages": HELLO}, "model"),
    ],
)
def test_invalid_chat_request_is_a_400(stack: Stack, body: dict, param: str) -> None:
    assert assert_envelope(post(stack, "/chat/completions", body), 400)["param"] == param


def test_malformed_json_is_a_400(stack: Stack) -> None:
    assert_envelope(post(stack, "/chat/completions", b'{"model": "x", "messages": ['), 400)
    assert_envelope(post(stack, "/completions", b"[1, 2]"), 400)


def test_wrong_content_type_is_a_415(stack: Stack) -> None:
    assert_envelope(post(stack, "/chat/completions", "model=x", "application/x-www-form-urlencoded"), 415)


def test_unknown_model_is_a_404(client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="no-such-model", messages=HELLO)
    assert caught.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_max_tokens_over_the_limit_is_a_400(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=5000)
    assert "exceeds the limit 4096" in caught.value.message


@pytest.mark.parametrize("stream", [False, True])
def test_prompt_longer_than_the_context_is_a_400(client: OpenAI, stream: bool) -> None:
    long = [{"role": "user", "content": "hello " * 9000}]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=long, max_tokens=5, stream=stream)
    assert caught.value.body["code"] == "context_length_exceeded" and caught.value.body["param"] == "messages"
    assert "maximum context length is 8192 tokens" in caught.value.message


@pytest.mark.parametrize("words", [8500, 12000, 20000])
def test_context_overflow_says_the_real_prompt_length(client: OpenAI, words: int) -> None:
    """The tokenizer cuts encodings at 8192 tokens; the message used to say 8192 for every long prompt."""
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="hello " * words, max_tokens=5)
    assert caught.value.body["param"] == "prompt"
    # "hello", then words - 1 times " hello", then the last space
    assert f"your prompt resulted in {words + 1} tokens" in caught.value.message


def test_stop_token_ids_in_the_vocabulary_are_accepted(client: OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2,
                                           extra_body={"stop_token_ids": [49151]})
    assert reply.usage.completion_tokens <= 2


def test_completion_with_template_refusal_and_empty_prompt(stack: Stack) -> None:
    assert_envelope(post(stack, "/completions", {"model": MODEL, "prompt": ""}), 400)
    assert_envelope(post(stack, "/completions", {"model": MODEL, "prompt": ["a", ""]}), 400)


def test_model_with_no_live_worker_is_not_ready_and_the_api_stays_ready(stack: Stack) -> None:
    """A model whose workers have all gone (its card is still in Redis, no heartbeat). A request for it waits for a
    worker, then is a 503 (tests/integration/test_scale_from_zero.py); with X-Request-Timeout, a 504 sooner."""
    keys = test_keys("ovqtest")
    card = ModelCard(name="gone", device="CPU", servable_type=ServableType.LM_CB, context_length=128,
                     chat_template="{{ messages[0]['content'] }}", created=int(time.time()))
    r = sync_client(stack.redis_url)
    r.hset(keys.model("gone"), "CPU", card.model_dump_json())
    r.zadd(keys.models, {"gone": time.time()})
    try:
        response = httpx.post(stack.url("/v3/chat/completions"), json={"model": "gone", "messages": HELLO},
                              headers={"X-Request-Timeout": "2"}, timeout=60)
        assert assert_envelope(response, 504)["code"] == "deadline_exceeded"
        assert r.xlen(keys.jobs("gone", "CPU")) == 0  # it left the stream: no worker runs it later
        # The API stays ready: one model without a worker is detail, not an outage.
        health = httpx.get(stack.url("/health"))
        assert health.status_code == 200 and health.json()["models"]["gone"] is False
        assert httpx.get(stack.url("/v2/models/gone/ready")).status_code == 503
        assert httpx.get(stack.url(f"/v2/models/{MODEL}/ready")).status_code == 200
        assert httpx.get(stack.url("/v2/models/never-heard-of/ready")).status_code == 404
    finally:
        r.delete(keys.model("gone"), keys.jobs("gone", "CPU"))
        r.zrem(keys.models, "gone")


def test_hostile_payloads_never_give_a_500_and_the_worker_survives(stack: Stack, client: OpenAI) -> None:
    payloads = [
        {"model": MODEL, "messages": [{"role": "user", "content": None}], "max_tokens": 2},
        {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}], "max_tokens": 2},
        {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
        {"model": MODEL, "messages": HELLO, "top_k": -1, "max_tokens": 2},
        {"model": MODEL, "messages": HELLO, "stop": ["a"] * 100},
        {"model": MODEL, "messages": HELLO, "max_tokens": 10**12},
        {"model": MODEL, "messages": HELLO, "repetition_penalty": 1e300, "max_tokens": 2},
        {"model": MODEL, "messages": HELLO, "stop": [""], "max_tokens": 2},
        {"model": MODEL, "prompt": [1, 2, 10**9], "max_tokens": 2},
        {"model": MODEL, "prompt": [1, 2, -5], "max_tokens": 2},
        {"model": MODEL, "messages": [{"role": "user", "content": "{{ raise_exception('boom') }}"}], "max_tokens": 2},
        {"model": 12, "messages": HELLO},
        None,
    ]
    for body in payloads:
        path = "/completions" if body and "prompt" in body else "/chat/completions"
        response = post(stack, path, body if body is not None else "null")
        assert response.status_code < 500, (body, response.text)
    reply = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=3)
    assert reply.usage.completion_tokens <= 3
