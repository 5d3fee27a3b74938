"""Conversation items as OpenAI takes and lists them: the SDK's own item types read every listed item."""
from __future__ import annotations

import pytest
from openai.types.conversations import ConversationItem
from pydantic import TypeAdapter

from api.openai.conversations.protocol import ConversationCreate, ItemsCreate, listed, parse_include
from api.openai.responses.convert import identified
from common.errors import OvqError

SDK_ITEM = TypeAdapter(ConversationItem)
LOGPROB = {"token": "Hi", "bytes": [72, 105], "logprob": -0.5, "top_logprobs": []}


def test_listed_items_are_the_sdks_conversation_items() -> None:
    items = identified(ItemsCreate.model_validate({"items": [
        {"role": "user", "content": "Hello"},
        {"type": "message", "role": "assistant", "content": "Hi"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]}]}).items)
    shown = [listed(item, frozenset()) for item in items]
    parsed = [SDK_ITEM.validate_python(item) for item in shown]
    assert [p.type for p in parsed] == ["message", "message", "function_call", "function_call_output", "reasoning"]
    assert parsed[0].content[0].type == "input_text" and parsed[1].content[0].type == "output_text"
    assert [item["id"][:3] for item in shown] == ["msg", "msg", "fc_", "fco", "rs_"]
    assert all(item["status"] == "completed" for item in shown)


def test_log_probabilities_are_listed_only_when_included() -> None:
    answer = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
              "content": [{"type": "output_text", "text": "Hi", "annotations": [], "logprobs": [LOGPROB]}]}
    assert listed(answer, frozenset())["content"][0]["logprobs"] == []
    assert listed(answer, parse_include(["message.output_text.logprobs"]))["content"][0]["logprobs"] == [LOGPROB]


@pytest.mark.parametrize(("body", "param"), [
    ({"items": [{"role": "user", "content": "x"}] * 21}, "items"),
    ({"items": []}, "items"),
    ({}, "items"),
    ({"items": "x"}, "items"),
    ({"items": [{"type": "message", "role": "robot", "content": "x"}]}, "items[0].role"),
])
def test_items_create_takes_one_to_twenty_valid_items(body: dict, param: str) -> None:
    with pytest.raises(OvqError) as caught:
        ItemsCreate.model_validate(body)
    assert (caught.value.status, caught.value.body.param) == (400, param)


def test_a_conversation_may_start_empty_but_not_with_bad_metadata() -> None:
    assert ConversationCreate.model_validate({}).items == []
    with pytest.raises(OvqError) as caught:
        ConversationCreate.model_validate({"metadata": {f"k{i}": "v" for i in range(17)}})
    assert caught.value.body.param == "metadata"
    with pytest.raises(OvqError) as caught:
        parse_include(["nothing"])
    assert caught.value.body.param == "include[0]"
