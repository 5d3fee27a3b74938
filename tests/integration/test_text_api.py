"""The whole text-generation API through the official openai SDK: choices, beams, log-probabilities, stop strings,
structured output, tools and reasoning, prompt lookup."""
from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest
from openai import OpenAI

from tests.conftest import MODEL, MODELS, SINGLE, STATEFUL, TOOLS, TOOLS_SPEC, WEATHER, Stack, Tiers, raw_greedy

SEA = [{"role": "user", "content": "Write two sentences about the sea."}]


def _streamed_choices(stream) -> tuple[dict[int, str], dict[int, str]]:
    texts: dict[int, str] = defaultdict(str)
    finishes: dict[int, str] = {}
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += (choice.text if hasattr(choice, "text") else choice.delta.content) or ""
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    return dict(texts), finishes


def test_n_choices_come_back_with_their_index_unary_and_streamed(client: OpenAI) -> None:
    args = {"model": MODEL, "messages": SEA, "n": 3, "temperature": 1.0, "seed": 11, "max_tokens": 12}
    unary = client.chat.completions.create(**args)
    assert [c.index for c in unary.choices] == [0, 1, 2]
    texts = [c.message.content for c in unary.choices]
    assert len(set(texts)) > 1, "three samples with different seeds should differ"
    assert unary.usage.completion_tokens <= 36
    streamed, finishes = _streamed_choices(client.chat.completions.create(**args, stream=True))
    assert set(finishes) == {0, 1, 2}
    assert [streamed[i] for i in range(3)] == texts  # same seeds, same samples


def test_completions_n_streams_every_choice(client: OpenAI) -> None:
    stream = client.completions.create(model=MODEL, prompt="The sea is", n=2, max_tokens=6, temperature=0.8,
                                       seed=3, stream=True)
    texts, finishes = _streamed_choices(stream)
    assert set(texts) == {0, 1} and set(finishes) == {0, 1}


def test_beam_search_returns_the_best_beams(client: OpenAI) -> None:
    args = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 8, "n": 2, "best_of": 3}
    unary = client.completions.create(**args)
    assert [c.index for c in unary.choices] == [0, 1]
    assert unary.choices[0].text != unary.choices[1].text and unary.choices[0].text
    streamed, finishes = _streamed_choices(client.completions.create(**args, stream=True))
    assert [streamed[i] for i in range(2)] == [c.text for c in unary.choices]  # beam search is deterministic
    assert set(finishes) == {0, 1}


def test_logprobs_streamed_and_unary_agree(client: OpenAI) -> None:
    args = {"model": MODEL, "messages": SEA, "temperature": 0, "max_tokens": 16, "logprobs": True,
            "top_logprobs": 1}
    unary = client.chat.completions.create(**args)
    entries = unary.choices[0].logprobs.content
    assert len(entries) == unary.usage.completion_tokens
    assert all(e.logprob <= 0 and e.top_logprobs[0].token == e.token for e in entries)
    assert "".join(e.token for e in entries) == unary.choices[0].message.content
    streamed = [e for chunk in client.chat.completions.create(**args, stream=True) for c in chunk.choices
                if c.logprobs for e in c.logprobs.content]
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == [(e.token, round(e.logprob, 4)) for e in entries]


def test_top_logprobs_needs_greedy_decoding(stack: Stack) -> None:
    body = {"model": MODEL, "messages": SEA, "temperature": 0.7, "logprobs": True, "top_logprobs": 1}
    response = httpx.post(stack.base_url + "/chat/completions", json=body, timeout=60)
    assert response.status_code == 400 and "greedy" in response.json()["error"]["message"]


def test_echo_returns_the_prompt_with_its_logprobs(client: OpenAI) -> None:
    prompt = "The capital of France is"
    scored = client.completions.create(model=MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=0)
    logprobs = scored.choices[0].logprobs
    assert scored.choices[0].text == prompt and scored.usage.completion_tokens == 0
    assert "".join(logprobs.tokens) == prompt and logprobs.token_logprobs[0] is None
    assert all(lp <= 0 for lp in logprobs.token_logprobs[1:]) and logprobs.text_offset[0] == 0
    more = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, echo=True, logprobs=0,
                                     temperature=0)
    assert more.choices[0].text.startswith(prompt) and len(more.choices[0].text) > len(prompt)
    assert more.choices[0].logprobs.token_logprobs[: len(logprobs.tokens)] == logprobs.token_logprobs


