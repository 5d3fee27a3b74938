from __future__ import annotations

from importlib import resources

import pytest

from api.openai.guidance import chat_plan
from api.openai.parsers import Parsed, ToolCall
from api.openai.protocol import ChatCompletionRequest, NamedToolChoice
from api.openai.responses.convert import stored_items, to_chat
from api.openai.responses.events import ResponseStream, initial_response
from api.openai.responses.protocol import ResponsesRequest
from api.openai.templates import render, template_message
from common.errors import OvqError
from common.modelcard import ModelCard
from common.servable import ServableType

IMAGE = "data:image/png;base64,iVBORw0KGgo="
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = {"type": "function", "name": "get_weather", "description": "weather", "parameters": PARAMS, "strict": True}
OTHER = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}
CALL = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'}


def chat(history: list | tuple = (), **fields) -> ChatCompletionRequest:
    return to_chat(ResponsesRequest.model_validate({"model": "m", "input": "hi", **fields}), history)


def dumped(request: ChatCompletionRequest) -> list[dict]:
    return [m.model_dump(exclude_none=True) for m in request.messages]


def test_instructions_come_first_as_a_system_message() -> None:
    request = chat(instructions="Be brief.")
    assert dumped(request) == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert request.model == "m" and not request.stream and request.tools is None


def test_previous_items_come_between_this_requests_instructions_and_its_input() -> None:
    history = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "first"}]},
               {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": "one", "annotations": []}]}]
    request = chat(history, instructions="Now.")
    assert dumped(request) == [{"role": "system", "content": "Now."},
                               {"role": "user", "content": [{"type": "text", "text": "first"}]},
                               {"role": "assistant", "content": "one"}, {"role": "user", "content": "hi"}]


def test_every_message_kind() -> None:
    request = chat(input=[
        {"role": "system", "content": "s"}, {"role": "developer", "content": "d"},
        {"role": "user", "content": [{"type": "input_text", "text": "see"},
                                     {"type": "input_image", "image_url": IMAGE, "detail": "high"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "a", "annotations": []},
                                          {"type": "refusal", "refusal": "no"}]},
        {"role": "assistant", "content": "plain"}])
    assert dumped(request) == [
        {"role": "system", "content": "s"}, {"role": "developer", "content": "d"},
        {"role": "user", "content": [{"type": "text", "text": "see"},
                                     {"type": "image_url", "image_url": {"url": IMAGE, "detail": "high"}}]},
        {"role": "assistant", "content": "ano"}, {"role": "assistant", "content": "plain"}]
    assert request.messages[2].image_urls() == [IMAGE]


def test_calls_and_their_outputs() -> None:
    second = {**CALL, "call_id": "call_2", "arguments": '{"city":"Rome"}'}
    request = chat(tools=[TOOL], input=[
        {"role": "user", "content": "weather?"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "r"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
        CALL, second,
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_2",
         "output": [{"type": "input_text", "text": "rain"}, {"type": "input_image", "image_url": IMAGE}]}])
    assert dumped(request)[1:] == [
        {"role": "assistant", "content": "Checking.", "reasoning_content": "r", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": [
            {"type": "text", "text": "rain"}, {"type": "image_url", "image_url": {"url": IMAGE, "detail": "auto"}}]}]


def test_reasoning_starts_a_new_assistant_turn_and_is_dropped_before_a_user_message() -> None:
    summary = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "a"},
                                                {"type": "summary_text", "text": "b"}]}
    request = chat(input=[{"role": "assistant", "content": "x"}, summary, CALL, summary,
                          {"role": "user", "content": "u"}])
    messages = dumped(request)
    assert messages[0] == {"role": "assistant", "content": "x"}
    assert messages[1]["reasoning_content"] == "a\n\nb" and messages[1]["tool_calls"][0]["id"] == "call_1"
    assert messages[2] == {"role": "user", "content": "u"}


def test_an_output_without_its_call_is_a_400() -> None:
    with pytest.raises(OvqError, match="No tool call found for function call output with call_id call_9") as caught:
        chat(input=[{"role": "user", "content": "x"}, {"type": "function_call_output", "call_id": "call_9",
                                                         "output": "?"}])
    assert caught.value.body.param == "input[1].call_id"


def test_nothing_to_answer_is_a_400() -> None:
    with pytest.raises(OvqError, match="Missing required parameter: 'input'") as caught:
        chat(input=[], instructions="x")
    assert caught.value.body.param == "input"


