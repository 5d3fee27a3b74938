from __future__ import annotations

from typing import Any

import orjson
import pytest
from openai import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response as SDKResponse
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from api.openai.choices import ChoiceState
from api.openai.parsers import Parsed, ParsedDelta, ToolCall, ToolCallDelta, output_parser
from api.openai.responses.events import ResponseStream, initial_response, render, sse
from api.openai.responses.protocol import (
    FunctionCall,
    OutputMessage,
    Reasoning,
    Response,
    ResponsesRequest,
    StreamEvent,
)
from common.errors import ErrorBody
from tests import openresponses

SDK_EVENT = TypeAdapter(ResponseStreamEvent)
TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
USAGE = {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}


def stream(logprobs: int | None = None, **fields: Any) -> ResponseStream:
    body = ResponsesRequest.model_validate({"model": "m", "input": "hi", "tools": [TOOL], **fields})
    return ResponseStream(initial_response(body, "resp_1", 1700000000), logprobs=logprobs)


def wire(events: list[StreamEvent]) -> list[dict[str, Any]]:
    """Each event as a client reads it: SSE parsed back, checked against the SDK's event union and the Open
    Responses spec's schema of its type."""
    out = []
    for frame in render(events).split(b"\n\n")[:-1]:
        head, data = frame.split(b"\n")
        body = orjson.loads(data.removeprefix(b"data: "))
        assert head == b"event: " + body["type"].encode()
        sdk = SDK_EVENT.validate_python(body)
        assert sdk.type == body["type"]
        openresponses.event(body)
        out.append(body)
    return out


def types(events: list[StreamEvent]) -> list[str]:
    return [e["type"] for e in wire(events)]


def sdk_final(s: ResponseStream, events: list[StreamEvent]) -> SDKResponse:
    """The SDK's own stream accumulator reads the events, and agrees with the final response ovq built."""
    state = ResponseStreamState(input_tools=[TOOL], text_format=omit)
    for body in wire(events):
        state.handle_event(SDK_EVENT.validate_python(body))
    openresponses.response(s.response.model_dump(by_alias=True))
    final = SDKResponse.model_validate(s.response.model_dump(by_alias=True))
    assert final.id == "resp_1" and final.object == "response"
    snapshot = state._ResponseStreamState__current_snapshot  # what the deltas built, item by item
    assert [i.type for i in snapshot.output] == [i.type for i in final.output]
    for built, item in zip(snapshot.output, final.output, strict=True):
        if item.type == "message":
            assert built.content[0].text == item.content[0].text
        elif item.type == "function_call":
            assert (built.call_id, built.name, built.arguments) == (item.call_id, item.name, item.arguments)
    if final.status == "completed":
        assert state._completed_response is not None
        assert state._completed_response.output_text == final.output_text
    return final


TEXT = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]


def test_a_text_answer() -> None:
    s = stream()
    events = s.start() + s.feed(ParsedDelta(content="Hel")) + s.feed(ParsedDelta(content="lo")) + \
        s.finish("stop", USAGE)
    assert types(events) == TEXT
    assert [e["sequence_number"] for e in events] == list(range(len(TEXT)))
    bodies = wire(events)
    assert bodies[0]["response"]["status"] == "in_progress" and bodies[0]["response"]["output"] == []
    assert bodies[4]["delta"] == "Hel" and bodies[4]["item_id"].startswith("msg_") and bodies[4]["logprobs"] == []
    assert bodies[6]["text"] == "Hello" and bodies[8]["item"]["status"] == "completed"
    final = sdk_final(s, events)
    assert final.status == "completed" and final.output_text == "Hello" and final.completed_at is not None
    assert final.usage is not None and (final.usage.input_tokens, final.usage.output_tokens,
                                        final.usage.total_tokens) == (7, 5, 12)
    assert final.usage.input_tokens_details.cached_tokens == 0
    assert final.usage.output_tokens_details.reasoning_tokens == 0
    assert bodies[-1]["response"] == s.response.model_dump(by_alias=True)
    assert final.tools[0].type == "function" and final.tool_choice == "auto"