@pytest.mark.parametrize("keep", [False, True])
def test_stop_string_never_reaches_a_stream(client: OpenAI, keep: bool) -> None:
    full = client.chat.completions.create(model=MODEL, messages=SEA, temperature=0, max_tokens=48)
    text = full.choices[0].message.content
    words = text.split()
    stop = " ".join(words[len(words) // 2 : len(words) // 2 + 2])  # two words from the middle: across tokens
    stream = client.chat.completions.create(model=MODEL, messages=SEA, temperature=0, max_tokens=48, stream=True,
                                            stop=[stop], extra_body={"include_stop_str_in_output": keep})
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    streamed = "".join(pieces)
    expected = text[: text.index(stop)] + (stop if keep else "")
    assert streamed == expected
    if not keep:
        assert stop not in streamed and not any(stop in p for p in pieces)


@pytest.mark.parametrize("model", [MODEL, STATEFUL])
def test_json_schema_output_parses_and_validates(client: OpenAI, model: str) -> None:
    # Bounded fields: unbounded ones let a 135M model loop ("population": 1111...) until max_tokens.
    schema = {"type": "object", "additionalProperties": False, "required": ["city", "capital", "population"],
              "properties": {"city": {"type": "string", "maxLength": 20}, "capital": {"type": "boolean"},
                             "population": {"type": "integer", "minimum": 0, "maximum": 99999999}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": schema}}
    for stream in (False, True):
        args = {"model": model, "messages": [{"role": "user", "content": "Describe Paris as JSON."}],
                "temperature": 0, "max_tokens": 60, "response_format": fmt}
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**args,
                                                                                              stream=True)
                           if c.choices)
        else:
            reply = client.chat.completions.create(**args)
            assert reply.choices[0].finish_reason == "stop"
            text = reply.choices[0].message.content
        jsonschema.validate(json.loads(text), schema)


def test_json_object_output_is_a_json_object(client: OpenAI) -> None:
    question = "Give me a JSON object with one key, answer, for: what is the capital of France?"
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}],
                                           temperature=0, max_tokens=80, response_format={"type": "json_object"})
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


def _check_call(name: str, arguments: str) -> None:
    spec = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS_SPEC}
    jsonschema.validate(json.loads(arguments), spec[name])


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_guided_tool_call_comes_back_as_tool_calls_unary_and_streamed(client: OpenAI, tool_choice) -> None:
    args = {"model": TOOLS, "messages": WEATHER, "tools": TOOLS_SPEC, "tool_choice": tool_choice,
            "parallel_tool_calls": False, "temperature": 0, "max_tokens": 80}
    reply = client.chat.completions.create(**args)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert len(calls) == 1 and calls[0].id.startswith("call_") and calls[0].type == "function"
    if isinstance(tool_choice, dict):
        assert calls[0].function.name == "get_time"
    _check_call(calls[0].function.name, calls[0].function.arguments)

    names: dict[int, str] = {}
    arguments: dict[int, str] = defaultdict(str)
    finish = None
    for chunk in client.chat.completions.create(**args, stream=True):
        for c in chunk.choices:
            for call in c.delta.tool_calls or []:
                if call.function.name:
                    names[call.index] = call.function.name
                arguments[call.index] += call.function.arguments or ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls"
    assert names == {0: calls[0].function.name} and arguments[0] == calls[0].function.arguments


def test_tool_results_reach_the_template_and_the_model_answers(client: OpenAI) -> None:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"location": "Paris", "unit": "C"}'}}
    messages = [*WEATHER, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "22 degrees and sunny"}]
    reply = client.chat.completions.create(model=TOOLS, messages=messages, tools=TOOLS_SPEC, tool_choice="none",
                                           temperature=0, max_tokens=30)
    assert reply.choices[0].message.tool_calls is None and reply.choices[0].message.content


