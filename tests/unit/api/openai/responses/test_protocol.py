from __future__ import annotations

import pytest
from openai.types.responses import response_create_params
from pydantic import TypeAdapter

from api.openai.responses.events import initial_response
from api.openai.responses.protocol import (
    AllowedTools,
    FunctionCall,
    FunctionCallOutput,
    InputImage,
    InputText,
    Message,
    OutputText,
    Reasoning,
    ResponsesRequest,
    TextFormatJSONSchema,
    ToolChoiceFunction,
    parse_item,
)
from common.errors import OvqError

IMAGE = "data:image/png;base64,iVBORw0KGgo="
TOOL = {"type": "function", "name": "get_weather", "description": "d",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": False}
ITEMS = [
    {"role": "system", "content": "be brief"},
    {"role": "developer", "content": [{"type": "input_text", "text": "dev"}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "look"},
                                                     {"type": "input_image", "image_url": IMAGE, "detail": "low"}]},
    {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
     "content": [{"type": "output_text", "text": "ok", "annotations": []}]},
    {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}]},
    {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
     "arguments": '{"city":"Paris"}', "status": "completed"},
    {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    {"type": "function_call_output", "call_id": "call_1", "output": [{"type": "input_text", "text": "sunny"}]},
]


def request(**fields) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", "input": "hi", **fields})


def test_a_string_input_is_one_user_message() -> None:
    body = request()
    assert body.items() == [Message(role="user", content="hi")]
    assert body.store and not body.stream and not body.background and body.truncation == "disabled"
    assert body.tool_choice == "auto" and body.parallel_tool_calls and body.text.format.type == "text"


def test_every_item_type_parses() -> None:
    items = request(input=ITEMS).items()
    assert [type(i) for i in items] == [Message, Message, Message, Message, Reasoning, FunctionCall,
                                        FunctionCallOutput, FunctionCallOutput]
    assert items[2].content == [InputText(text="look"), InputImage(image_url=IMAGE, detail="low")]
    assert items[3].content == [OutputText(text="ok")]
    assert items[5].call_id == "call_1" and items[5].arguments == '{"city":"Paris"}'
    assert items[7].output == [InputText(text="sunny")]


def test_the_request_shapes_are_the_sdks() -> None:
    """The bodies these tests call valid are valid for the official SDK's own request type too."""
    sdk = TypeAdapter(response_create_params.ResponseCreateParamsNonStreaming)
    body = {"model": "m", "input": ITEMS, "instructions": "i", "tools": [TOOL], "max_output_tokens": 64,
            "tool_choice": {"type": "function", "name": "get_weather"}, "metadata": {"k": "v"},
            "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}}},
            "reasoning": {"effort": "low", "summary": "auto"}, "include": ["message.output_text.logprobs"],
            "top_logprobs": 1, "truncation": "disabled", "store": False, "parallel_tool_calls": False}
    sdk.validate_python(body)
    parsed = ResponsesRequest.model_validate(body)
    assert parsed.tool_choice == ToolChoiceFunction(name="get_weather")
    assert isinstance(parsed.text.format, TextFormatJSONSchema) and parsed.text.format.json_schema == {
        "type": "object"}
    assert parsed.logprobs and parsed.reasoning is not None and parsed.reasoning.effort == "low"


def test_accepted_and_ignored() -> None:
    body = request(include=["reasoning.encrypted_content", "file_search_call.results",
                            "message.input_image.image_url"], service_tier="auto", safety_identifier="u",
                   prompt_cache_key="k", max_tool_calls=3, metadata={f"k{i}": "v" * 512 for i in range(16)},
                   text={"format": {"type": "text"}, "verbosity": "low"}, tools=None, tool_choice=None)
    assert not body.logprobs and body.tools == [] and body.tool_choice == "auto"


def test_allowed_tools_names_tools_it_has() -> None:
    choice = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_weather"}]}
    assert isinstance(request(tools=[TOOL], tool_choice=choice).tool_choice, AllowedTools)


