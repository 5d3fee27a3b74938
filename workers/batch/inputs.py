"""A batch's input file, read and checked as OpenAI's Batch API does before it runs a line.

Each line is `{"custom_id", "method": "POST", "url", "body"}`. What fails the whole batch (status `failed`, each
problem in `errors` with its line number): a line that is not a JSON object, a missing field, a method other
than POST, a url other than the batch's endpoint, a duplicate custom_id, a second model, an empty file, more
lines or bytes than the limits. What a line's body says beyond its model is checked when it runs, by the live
endpoint itself: a bad body is that line's error, not the batch's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from common.batch.models import LineError

MAX_ERRORS = 100


@dataclass
class InputLine:
    """A checked line. Only its bytes are kept (50,000 parsed bodies would take several times the file's size);
    the body is parsed again when the line is sent."""

    number: int  # 1-based line of the file
    custom_id: str
    raw: bytes

    @property
    def body(self) -> dict[str, Any]:
        return orjson.loads(self.raw)["body"]


@dataclass
class ParsedInput:
    lines: list[InputLine] = field(default_factory=list)
    errors: list[LineError] = field(default_factory=list)
    model: str | None = None
    model_line: int = 0

    def fail(self, code: str, message: str, line: int | None = None, param: str | None = None) -> None:
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(LineError(code=code, message=message, line=line, param=param))


def _path(url: str) -> str:
    """`/v1/chat/completions` and `/v3/chat/completions` name the same endpoint."""
    for version in ("/v1/", "/v3/"):
        if url.startswith(version):
            return url[len(version) - 1:]
    return url


def parse_input(data: bytes, endpoint: str, max_requests: int, max_bytes: int) -> ParsedInput:
    parsed = ParsedInput()
    if len(data) > max_bytes:
        parsed.fail("file_too_large", f"The input file has {len(data)} bytes; a batch takes at most {max_bytes}")
        return parsed
    seen: set[str] = set()
    count = 0
    for number, raw in enumerate(data.splitlines(), start=1):
        if not raw.strip():
            continue
        count += 1
        if count > max_requests:
            parsed.fail("too_many_tasks", f"The input file has more than {max_requests} requests, the most a batch "
                        "takes", number)
            return parsed
        line = _check_line(parsed, number, raw, _path(endpoint), seen)
        if line is not None:
            parsed.lines.append(line)
    if count == 0:
        parsed.fail("empty_file", "The input file has no requests")
    return parsed


def _check_line(parsed: ParsedInput, number: int, raw: bytes, endpoint: str, seen: set[str]) -> InputLine | None:
    try:
        item = orjson.loads(raw)
    except orjson.JSONDecodeError:
        parsed.fail("invalid_json_line", "This line is not parseable as valid JSON.", number)
        return None
    if not isinstance(item, dict):
        parsed.fail("invalid_json_line", "This line is not a JSON object.", number)
        return None
    for name in ("custom_id", "method", "url", "body"):
        if name not in item:
            parsed.fail("missing_required_parameter", f"Missing required parameter: '{name}'.", number, name)
            return None
    custom_id, body = item["custom_id"], item["body"]
    if not isinstance(custom_id, str) or not custom_id:
        parsed.fail("invalid_request", "custom_id must be a non-empty string.", number, "custom_id")
        return None
    if item["method"] != "POST":
        parsed.fail("invalid_request", "method must be 'POST'.", number, "method")
        return None
    if not isinstance(item["url"], str) or _path(item["url"]) != endpoint:
        parsed.fail("url_mismatch", f"The url {item['url']!r} does not match the batch's endpoint.", number, "url")
        return None
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        parsed.fail("missing_required_parameter", "body must be a JSON object with a string 'model'.", number,
                    "body.model")
        return None
    if custom_id in seen:
        parsed.fail("duplicate_custom_id", f"The custom_id {custom_id!r} appears on an earlier line.", number,
                    "custom_id")
        return None
    seen.add(custom_id)
    if parsed.model is None:
        parsed.model, parsed.model_line = body["model"], number
    elif body["model"] != parsed.model:
        parsed.fail("model_mismatch", f"The model {body['model']!r} differs from {parsed.model!r} on line "
                    f"{parsed.model_line}: a batch runs one model.", number, "body.model")
        return None
    return InputLine(number, custom_id, raw)
