"""The wire formats the API renders from templates: every frame is what `api/openai/protocol.py` models and
OpenAI sends."""
from __future__ import annotations

import orjson

from api.openai.choices import ChoiceState
from api.openai.formats import ChatFormat, CompletionFormat
from api.openai.parsers import output_parser
from api.openai.protocol import ChatCompletion, ChatCompletionChunk, Completion
from common.events import Delta, delta


def frames(data: bytes) -> list[dict]:
    assert data.endswith(b"\n\n")
    return [orjson.loads(f.removeprefix(b"data: ")) for f in data.split(b"\n\n") if f]


def test_a_plain_chat_stream_sends_only_the_fields_it_has() -> None:
    fmt, choice = ChatFormat("chatcmpl-1", "m"), ChoiceState(0)
    (role,) = frames(fmt.first([choice]))
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""} and "usage" not in role
    (text,) = frames(fmt.chunk(choice, delta("j", 2, 0, "Héllo \"x\"", 1)))
    assert text["choices"][0]["delta"] == {"content": "Héllo \"x\""}
    text_frame, last = frames(fmt.chunk(choice, delta("j", 3, 0, "!", 1, finish_reason="length")))
    assert last["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
    for chunk in (role, text, text_frame, last):
        ChatCompletionChunk.model_validate(chunk)
        assert chunk["id"] == "chatcmpl-1" and chunk["object"] == "chat.completion.chunk"


def test_usage_is_null_on_every_chunk_and_whole_at_the_end_when_asked() -> None:
    fmt, choice = ChatFormat("c", "m", include_usage=True), ChoiceState(0)
    (chunk,) = frames(fmt.chunk(choice, delta("j", 2, 0, "a", 1)))
    assert chunk["usage"] is None
    (usage,) = frames(fmt.usage({"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}))
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == 4
    ChatCompletionChunk.model_validate(usage)


def test_reasoning_content_only_for_models_with_a_reasoning_parser() -> None:
    events = [delta("j", 2, 0, "<think>hm</think>Yes", 5, finish_reason="stop")]
    for reasoning in (False, True):
        fmt = ChatFormat("c", "m", reasoning=reasoning)
        choice = ChoiceState(0, output_parser(None, "qwen3") if reasoning else None)
        choice.add(events[0])
        message = orjson.loads(fmt.whole([choice], {"prompt_tokens": 1, "completion_tokens": 5,
                                                    "total_tokens": 6}))["choices"][0]["message"]
        assert ("reasoning_content" in message) is reasoning
        if reasoning:
            assert message == {"role": "assistant", "content": "Yes", "reasoning_content": "hm"}
        ChatCompletion.model_validate_json(fmt.whole([choice], {"prompt_tokens": 1, "completion_tokens": 5,
                                                                "total_tokens": 6}))


def test_completion_frames_and_prompt_indexes() -> None:
    fmt = CompletionFormat("cmpl-1", "m")
    second_prompt = ChoiceState(3)  # prompt 1, n = 2, choice 1
    (chunk,) = frames(fmt.chunk(second_prompt, delta("j-1", 2, 1, "text", 1, finish_reason="stop")))
    assert chunk["choices"][0] == {"index": 3, "text": "text", "logprobs": None, "finish_reason": "stop"}
    Completion.model_validate(chunk)
    assert fmt.chunk(ChoiceState(0), delta("j", 2, 0, "", 0)) == b""


def test_the_hot_path_delta_is_the_contracts_delta() -> None:
    event = delta("j", 4, 1, "x", 2, [{"token": "x", "logprob": -0.1, "bytes": [120]}], "length", echo=False)
    assert Delta.model_validate(event).model_dump(exclude_defaults=True) == {
        "job": "j", "seq": 4, "index": 1, "text": "x", "tokens": 2, "finish_reason": "length",
        "logprobs": [{"token": "x", "logprob": -0.1, "bytes": [120]}]}


def test_continuous_usage_puts_the_usage_so_far_on_every_chunk() -> None:
    """vLLM's `stream_options.continuous_usage_stats`: each chunk's usage counts the tokens sent up to it."""
    fmt, choice = ChatFormat("c", "m", include_usage=True, continuous_usage=True), ChoiceState(0)
    fmt.started(7)
    (role,) = frames(fmt.first([choice]))
    assert role["usage"] == {"prompt_tokens": 7, "completion_tokens": 0, "total_tokens": 7}
    seen = []
    for event in (delta("j", 2, 0, "Hel", 2), delta("j", 3, 0, "lo", 1), delta("j", 4, 0, "", 1, finish_reason="stop")):
        fmt.count(event)
        seen += [f["usage"]["completion_tokens"] for f in frames(fmt.chunk(choice, event))]
    assert seen == [2, 3, 4]  # the last (the end of sequence: no text, one token) comes with the finish
    for chunk in frames(fmt.first([choice])):
        ChatCompletionChunk.model_validate(chunk)
    plain = CompletionFormat("c", "m", include_usage=True)  # without it: null, as before
    plain.count(delta("j", 2, 0, "a", 1))
    assert frames(plain.chunk(ChoiceState(0), delta("j", 2, 0, "a", 1)))[0]["usage"] is None


def test_completion_logprobs_zero_lists_the_sampled_token_as_its_alternative() -> None:
    """vLLM's shape for `logprobs: 0` (and 1): top_logprobs holds each token's own entry, never null."""
    entries = [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105]}, {"token": "!", "logprob": -1.0, "bytes": [33]}]
    for top in (0, 1):
        fmt, choice = CompletionFormat("c", "m"), ChoiceState(0, None, top)
        (chunk,) = frames(fmt.chunk(choice, delta("j", 2, 0, "Hi!", 2, entries, "stop")))
        logprobs = chunk["choices"][0]["logprobs"]
        assert logprobs["top_logprobs"] == [{"Hi": -0.5}, {"!": -1.0}] and logprobs["text_offset"] == [0, 2]
        Completion.model_validate(chunk)
        whole = ChoiceState(0, None, top)
        whole.add(delta("j", 2, 0, "Hi!", 2, entries, "stop"))
        body = orjson.loads(fmt.whole([whole], {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}))
        assert body["choices"][0]["logprobs"]["top_logprobs"] == [{"Hi": -0.5}, {"!": -1.0}]


def test_a_chat_answer_names_the_service_tier_it_was_served_at() -> None:
    choice = ChoiceState(0)
    for tier in ("default", "flex", "priority"):
        fmt = ChatFormat("c", "m", tier=tier)
        for chunk in frames(fmt.first([choice]) + fmt.chunk(choice, delta("j", 2, 0, "a", 1, finish_reason="stop"))):
            assert ChatCompletionChunk.model_validate(chunk).service_tier == tier
        whole = fmt.whole([choice], {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2})
        assert ChatCompletion.model_validate_json(whole).service_tier == tier
    (frame,) = frames(CompletionFormat("cmpl-1", "m").plain(ChoiceState(0), "a", None))
    assert "service_tier" not in frame  # a text completion has none (OpenAI's has none)
