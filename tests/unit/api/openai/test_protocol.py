from __future__ import annotations

import pytest
from pydantic import ValidationError

from api.openai.protocol import ChatCompletionRequest, CompletionRequest
from common.errors import OvqError

MSG = [{"role": "user", "content": "hi"}]


def test_stop_string_becomes_a_list() -> None:
    assert ChatCompletionRequest(model="m", messages=MSG, stop="x").stop == ["x"]


def test_max_completion_tokens_sets_max_tokens() -> None:
    assert ChatCompletionRequest(model="m", messages=MSG, max_completion_tokens=7).max_tokens == 7


def test_text_parts_are_joined_and_other_parts_refused() -> None:
    message = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]).messages[0]
    assert message.text() == "ab"
    image = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:"}}]}]).messages[0]
    with pytest.raises(OvqError):
        image.text()


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
INVALID = [
    ({"temperature": 2.5}, "temperature out of range(0.0, 2.0)"),
    ({"top_p": 1.5}, "top_p out of range(0.0, 1.0]"),
    ({"top_p": 0}, "top_p out of range(0.0, 1.0]"),
    ({"top_k": 0}, "top_k must be -1 (all tokens) or a positive integer"),
    ({"min_p": 1.0}, "min_p out of range [0.0, 1.0)"),
    ({"seed": 2**32}, "seed out of range [0, 4294967295]"),
    ({"seed": -1}, "seed out of range [0, 4294967295]"),
    ({"frequency_penalty": -3}, "frequency_penalty out of range(-2.0, 2.0)"),
    ({"presence_penalty": 2.5}, "presence_penalty out of range(-2.0, 2.0)"),
    ({"repetition_penalty": 0}, "repetition_penalty must be greater than 0"),
    ({"max_tokens": 0}, "max_tokens value should be greater than 0"),
    ({"max_tokens": -1}, "max_tokens is not an unsigned integer"),
    ({"stop": ["a"] * 17}, "stop array must have no more than 16 strings"),
    ({"stop": ["a", 1]}, "stop array contains non string element"),
    ({"stop": 5}, "stop is not a string or array of strings"),
    ({"n": 0}, "n value should be greater than 0"),
    ({"n": 3, "best_of": 2}, "n value cannot be greater than best_of"),
    ({"best_of": 0}, "best_of value should be greater than 0"),
    ({"length_penalty": 1.2}, "length_penalty applies to beam search only"),
    ({"stream_options": {"include_usage": True}}, "stream_options provided, but stream not set to true"),
    ({"top_logprobs": 1}, "top_logprobs requires logprobs to be true"),
    ({"logprobs": True, "top_logprobs": 5}, "top_logprobs above 1 is not supported"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs out of range [0, 20]"),
    ({"tool_choice": "sometimes", "tools": [TOOL]}, "tool_choice should be either 'none' or 'auto' or 'required'"),
    ({"tool_choice": "required"}, "tool_choice is only allowed when tools are specified"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}},
     "tool_choice names function 'g', which is not in tools"),
    ({"tools": [{**TOOL, "type": "retrieval"}]}, "Only function tools are supported"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format of type json_schema needs json_schema.schema"),
    ({"num_assistant_tokens": 0}, "num_assistant_tokens must be greater than 0"),
    ({"assistant_confidence_threshold": 0}, "assistant_confidence_threshold out of range (0.0, 1.0]"),
    ({"num_assistant_tokens": 2, "assistant_confidence_threshold": 0.4},
     "num_assistant_tokens and assistant_confidence_threshold are mutually exclusive"),
    ({"logit_bias": {"50256": -100}}, "logit_bias is not supported"),
    ({"functions": [{"name": "f"}]}, "functions are deprecated"),
]


@pytest.mark.parametrize(("extra", "message"), INVALID, ids=[m for _, m in INVALID])
def test_invalid_values_and_combinations_are_400s_naming_the_problem(extra: dict, message: str) -> None:
    with pytest.raises(OvqError) as caught:
        ChatCompletionRequest(model="m", messages=MSG, **extra)
    assert caught.value.status == 400 and caught.value.body.message.startswith(message)


@pytest.mark.parametrize(("extra", "message"), [
    ({"max_tokens": 0}, "max_tokens value should be greater than 0 unless echo is set"),
    ({"logprobs": 2}, "logprobs above 1 is not supported"),
    ({"logprobs": 6}, "logprobs out of range [0, 5]"),
    ({"suffix": "x"}, "suffix is not supported"),
])
def test_invalid_completion_values_are_400s(extra: dict, message: str) -> None:
    with pytest.raises(OvqError, match=message.replace("[", r"\[")):
        CompletionRequest(model="m", prompt="p", **extra)


def test_valid_combinations_pass() -> None:
    assert CompletionRequest(model="m", prompt="p", max_tokens=0, echo=True, logprobs=1).logprobs == 1
    body = ChatCompletionRequest(model="m", messages=MSG, n=2, best_of=3, length_penalty=1.0, logprobs=True,
                                 tools=[TOOL], tool_choice={"type": "function", "function": {"name": "f"}})
    assert body.top_logprobs_asked == 0 and body.best_of == 3


def test_stream_options_need_stream() -> None:
    with pytest.raises(OvqError, match="stream_options provided, but stream not set to true"):
        ChatCompletionRequest(model="m", messages=MSG, stream_options={"include_usage": True})


def test_continuous_usage_stats_come_with_include_usage_as_in_vllm() -> None:
    def body(**options: bool) -> ChatCompletionRequest:
        return ChatCompletionRequest(model="m", messages=MSG, stream=True, stream_options=options)

    assert body(include_usage=True, continuous_usage_stats=True).continuous_usage
    assert not body(continuous_usage_stats=True).continuous_usage
    assert not body(include_usage=True).continuous_usage


def test_unknown_fields_are_ignored() -> None:
    assert ChatCompletionRequest(model="m", messages=MSG, user="u", metadata={"a": 1}).model == "m"


def test_completion_prompt_forms() -> None:
    """A string, token ids, or a list of either: one job per prompt."""
    assert CompletionRequest(model="m", prompt="one").prompts == ["one"]
    assert CompletionRequest(model="m", prompt=["one"]).prompts == ["one"]
    assert CompletionRequest(model="m", prompt=[1, 2]).prompts == [[1, 2]]
    assert CompletionRequest(model="m", prompt=["a", "b"]).prompts == ["a", "b"]
    assert CompletionRequest(model="m", prompt=[[1, 2], [3]]).prompts == [[1, 2], [3]]
    for empty in ("", [], ["a", ""], [[1], []]):
        with pytest.raises(ValidationError):
            CompletionRequest(model="m", prompt=empty)
    with pytest.raises(ValidationError):
        CompletionRequest(model="m", prompt=["p"] * 129)