LONG = "x" * 65
INVALID = [
    ({"tools": [{"type": "web_search"}]}, "tools[0].type", "built-in tool 'web_search'"),
    ({"tools": [{"type": "web_search_preview"}]}, "tools[0].type", "not supported"),
    ({"tools": [{"type": "file_search", "vector_store_ids": []}]}, "tools[0].type", "not supported"),
    ({"tools": [{"type": "computer_use_preview"}]}, "tools[0].type", "not supported"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools[0].type", "not supported"),
    ({"tools": [{"type": "mcp", "server_label": "x"}]}, "tools[0].type", "not supported"),
    ({"tools": [{"type": "image_generation"}]}, "tools[0].type", "not supported"),
    ({"tools": [{"type": "banana"}]}, "tools[0].type", "Invalid value: 'banana'"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools[0].name",
     "Missing required parameter: 'tools[0].name'"),
    ({"tools": [{**TOOL, "name": "has space"}]}, "tools[0].name", "does not match pattern"),
    ({"tools": [{**TOOL, "name": LONG}]}, "tools[0].name", "does not match pattern"),
    ({"tools": [{**TOOL, "parameters": []}]}, "tools[0].parameters", "expected an object"),
    ({"tools": [TOOL, TOOL]}, "tools", "Duplicate tool name"),
    ({"tools": "f"}, "tools", "expected an array"),
    ({"tool_choice": "sometimes"}, "tool_choice", "Invalid value: 'sometimes'"),
    ({"tool_choice": 3}, "tool_choice", "Invalid type"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "name": "other"}}, "tool_choice",
     "Tool choice 'other' not found in 'tools' parameter."),
    ({"tools": [TOOL], "tool_choice": {"type": "allowed_tools", "mode": "auto",
                                       "tools": [{"type": "function", "name": "x"}]}}, "tool_choice", "'x' not found"),
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice.type", "not supported"),
    ({"tool_choice": {"type": "function"}}, "tool_choice.name", "Missing required parameter"),
    ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name", "Missing required"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema", "Missing required"),
    ({"text": {"format": {"type": "json_schema", "name": "a b", "schema": {}}}}, "text.format.name", "pattern"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": [1]}}}, "text.format.schema",
     "expected an object"),
    ({"text": {"format": {"type": "xml"}}}, "text.format.type", "Invalid value: 'xml'"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", "at most 16 properties"),
    ({"metadata": {LONG: "v"}}, "metadata", "longer than 64"),
    ({"metadata": {"k": "v" * 513}}, "metadata.k", "maximum length 512"),
    ({"include": ["everything"]}, "include[0]", "Invalid value: 'everything'"),
    ({"max_output_tokens": 15}, "max_output_tokens", "Expected a value >= 16"),
    ({"temperature": 2.5}, "temperature", "between 0 and 2"),
    ({"top_p": 1.5}, "top_p", "between 0 and 1"),
    ({"top_logprobs": 21}, "top_logprobs", "between 0 and 20"),
    ({"max_tool_calls": 0}, "max_tool_calls", "Expected a value >= 1"),
    ({"stream_options": {"include_obfuscation": False}}, "stream_options", "stream is true"),
    ({"background": True, "store": False}, "background", "requires store"),
    ({"conversation": "chat_1"}, "conversation", "Expected an ID that begins with 'conv_'"),
    ({"conversation": {"id": 5}}, "conversation", "Expected an ID that begins with 'conv_'"),
    ({"conversation": {"id": "conv_1"}, "previous_response_id": "resp_1"}, None,
     "Ensure you are only providing one of: 'previous_response_id' or 'conversation'."),
    ({"prompt": {"id": "pmpt_1"}}, "prompt", "not supported"),
    ({"input": 5}, "input", "expected a string or an array"),
    ({"input": [5]}, "input[0]", "expected an object"),
    ({"input": [{"content": "x"}]}, "input[0].type", "Missing required"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]", "item_reference"),
    ({"input": [{"type": "computer_call_output", "call_id": "c"}]}, "input[0].type",
     "input item type 'computer_call_output'"),
    ({"input": [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}]}, "input[0].content[0].type",
     "Invalid value: 'output_text'. Supported values are: 'input_text', 'input_image', 'input_file' and "
     "'input_audio'."),
    ({"input": [{"role": "assistant", "content": [{"type": "input_text", "text": "x"}]}]},
     "input[0].content[0].type", "Supported values are: 'output_text' and 'refusal'."),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]},
     "input[0].content[0].file_id", "base64 data URL"),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content[0].image_url",
     "Missing required"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0]",
     "input_file content is not supported"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "Invalid 'input[0].role'"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id",
     "Missing required parameter: 'input[0].call_id'."),
    ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0].output", "Missing required"),
]


@pytest.mark.parametrize(("fields", "param", "message"), INVALID)
def test_what_openai_refuses_is_a_400_naming_the_parameter(fields: dict, param: str, message: str) -> None:
    with pytest.raises(OvqError) as caught:
        request(**fields)
    assert caught.value.status == 400
    assert caught.value.body.param == param
    assert message in caught.value.body.message


def test_stored_items_parse_back() -> None:
    """Items as a previous response stored them (JSON objects) parse as input items."""
    for raw in ITEMS:
        item = parse_item(raw)
        assert parse_item(item.model_dump(by_alias=True)) == item
        assert parse_item(item) is item


@pytest.mark.parametrize("conversation", ["conv_1", {"id": "conv_1"}])
def test_a_conversation_is_an_id_or_an_object_and_the_response_echoes_it(conversation: object) -> None:
    body = request(conversation=conversation)
    assert body.conversation_id == "conv_1"
    assert initial_response(body).model_dump(by_alias=True)["conversation"] == {"id": "conv_1"}
    assert "conversation" not in initial_response(request()).model_dump(by_alias=True)  # none: absent, not null
