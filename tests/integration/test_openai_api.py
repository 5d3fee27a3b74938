"""The official openai SDK against the real API and worker processes."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis
from openai import OpenAI

from tests.conftest import MODEL, Stack, test_keys
from tests.integration import sse

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_chat_unary_answers_with_usage(client: OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=30)
    assert reply.id.startswith("chatcmpl-")
    assert "Paris" in reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.prompt_tokens > 10
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_streamed_text_equals_unary_text_at_temperature_zero(client: OpenAI) -> None:
    messages = [{"role": "user", "content": "Write two sentences about the sea."}]
    unary = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=48)
    stream = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=48,
                                            stream=True)
    chunks = list(stream)
    assert all(c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == unary.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == unary.choices[0].finish_reason


def test_max_tokens_gives_length_and_exact_usage(client: OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=5,
                                           extra_body={"ignore_eos": True})
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 5


def test_max_completion_tokens_is_max_tokens(client: OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, max_completion_tokens=3,
                                           extra_body={"ignore_eos": True})
    assert reply.usage.completion_tokens == 3


def test_include_usage_sends_a_final_usage_chunk(client: OpenAI) -> None:
    stream = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=5, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 5
    assert chunks[-2].choices[0].finish_reason == "length"


def test_completions_unary_and_streamed(client: OpenAI) -> None:
    unary = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0)
    assert unary.id.startswith("cmpl-")
    assert unary.usage.completion_tokens <= 8 and unary.choices[0].text
    stream = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0,
                                       stream=True)
    text = "".join(c.choices[0].text for c in stream if c.choices)
    assert text == unary.choices[0].text


def test_stop_string_is_not_in_the_output(client: OpenAI) -> None:
    base = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=30)
    assert "Paris" in base.choices[0].message.content
    stopped = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=30,
                                             stop=["Paris"])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == base.choices[0].message.content.split("Paris")[0]
    stream = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=30,
                                            stop=["Paris"], stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == stopped.choices[0].message.content


def test_seeded_sampling_repeats(client: OpenAI) -> None:
    def ask() -> str:
        reply = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=1.5, top_p=0.95,
                                               seed=1234, max_tokens=16, extra_body={"top_k": 40})
        return reply.choices[0].message.content

    assert ask() == ask()


def test_v1_alias_and_models(stack: Stack) -> None:
    v1 = OpenAI(base_url=stack.base_url.replace("/v3", "/v1"), api_key="unused", max_retries=0)
    assert MODEL in [m.id for m in v1.models.list()]
    assert v1.models.retrieve(MODEL).id == MODEL
    reply = v1.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4)
    assert reply.usage.completion_tokens <= 4


def test_sixteen_concurrent_streams_all_complete(client: OpenAI) -> None:
    def one(i: int) -> tuple[str | None, int]:
        stream = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Tell me a fact about the number {i}."}],
            max_tokens=24, temperature=0, stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True})
        chunks = list(stream)
        return chunks[-2].choices[0].finish_reason, chunks[-1].usage.completion_tokens

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(16)))
    assert results == [("length", 24)] * 16


def _answer(client: OpenAI, max_tokens: int, stream: bool) -> tuple[str, str | None, int, list[str]]:
    """(content, finish_reason, completion tokens, log-probability tokens) of the greedy answer, either way."""
    kwargs = {"model": MODEL, "messages": QUESTION, "max_tokens": max_tokens, "temperature": 0, "logprobs": True}
    if not stream:
        reply = client.chat.completions.create(**kwargs)
        choice = reply.choices[0]
        return (choice.message.content, choice.finish_reason, reply.usage.completion_tokens,
                [t.token for t in choice.logprobs.content])
    content, finish, tokens, usage = "", None, [], 0
    for chunk in client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
            tokens += [t.token for t in (choice.logprobs.content if choice.logprobs else [])]
        usage = chunk.usage.completion_tokens if chunk.usage else usage
    return content, finish, usage, tokens


@pytest.mark.parametrize("stream", [False, True])
def test_end_of_sequence_is_no_text_but_a_token_and_as_the_last_allowed_one_it_is_a_stop(client: OpenAI,
                                                                                         stream: bool) -> None:
    content, finish, usage, tokens = _answer(client, 200, stream)
    # The end of sequence is the last token: no text, no log-probability, but counted (as OpenAI and vLLM do).
    assert finish == "stop" and "".join(tokens) == content and usage == len(tokens) + 1
    assert _answer(client, usage, stream) == (content, "stop", usage, tokens)  # allowed exactly: whole, a stop
    cut = _answer(client, usage - 1, stream)
    assert cut[1:3] == ("length", usage - 1) and cut[0] == content


FRANCE = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("stream", [False, True])
def test_a_completion_that_is_only_its_end_of_sequence_has_one_completion_token(client: OpenAI,
                                                                                  stream: bool) -> None:
    answer = client.completions.create(model=MODEL, prompt=FRANCE, max_tokens=64, temperature=0)
    assert answer.choices[0].finish_reason == "stop" and answer.choices[0].text
    args = {"model": MODEL, "prompt": FRANCE + answer.choices[0].text, "max_tokens": 8, "temperature": 0}
    if stream:
        chunks = list(client.completions.create(**args, stream=True, stream_options={"include_usage": True}))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        finish, usage = chunks[-2].choices[0].finish_reason, chunks[-1].usage
    else:
        reply = client.completions.create(**args)
        text, finish, usage = reply.choices[0].text, reply.choices[0].finish_reason, reply.usage
    assert (text, finish, usage.completion_tokens) == ("", "stop", 1)


@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs_zero_lists_each_sampled_token_as_vllm_does(client: OpenAI, stream: bool) -> None:
    args = {"model": MODEL, "prompt": "The sea is", "max_tokens": 6, "logprobs": 0, "extra_body": {"ignore_eos": True}}
    if stream:
        tokens, logprobs, tops = [], [], []
        for chunk in client.completions.create(**args, stream=True):
            for choice in chunk.choices:
                if choice.logprobs:
                    tokens += choice.logprobs.tokens
                    logprobs += choice.logprobs.token_logprobs
                    tops += choice.logprobs.top_logprobs
    else:
        found = client.completions.create(**args).choices[0].logprobs
        tokens, logprobs, tops = found.tokens, found.token_logprobs, found.top_logprobs
    assert len(tokens) == 6 and tops == [{t: lp} for t, lp in zip(tokens, logprobs, strict=True)]


def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(client: OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=12, stream=True, extra_body={"ignore_eos": True},
        stream_options={"include_usage": True, "continuous_usage_stats": True})  # vLLM's option
    chunks = list(stream)
    assert all(c.usage is not None for c in chunks)
    counts = [c.usage.completion_tokens for c in chunks]
    assert counts == sorted(counts) and counts[0] == 0 and counts[-2] == counts[-1] == 12
    assert len({c.usage.prompt_tokens for c in chunks}) == 1 and chunks[-1].choices == []
    assert all(c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens for c in chunks)


def test_a_streams_last_chunk_has_an_empty_delta_and_no_reasoning_field(stack: Stack) -> None:
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 3, "stream": True}
    with httpx.stream("POST", stack.base_url + "/chat/completions", json=body, timeout=60) as response:
        chunks = [json.loads(line[6:]) for line in sse.lines(response) if line.startswith("data: {")]
    assert chunks[-1]["choices"][0]["delta"] == {} and chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all("reasoning_content" not in c["choices"][0]["delta"] for c in chunks)
    assert all("usage" not in c for c in chunks)  # not asked for
    assert response.headers["x-request-id"] and chunks[0]["id"] == f"chatcmpl-{response.headers['x-request-id']}"


def test_x_request_id_is_the_job_id(stack: Stack, redis_client: redis.Redis) -> None:
    response = httpx.post(stack.base_url + "/chat/completions", headers={"X-Request-Id": "trace-42.a"},
                          json={"model": MODEL, "messages": QUESTION, "max_tokens": 2}, timeout=60)
    assert response.headers["x-request-id"] == "trace-42.a" and response.json()["id"] == "chatcmpl-trace-42.a"
    assert redis_client.hget(test_keys("ovqtest").job("trace-42.a", MODEL), "status") == b"done"