def test_tool_calls() -> None:
    s = stream()
    events = s.start() + s.feed(ParsedDelta(tool_calls=[ToolCallDelta(0, "call_a", "get_weather", '{"ci')])) + \
        s.feed(ParsedDelta(tool_calls=[ToolCallDelta(0, arguments='ty":"Paris"}'),
                                       ToolCallDelta(1, "call_b", "get_weather", "{}")])) + \
        s.finish("tool_calls", USAGE)
    assert types(events)[2:] == [
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    added = wire(events)[2]["item"]
    assert added["arguments"] == "" and added["status"] == "in_progress" and added["id"].startswith("fc_")
    final = sdk_final(s, events)
    calls = [item for item in final.output if item.type == "function_call"]
    assert [(c.call_id, c.name, c.arguments, c.status) for c in calls] == [
        ("call_a", "get_weather", '{"city":"Paris"}', "completed"), ("call_b", "get_weather", "{}", "completed")]
    assert final.status == "completed" and final.output_text == ""


def test_reasoning_then_text() -> None:
    s = stream()
    events = s.start() + s.feed(ParsedDelta(reasoning="Let me ")) + s.feed(ParsedDelta(reasoning="think.")) + \
        s.feed(ParsedDelta(content="\n\n")) + s.feed(ParsedDelta(content="Yes.")) + s.finish("stop", USAGE)
    assert types(events)[2:] == [
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
        "response.output_item.done", *TEXT[2:4], "response.output_text.delta", *TEXT[6:]]
    bodies = wire(events)
    assert bodies[3]["part"] == {"type": "reasoning_text", "text": ""}
    assert bodies[6]["text"] == "Let me think." and bodies[8]["item"]["id"].startswith("rs_")
    final = sdk_final(s, events)
    reasoning, message = final.output
    assert reasoning.type == "reasoning" and reasoning.content is not None
    assert reasoning.content[0].text == "Let me think." and reasoning.summary == []
    assert message.type == "message" and final.output_text == "\n\nYes."


def test_whitespace_alone_opens_no_message() -> None:
    """Between reasoning and calls a model writes newlines: they are no answer of their own."""
    s = stream()
    events = s.start() + s.feed(ParsedDelta(reasoning="r")) + s.feed(ParsedDelta(content="\n\n")) + \
        s.feed(ParsedDelta(tool_calls=[ToolCallDelta(0, "call_a", "get_weather", "{}")])) + \
        s.feed(ParsedDelta(content=" \n")) + s.finish("tool_calls")
    assert "response.output_text.delta" not in types(events)
    assert [type(i) for i in s.response.output] == [Reasoning, FunctionCall]
    sdk_final(s, events)


def test_an_empty_answer_is_an_empty_message() -> None:
    s = stream()
    events = s.start() + s.feed(ParsedDelta(content="  ")) + s.finish("stop")
    assert types(events) == TEXT[:4] + ["response.output_text.delta"] + TEXT[6:]
    assert s.response.output_text == "  " and isinstance(s.response.output[0], OutputMessage)
    assert types(stream().finish("stop")) == TEXT[2:4] + TEXT[6:]


def test_cut_by_the_token_limit_is_incomplete() -> None:
    s = stream()
    events = s.start() + s.feed(ParsedDelta(content="Once upon")) + s.finish("length", USAGE)
    bodies = wire(events)
    assert bodies[-1]["type"] == "response.incomplete"
    assert bodies[-2]["item"]["status"] == "incomplete"
    final = sdk_final(s, events)
    assert final.status == "incomplete" and final.incomplete_details is not None
    assert final.incomplete_details.reason == "max_output_tokens" and final.completed_at is None
    assert final.output_text == "Once upon"


def test_a_call_cut_short_is_incomplete_and_earlier_items_stay_complete() -> None:
    s = stream()
    events = s.start() + s.feed(ParsedDelta(content="Sure.")) + \
        s.feed(ParsedDelta(tool_calls=[ToolCallDelta(0, "call_a", "get_weather", '{"ci')])) + s.finish("length")
    final = sdk_final(s, events)
    assert [item.status for item in final.output] == ["completed", "incomplete"]


@pytest.mark.parametrize(("status", "error", "code"), [
    (500, {"message": "engine crashed", "type": "server_error", "code": "internal_error"}, "server_error"),
    (400, {"message": "prompt too long", "param": "input", "code": "context_length_exceeded"}, "invalid_prompt"),
    (429, {"message": "busy", "type": "rate_limit", "code": None}, "rate_limit_exceeded"),
    (400, {"message": "bad image", "code": "invalid_image"}, "invalid_image"),
])
def test_a_failure(status: int, error: dict, code: str) -> None:
    s = stream()
    events = s.start() + s.feed(ParsedDelta(content="par")) + s.fail(error, status)
    bodies = wire(events)
    assert bodies[-1]["type"] == "response.failed" and bodies[-2]["item"]["status"] == "incomplete"
    final = sdk_final(s, events)
    assert final.status == "failed" and final.error is not None
    assert (final.error.code, final.error.message) == (code, error["message"])
    assert s.finish("stop") == [] and s.fail(error) == [] and s.cancel() == []


def test_a_failure_takes_the_error_body() -> None:
    s = stream()
    events = s.start() + s.fail(ErrorBody(message="queue away", type="service_unavailable"), 503)
    assert sdk_final(s, events).error.code == "server_error"


def test_cancelled_has_no_terminal_event() -> None:
    s = stream()
    events = s.start() + s.feed(ParsedDelta(content="par")) + s.cancel()
    assert types(events)[-4:] == ["response.output_text.delta", "response.output_text.done",
                                  "response.content_part.done", "response.output_item.done"]
    assert s.response.status == "cancelled" and s.response.output[0].status == "incomplete"
    SDKResponse.model_validate(s.response.model_dump(by_alias=True))


def test_a_background_response_is_queued_until_a_worker_takes_it() -> None:
    s = stream(background=True)
    created = s.created()
    assert types(created) == ["response.created", "response.queued"]
    assert wire(created)[0]["response"]["status"] == "queued" and wire(created)[0]["response"]["background"]
    assert wire(s.in_progress())[0]["response"]["status"] == "in_progress"


def test_streamed_and_whole_answers_agree() -> None:
    parsed = Parsed("It is sunny.", "Think.", [ToolCall("get_weather", '{"city":"Paris"}', "call_x")])
    streamed = stream()
    streamed.start()
    streamed.feed(ParsedDelta(reasoning="Think."))
    streamed.feed(ParsedDelta(content="It is "))
    streamed.feed(ParsedDelta(content="sunny."))
    streamed.feed(ParsedDelta(tool_calls=[ToolCallDelta(0, "call_x", "get_weather", '{"city":')]))
    streamed.feed(ParsedDelta(tool_calls=[ToolCallDelta(0, None, None, '"Paris"}')]))
    streamed.finish("tool_calls", USAGE)
    whole = stream().whole(parsed, "tool_calls", USAGE)

    def shape(response: Any) -> dict:
        body = response.model_dump(by_alias=True, exclude={"completed_at"})
        for item in body["output"]:
            item["id"] = item["type"]
        return body

    assert shape(whole) == shape(streamed.response)


def test_logprobs_go_with_the_text() -> None:
    entries = [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105]}, {"token": "!", "logprob": -1.0, "bytes": [33]}]
    s = stream(logprobs=1)
    events = s.start() + s.feed(ParsedDelta(content="Hi!"), entries) + s.finish("stop")
    delta = wire(events)[4]
    hi = {"token": "Hi", "logprob": -0.5, "bytes": [72, 105]}
    assert delta["logprobs"][0] == {**hi, "top_logprobs": [hi]}
    final = sdk_final(s, events)
    text = final.output[0].content[0]
    assert text.logprobs is not None and [lp.token for lp in text.logprobs] == ["Hi", "!"]
    assert text.logprobs[1].bytes == [33] and text.logprobs[1].top_logprobs[0].logprob == -1.0
    plain = stream(logprobs=None)
    plain.whole(Parsed("Hi!", None, []), "stop", logprobs=entries)
    assert plain.response.output[0].content[0].logprobs == []  # the spec takes an array, never null


