"""A streamed response's turn reading the worker's events: text, calls, the finish and a failure, as the SDK reads
them; and chat-path errors renamed to the Responses fields."""
from __future__ import annotations

from typing import Any

import pytest
from openai.types.responses import Response as SDKResponse
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from api.openai.choices import ChoiceState
from api.openai.parsers import output_parser
from api.openai.responses.chain import Chain
from api.openai.responses.events import ResponseStream, initial_response
from api.openai.responses.protocol import ResponsesRequest, StreamEvent
from api.openai.responses.serving import Turn, page_limit, renamed
from api.ops.metrics import Record
from api.queue.client import ClientGone
from common.errors import OvqError
from common.events import delta

SDK_EVENT = TypeAdapter(ResponseStreamEvent)
USAGE = {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}
TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}


def turn(parser: Any = None, **fields: Any) -> Turn:
    body = ResponsesRequest.model_validate({"model": "m", "input": "hi", "stream": True, **fields})
    return Turn(body, ResponseStream(initial_response(body)), ChoiceState(0, parser), Chain(), "alpha", "m")


def done(reason: str = "stop") -> dict[str, Any]:
    return {"type": "done", "job": "j", "seq": 9, "finish_reason": reason, "usage": USAGE, "timings": {}}


def read(t: Turn, events: list[dict[str, Any]], record: Record) -> list[StreamEvent]:
    out = t.state.start()
    for event in events:
        out += t.read(event, record)  # type: ignore[arg-type]
    out += t.finish(record)
    for event in out:
        SDK_EVENT.validate_python(event)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out


def test_text_then_the_finish_completes_with_usage() -> None:
    t, record = turn(), Record("responses")
    out = read(t, [delta("j", 0, 0, "Hel", 1), delta("j", 1, 0, "lo", 1, finish_reason="stop"), done()], record)
    assert out[-1]["type"] == "response.completed"
    final = SDKResponse.model_validate(t.state.response.model_dump(by_alias=True))
    assert final.output_text == "Hello" and final.usage.input_tokens == 9 and final.usage.output_tokens == 3
    assert (record.outcome, record.prompt_tokens) == ("stop", 9)


def test_the_token_limit_is_incomplete() -> None:
    t, record = turn(), Record("responses")
    out = read(t, [delta("j", 0, 0, "Hel", 1, finish_reason="length"), done("length")], record)
    assert out[-1]["type"] == "response.incomplete" and record.outcome == "length"


def test_a_parsed_call_is_a_function_call_item() -> None:
    parser = output_parser("hermes3", None, "", False)
    t, record = turn(parser, tools=[TOOL]), Record("responses")
    text = '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'
    out = read(t, [delta("j", 0, 0, text, 9, finish_reason="stop"), done()], record)
    assert [item.type for item in t.state.response.output] == ["function_call"]
    assert out[-1]["type"] == "response.completed" and record.outcome == "tool_calls"


def test_a_workers_error_fails_the_response() -> None:
    t, record = turn(), Record("responses")
    error = {"type": "error", "job": "j", "seq": 2, "status": 500,
             "error": {"message": "the worker died", "type": "server_error", "param": None, "code": "worker_died"}}
    out = read(t, [delta("j", 0, 0, "Hel", 1), error], record)
    assert out[-1]["type"] == "response.failed"
    assert t.state.response.error.code == "server_error" and t.state.response.output[0].status == "incomplete"
    assert record.status == 500


def test_a_cancelled_job_is_the_client_gone() -> None:
    with pytest.raises(ClientGone):
        turn().read({"type": "cancelled", "job": "j", "seq": 1}, Record("responses"))  # type: ignore[arg-type]


@pytest.mark.parametrize(("param", "expected"), [
    ("messages", "input"), ("messages[3].content", "input"), ("max_tokens", "max_output_tokens"),
    ("response_format.json_schema", "text.format.json_schema"), ("temperature", "temperature"), (None, None)])
def test_chat_errors_name_the_responses_field(param: str | None, expected: str | None) -> None:
    assert renamed(OvqError("x", param=param)).body.param == expected


def test_the_listpage_limit() -> None:
    assert (page_limit(None), page_limit("1"), page_limit("100")) == (20, 1, 100)
    for bad in ("0", "101", "x"):
        with pytest.raises(OvqError, match="limit"):
            page_limit(bad)


def test_a_chat_part_type_in_an_error_is_named_as_the_responses_request_names_it() -> None:
    error = renamed(OvqError("content part type 'image_url' is not supported by this model", param="messages"))
    assert (error.body.param, error.body.message) == ("input", "content part type 'input_image' is not supported by "
                                                              "this model")
