"""Reading a batch's input file as OpenAI validates it: what fails the batch, naming the line."""
from __future__ import annotations

import orjson

from workers.batch.inputs import parse_input


def line(custom_id: str, model: str = "m", url: str = "/v1/chat/completions", **extra) -> bytes:
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": url,
                         "body": {"model": model, "messages": [{"role": "user", "content": "hi"}]}, **extra})


def parse(*lines: bytes, endpoint: str = "/v1/chat/completions", max_requests: int = 100, max_bytes: int = 10**6):
    return parse_input(b"\n".join(lines), endpoint, max_requests, max_bytes)


def test_good_lines_keep_their_order_line_numbers_and_model() -> None:
    parsed = parse(line("a"), b"", b"  ", line("b", url="/v3/chat/completions"))
    assert parsed.errors == []
    assert [(x.number, x.custom_id) for x in parsed.lines] == [(1, "a"), (4, "b")]
    assert parsed.model == "m"


def test_each_problem_is_named_with_its_line() -> None:
    parsed = parse(line("a"), b"[1, 2", b"[1, 2]", line("a"), line("c", url="/v1/completions"),
                   line("d", model="other"), orjson.dumps({"custom_id": "e", "method": "POST", "url": "x"}),
                   line("f", method="GET"), orjson.dumps({"custom_id": 7, "method": "POST",
                                                          "url": "/v1/chat/completions", "body": {"model": "m"}}),
                   orjson.dumps({"custom_id": "g", "method": "POST", "url": "/v1/chat/completions", "body": {}}))
    assert [(e.code, e.line, e.param) for e in parsed.errors] == [
        ("invalid_json_line", 2, None), ("invalid_json_line", 3, None), ("duplicate_custom_id", 4, "custom_id"),
        ("url_mismatch", 5, "url"), ("model_mismatch", 6, "body.model"),
        ("missing_required_parameter", 7, "body"), ("invalid_request", 8, "method"),
        ("invalid_request", 9, "custom_id"), ("missing_required_parameter", 10, "body.model")]


def test_limits_and_empty_files() -> None:
    assert [e.code for e in parse(b"").errors] == ["empty_file"]
    too_many = parse(*[line(str(i)) for i in range(4)], max_requests=3)
    assert [(e.code, e.line) for e in too_many.errors] == [("too_many_tasks", 4)]
    data = line("a")
    assert [e.code for e in parse(data, max_bytes=len(data) - 1).errors] == ["file_too_large"]