def test_a_snapshot_while_it_runs() -> None:
    s = stream()
    s.start()
    s.feed(ParsedDelta(content="Hel"))
    s.feed(ParsedDelta(content="lo"))
    snapshot = s.snapshot()
    assert snapshot.output_text == "Hello" and snapshot.output[0].status == "in_progress"
    assert s.response.output_text == ""  # the live item is filled when it closes
    SDKResponse.model_validate(snapshot.model_dump(by_alias=True))


def test_sse_frames_ids_and_resume() -> None:
    s = ResponseStream(stream().response, sequence=40)
    events = s.start() + s.feed(ParsedDelta(content="x"))
    assert [e["sequence_number"] for e in events] == list(range(40, 40 + len(events)))
    frame = sse(events[0], ids=True)
    assert frame.startswith(b"id: 40\nevent: response.created\ndata: {") and frame.endswith(b"}\n\n")
    assert orjson.loads(frame.split(b"data: ", 1)[1])["sequence_number"] == 40
    resumed = render(events, after=41, ids=True)
    assert resumed.startswith(b"id: 42\nevent: response.output_item.added\n") and b"id: 41\n" not in resumed
    assert render(events, after=41) == b"".join(sse(e) for e in events[2:])


def test_an_error_event() -> None:
    s = stream()
    (event,) = s.error(ErrorBody(message="queue away", code="service_unavailable"))
    body = wire([event])[0]
    error = {"code": "service_unavailable", "message": "queue away", "param": None}
    assert body == {"type": "error", "sequence_number": 0, **error, "error": {"type": "invalid_request_error",
                                                                              **error}}


