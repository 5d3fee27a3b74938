from __future__ import annotations

import pytest
from pydantic import ValidationError

from api.protocol import ChatCompletionRequest, CompletionRequest
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


@pytest.mark.parametrize("extra", [{"temperature": 2.5}, {"top_p": 1.5}, {"seed": 2**32}, {"max_tokens": 0}])
def test_out_of_range_values_are_refused(extra: dict) -> None:
    with pytest.raises(ValidationError):
        ChatCompletionRequest(model="m", messages=MSG, **extra)


def test_stream_options_need_stream() -> None:
    with pytest.raises(OvqError, match="stream_options provided, but stream not set to true"):
        ChatCompletionRequest(model="m", messages=MSG, stream_options={"include_usage": True})


def test_unknown_fields_are_ignored() -> None:
    assert ChatCompletionRequest(model="m", messages=MSG, user="u", metadata={"a": 1}).model == "m"


def test_completion_prompt_forms() -> None:
    assert CompletionRequest(model="m", prompt=["one"]).prompt == "one"
    assert CompletionRequest(model="m", prompt=[1, 2]).prompt == [1, 2]
    with pytest.raises(ValidationError):
        CompletionRequest(model="m", prompt=["a", "b"])