def test_reasoning_is_split_when_thinking_is_on(client: OpenAI) -> None:
    args = {"model": TOOLS, "messages": SEA, "temperature": 0, "max_tokens": 12}
    thinking = client.chat.completions.create(**args, extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    message = thinking.choices[0].message
    # The template opened <think>; SmolLM2 never closes it, so all it wrote is reasoning, cut by max_tokens.
    assert message.reasoning_content and message.content is None
    streamed = [c.choices[0].delta for c in client.chat.completions.create(
        **args, stream=True, extra_body={"chat_template_kwargs": {"enable_thinking": True}}) if c.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in streamed) == message.reasoning_content
    assert not "".join(d.content or "" for d in streamed)
    plain = client.chat.completions.create(**args, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert plain.choices[0].message.content and getattr(plain.choices[0].message, "reasoning_content", None) is None


@pytest.mark.numerics
def test_prompt_lookup_gives_the_greedy_answer(client: OpenAI, model_dir: Path) -> None:
    question = "Repeat exactly: the quick brown fox jumps over the lazy dog."
    prompt = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    lookup = client.completions.create(model=SINGLE, prompt=prompt, temperature=0, max_tokens=24,
                                       extra_body={"num_assistant_tokens": 3, "max_ngram_size": 2})
    assert lookup.choices[0].text == raw_greedy(model_dir, prompt, 24, plugin_config={"prompt_lookup": True})


@pytest.mark.parametrize(("extra", "param"), [({"n": 2}, "n"), ({"logprobs": True}, "logprobs")])
def test_stateful_servable_refuses_what_its_pipeline_cannot_do(stack: Stack, extra: dict, param: str) -> None:
    body = {"model": STATEFUL, "messages": SEA, "max_tokens": 4, **extra}
    response = httpx.post(stack.base_url + "/chat/completions", json=body, timeout=60)
    assert response.status_code == 400 and response.json()["error"]["param"] == param


def test_skip_special_tokens_false_keeps_them_in_the_text(client: OpenAI) -> None:
    # Past its end of turn (ignore_eos) SmolLM2 opens the next turn with the special token <|im_start|>.
    prompt = "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\nHi!<|im_end|>\n"
    args = {"model": MODEL, "prompt": prompt, "max_tokens": 6, "temperature": 0}
    kept = client.completions.create(**args, extra_body={"ignore_eos": True, "skip_special_tokens": False})
    skipped = client.completions.create(**args, extra_body={"ignore_eos": True})
    assert "<|im_start|>" in kept.choices[0].text
    assert "<|im_start|>" not in skipped.choices[0].text
    assert kept.choices[0].text.replace("<|im_start|>", "") == skipped.choices[0].text


def test_a_prompt_array_is_one_job_per_prompt_in_one_answer(client: OpenAI) -> None:
    prompts = ["The capital of France is", "One, two, three,", "Water boils at"]
    one_by_one = [client.completions.create(model=MODEL, prompt=p, max_tokens=5, temperature=0) for p in prompts]
    together = client.completions.create(model=MODEL, prompt=prompts, max_tokens=5, temperature=0, n=2)
    assert [c.index for c in together.choices] == list(range(6))
    for p, single in enumerate(one_by_one):
        for i in range(2):
            assert together.choices[p * 2 + i].text == single.choices[0].text
    assert together.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in one_by_one)
    assert together.usage.completion_tokens == 2 * sum(s.usage.completion_tokens for s in one_by_one)
    texts: dict[int, str] = defaultdict(str)
    finishes, usage = {}, None
    for chunk in client.completions.create(model=MODEL, prompt=prompts, max_tokens=5, temperature=0, n=2,
                                           stream=True, stream_options={"include_usage": True}):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
        usage = chunk.usage or usage
    assert texts == {c.index: c.text for c in together.choices}
    assert set(finishes) == set(range(6)) and usage.total_tokens == together.usage.total_tokens


def test_token_id_prompt_arrays_too(client: OpenAI) -> None:
    reply = client.completions.create(model=MODEL, prompt=[[504, 3575], [504]], max_tokens=3, temperature=0)
    assert [c.index for c in reply.choices] == [0, 1] and reply.usage.prompt_tokens == 3


def test_a_request_without_max_tokens_gets_the_models_default_length(tiers: Callable[..., Tiers]) -> None:
    """tiny-llama's generation_config.json says max_new_tokens 32: a request that sets no max_tokens gets at most
    that many (not max_tokens_limit's 4096); the models file's max_tokens_default sets another; the limit still
    refuses more, asked for explicitly."""
    tiny = {"path": str(MODELS / "tiny-llama"), "cache_size": 0, "max_tokens_limit": 4096}
    t = tiers({"tiny-llama": tiny, "tiny-short": {**tiny, "max_tokens_default": 8}})
    t.api()
    t.worker("tiny-llama")
    t.worker("tiny-short", name="short")
    t.wait_served("tiny-llama", "tiny-short")
    client = OpenAI(base_url=t.base_url, api_key="unused", max_retries=0)
    for model, default in (("tiny-llama", 32), ("tiny-short", 8)):
        unary = client.completions.create(model=model, prompt="the quick brown fox", temperature=0,
                                          extra_body={"ignore_eos": True})  # random weights: run to the budget
        assert (unary.usage.completion_tokens, unary.choices[0].finish_reason) == (default, "length")
        chunks = list(client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                                      stream=True, stream_options={"include_usage": True}))
        assert chunks[-1].usage.completion_tokens <= default
    assert client.completions.create(model="tiny-short", prompt="a", max_tokens=40, temperature=0,
                                     extra_body={"ignore_eos": True}).usage.completion_tokens == 40
    with pytest.raises(openai.BadRequestError, match="max_tokens_limit"):
        client.completions.create(model="tiny-llama", prompt="a", max_tokens=4097)