def test_the_request_settings_echo_in_the_sdks_shape() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    s = stream(instructions="i", max_output_tokens=32, temperature=0.2, top_p=0.5, metadata={"k": "v"},
               store=False, user="u", reasoning={"effort": "low"},
               text={"format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}},
               tool_choice={"type": "allowed_tools", "mode": "auto",
                            "tools": [{"type": "function", "name": "get_weather"}]})
    events = s.start() + s.feed(ParsedDelta(content='{"a":1}')) + s.finish("stop")
    final = sdk_final(s, events)
    assert final.text is not None and final.text.format is not None and final.text.format.type == "json_schema"
    assert final.text.format.schema_ == schema and final.tool_choice.type == "allowed_tools"
    assert (final.instructions, final.max_output_tokens, final.temperature, final.top_p, final.metadata,
            final.store, final.user) == ("i", 32, 0.2, 0.5, {"k": "v"}, False, "u")
    assert final.reasoning is not None and final.reasoning.effort == "low"


def test_what_the_chat_parsers_make_of_a_real_answer() -> None:
    """Worker deltas through `ChoiceState` (qwen3 reasoning, hermes3 calls), streamed and whole, give one answer."""
    answer = ('<think>Paris, so weather.</think>\n\nChecking.\n<tool_call>\n{"name": "get_weather", '
              '"arguments": {"city": "Paris"}}\n</tool_call>')
    chunks = [answer[i:i + 7] for i in range(0, len(answer), 7)]
    streamed, choice = stream(), ChoiceState(0, output_parser("hermes3", "qwen3"))
    events = streamed.start()
    for i, text in enumerate(chunks):
        delta = {"text": text, **({"finish_reason": "stop"} if i == len(chunks) - 1 else {})}
        events += streamed.feed(choice.feed(delta))
    events += streamed.finish(choice.finish_reason(choice.called), USAGE)
    final = sdk_final(streamed, events)
    assert [item.type for item in final.output] == ["reasoning", "message", "function_call"]
    assert final.output[0].content[0].text == "Paris, so weather."
    assert final.output_text.strip() == "Checking."
    assert final.output[2].name == "get_weather" and orjson.loads(final.output[2].arguments) == {"city": "Paris"}

    whole = ChoiceState(0, output_parser("hermes3", "qwen3"))
    whole.add({"text": answer, "finish_reason": "stop"})
    parsed = whole.parsed()
    response = stream().whole(parsed, whole.finish_reason(bool(parsed.tool_calls)), USAGE)
    assert [item.type for item in response.output] == ["reasoning", "message", "function_call"]
    assert response.output_text.strip() == "Checking." and response.output[2].arguments == final.output[2].arguments


def test_the_response_reports_the_sampling_and_tier_used_as_numbers() -> None:
    """What the request set, else the model's defaults (its card's), else OpenAI's; never null (the spec)."""
    defaults = {"temperature": 0.2, "top_p": 0.9, "presence_penalty": 0.0, "frequency_penalty": 0.0}
    body = ResponsesRequest.model_validate({"model": "m", "input": "hi", "top_p": 0.5, "frequency_penalty": 1.5,
                                            "safety_identifier": "u1", "prompt_cache_key": "k"})
    response = initial_response(body, sampling=defaults, tier="flex").model_dump(by_alias=True)
    openresponses.response(response)
    assert {k: response[k] for k in (*defaults, "top_logprobs", "service_tier", "safety_identifier",
                                     "prompt_cache_key")} == {
        "temperature": 0.2, "top_p": 0.5, "presence_penalty": 0.0, "frequency_penalty": 1.5, "top_logprobs": 0,
        "service_tier": "flex", "safety_identifier": "u1", "prompt_cache_key": "k"}
    bare = initial_response(ResponsesRequest(model="m", input="hi")).model_dump(by_alias=True)
    assert (bare["temperature"], bare["top_p"], bare["service_tier"]) == (1.0, 1.0, "default")
    stored = Response.model_validate({**bare, "temperature": None, "top_p": None, "top_logprobs": None})
    assert (stored.temperature, stored.top_p, stored.top_logprobs) == (1.0, 1.0, 0)  # stored before: nulls