def test_a_previous_response_is_history() -> None:
    """What ovq stores for a response (its output items, dumped) is what the next turn reads back."""
    first = ResponsesRequest.model_validate({"model": "m", "input": "weather in Paris?", "tools": [TOOL]})
    stream = ResponseStream(initial_response(first))
    response = stream.whole(Parsed("Checking.", "think", [ToolCall("get_weather", '{"city":"Paris"}', "call_7")]),
                            "tool_calls")
    history = stored_items(first, response)
    assert [item["id"][:3] for item in history] == ["msg", "rs_", "msg", "fc_"]
    request = chat(history, tools=[TOOL], input=[{"type": "function_call_output", "call_id": "call_7",
                                                  "output": "sunny"}])
    assert dumped(request) == [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "think", "tool_calls": [
            {"id": "call_7", "type": "function", "function": {"name": "get_weather",
                                                              "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_7", "content": "sunny"}]


def test_tools_take_chats_shape() -> None:
    request = chat(tools=[TOOL, OTHER], tool_choice="required", parallel_tool_calls=False)
    assert [t.model_dump(exclude_none=True) for t in request.tools or []] == [
        {"type": "function", "function": {"name": "get_weather", "description": "weather", "parameters": PARAMS,
                                          "strict": True}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]
    assert request.tool_choice == "required" and request.parallel_tool_calls is False


def test_a_named_function_and_allowed_tools() -> None:
    named = chat(tools=[TOOL, OTHER], tool_choice={"type": "function", "name": "get_time"})
    assert isinstance(named.tool_choice, NamedToolChoice) and named.tool_choice.function.name == "get_time"
    allowed = chat(tools=[TOOL, OTHER], tool_choice={"type": "allowed_tools", "mode": "required",
                                                     "tools": [{"type": "function", "name": "get_time"}]})
    assert [t.function.name for t in allowed.tools or []] == ["get_time"] and allowed.tool_choice == "required"
    assert chat(tools=[TOOL], tool_choice="none").tool_choice == "none"


def test_a_tool_schema_the_grammar_compiler_would_refuse_is_a_400() -> None:
    with pytest.raises(OvqError, match="not a valid JSON schema") as caught:
        chat(tools=[{**TOOL, "parameters": {"type": "foo"}}])
    assert caught.value.body.param == "tools[0].parameters"


def test_text_format_becomes_response_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    request = chat(text={"format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}})
    assert request.response_format is not None and request.response_format.type == "json_schema"
    assert request.response_format.json_schema is not None
    assert request.response_format.json_schema.name == "out"
    assert request.response_format.json_schema.json_schema == schema
    assert chat(text={"format": {"type": "json_object"}}).response_format.type == "json_object"
    assert chat(text={"format": {"type": "text"}}).response_format is None
    with pytest.raises(OvqError) as caught:
        chat(text={"format": {"type": "json_schema", "name": "out", "schema": {"type": 5}}})
    assert caught.value.body.param == "text.format.schema"


def test_sampling_and_limits() -> None:
    request = chat(max_output_tokens=64, temperature=0.5, top_p=0.9, stream=True, seed=7, top_k=20)
    assert (request.max_tokens, request.temperature, request.top_p, request.stream) == (64, 0.5, 0.9, True)
    assert (request.seed, request.top_k) == (7, 20)
    assert chat().max_tokens is None and chat().top_logprobs_asked is None


def test_a_chat_limit_is_still_a_400() -> None:
    with pytest.raises(OvqError, match="top_p out of range") as caught:
        chat(top_p=0)
    assert caught.value.body.param == "top_p"


def test_logprobs_when_included() -> None:
    assert chat(include=["message.output_text.logprobs"]).top_logprobs_asked == 0
    assert chat(include=["message.output_text.logprobs"], top_logprobs=1).top_logprobs_asked == 1
    assert chat(top_logprobs=1).top_logprobs_asked is None
    with pytest.raises(OvqError, match="top_logprobs above 1 is not supported"):
        chat(include=["message.output_text.logprobs"], top_logprobs=5)


def test_reasoning_effort_reaches_the_template() -> None:
    assert chat(reasoning={"effort": "high"}).chat_template_kwargs == {"reasoning_effort": "high"}
    assert chat(reasoning={"effort": "none"}, chat_template_kwargs={"x": 1}).chat_template_kwargs == {
        "x": 1, "reasoning_effort": "none", "enable_thinking": False}
    assert chat(reasoning={"summary": "auto"}).chat_template_kwargs is None


def test_the_chat_path_plans_and_renders_it() -> None:
    """The converted request goes through what /chat/completions does with it: the plan and the template."""
    source = resources.files("common.models").joinpath("chat_templates/chatml_hermes_tools.jinja").read_text()
    card = ModelCard(name="m", device="CPU", servable_type=ServableType.LM_CB, created=0, chat_template=source,
                     tool_parser="hermes3")
    request = chat(instructions="Be brief.", tools=[TOOL], tool_choice="required", input=[
        {"role": "user", "content": "weather?"}, CALL,
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}])
    plan = chat_plan(request, card)
    assert plan.forced and plan.tool_parser == "hermes3" and plan.structure is not None
    prompt = render(card.chat_template, [template_message(m, False) for m in request.messages], "", "",
                    {"tools": plan.tools})
    assert "Be brief." in prompt and "get_weather" in prompt and "sunny" in prompt and "Paris" in prompt
    assert prompt.index("Be brief.") < prompt.index("weather?") < prompt.index("Paris") < prompt.index("sunny")
