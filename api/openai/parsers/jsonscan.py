"""Locating JSON values inside model output that may still be growing, and reading them back verbatim.

Finding where a value ends only needs string/escape state and bracket depth, so an unfinished value is told
apart from a finished one without parsing; the finished text is then parsed for real.
"""
from __future__ import annotations

import json
import re
from typing import Any

NOT_JSON = -1  # JsonScanner.end: the text at that position does not open the expected value

_WS = re.compile(r"\s*")
_OUTSIDE = re.compile(r'["{}\[\]]')
_INSIDE = re.compile(r'["\\]')
_DECODER = json.JSONDecoder()


def skip_ws(text: str, pos: int) -> int:
    return _WS.match(text, pos).end()


class JsonScanner:
    """Finds where a JSON object or array ends in a buffer that keeps growing while the value arrives.

    It remembers how far it got, so a long value streamed in small chunks is scanned once rather than once per
    chunk. What it remembers depends only on the text scanned, so it is reused exactly when the buffer still
    holds that text at the value's start.
    """

    def __init__(self) -> None:
        self._seen = ""  # text scanned so far, from the opening bracket
        self._depth = 0
        self._in_string = False

    def end(self, text: str, start: int, opener: str) -> int | None:
        """Index just past the object or array that `opener` opens at text[start].

        NOT_JSON when something else is there; None when the text ends before that is known or before the value
        closes. Brackets are only counted, not matched: a balanced but broken value is caught when it is parsed.
        """
        if start >= len(text):
            return None
        if text[start] != opener:
            return NOT_JSON
        if not (self._seen and text.startswith(self._seen, start)):
            self._seen, self._depth, self._in_string = "", 0, False
        end = self._scan(text, start, start + len(self._seen))
        if end is None:
            return None
        self._seen, self._depth, self._in_string = "", 0, False
        return end

    def _scan(self, text: str, start: int, pos: int) -> int | None:
        while True:
            if self._in_string:
                pos = self._string(text, pos)
                if self._in_string:
                    break
                continue
            found = _OUTSIDE.search(text, pos)
            if found is None:
                pos = len(text)
                break
            pos = found.end()
            char = found.group()
            if char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            else:
                self._depth -= 1
                if self._depth == 0:
                    return pos
        self._seen = text[start:pos]
        return None

    def _string(self, text: str, pos: int) -> int:
        """Where scanning inside a string stops: past its closing quote, or where the text runs out."""
        while (found := _INSIDE.search(text, pos)) is not None:
            if found.group() == '"':
                self._in_string = False
                return found.end()
            if found.end() == len(text):
                return found.start()  # a final backslash: rescan it once the character it escapes is here
            pos = found.end() + 1
        return len(text)


def members(text: str) -> dict[str, tuple[Any, str]] | None:
    """The members of the JSON object that is exactly `text`, each as (value, the value's text as written).

    None unless `text` is one valid JSON object. The written text matters because tool-call arguments are
    passed on exactly as the model wrote them.
    """
    value = load(text)
    if not isinstance(value, dict):
        return None
    found: dict[str, tuple[Any, str]] = {}
    pos = skip_ws(text, 1)
    while text[pos] != "}":
        key, pos = _DECODER.raw_decode(text, pos)
        pos = skip_ws(text, skip_ws(text, pos) + 1)  # past the colon
        found[key], pos = _written(text, pos)
        pos = _after_comma(text, pos)
    return found


def elements(text: str) -> list[tuple[Any, str]] | None:
    """The elements of the JSON array that is exactly `text`, each as (value, its text); None if it is not one."""
    value = load(text)
    if not isinstance(value, list):
        return None
    found: list[tuple[Any, str]] = []
    pos = skip_ws(text, 1)
    while text[pos] != "]":
        item, pos = _written(text, pos)
        found.append(item)
        pos = _after_comma(text, pos)
    return found


def load(text: str) -> Any:
    """The JSON value `text` holds, or None when it holds none (a model's broken JSON is an answer, not an error)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _written(text: str, pos: int) -> tuple[tuple[Any, str], int]:
    value, end = _DECODER.raw_decode(text, pos)
    return (value, text[pos:end]), skip_ws(text, end)


def _after_comma(text: str, pos: int) -> int:
    return skip_ws(text, pos + 1) if text[pos] == "," else pos
