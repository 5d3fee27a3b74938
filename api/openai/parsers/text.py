"""Text helpers that let streamed output add up to exactly what parsing the whole output gives."""
from __future__ import annotations


class Trimmer:
    """Streams pieces of text so that together they equal the whole text with its surrounding whitespace stripped.

    Leading whitespace is dropped; trailing whitespace is held back until something other than whitespace
    follows it, because until then nobody can tell whether it is trailing.
    """

    def __init__(self) -> None:
        self._started = False
        self._held = ""

    def push(self, text: str) -> str:
        if not self._started:
            text = text.lstrip()
            if not text:
                return ""
            self._started = True
        text = self._held + text
        body = text.rstrip()
        self._held = text[len(body):]
        return body


def partial_marker(text: str, marker: str) -> int:
    """Length of the longest end of `text` that could be the start of `marker` (a shorter piece of it)."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0


def before_marker(text: str, marker: str, final: bool) -> int:
    """How much of the start of `text` is surely plain text: everything before `marker`, and, while more text
    may follow, nothing that could turn out to be the marker's beginning."""
    found = text.find(marker)
    if found >= 0:
        return found
    return len(text) if final else len(text) - partial_marker(text, marker)
