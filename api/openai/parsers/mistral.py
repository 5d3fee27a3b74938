"""Mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (7B v0.3, NeMo) and the newer
`[TOOL_CALLS]name[ARGS]{...}`, repeated once per call."""
from __future__ import annotations

import re
import secrets
import string

from .base import Step
from .calls import call_from_parts
from .jsonscan import NOT_JSON, skip_ws
from .marked import MarkedToolParser

ARGS = "[ARGS]"
_NAME = re.compile(r"[\w.\-]+")


class MistralToolParser(MarkedToolParser):
    """`[TOOL_CALLS]` is a special token for these models; guided generation writes the list form as plain text,
    which reads back the same."""

    name = "mistral"
    marker = "[TOOL_CALLS]"
    trigger = "[TOOL_CALLS]"
    call_prefix = "[TOOL_CALLS]["
    call_suffix = "]"
    separator = ", "
    calls_in_one_list = True

    @staticmethod
    def call_id() -> str:
        # Mistral's chat templates refuse history whose tool-call ids are not 9 letters and digits.
        return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))

    def _call(self, buffer: str, final: bool) -> Step | None:
        start = skip_ws(buffer, len(self.marker))
        if start == len(buffer):
            return self._unsettled(buffer, final)
        if buffer[start] == "[":
            return self._array(buffer, start, final)
        return self._named(buffer, start, final)

    def _named(self, buffer: str, start: int, final: bool) -> Step | None:
        name = _NAME.match(buffer, start)
        if name is None:
            return self._not_a_call()
        if ARGS.startswith(buffer[name.end():]):
            return self._unsettled(buffer, final)  # the name may go on, or [ARGS] is still arriving
        if not buffer.startswith(ARGS, name.end()):
            return self._not_a_call()
        args = skip_ws(buffer, name.end() + len(ARGS))
        end = self._json.end(buffer, args, "{")
        if end is None:
            return self._unsettled(buffer, final)
        call = call_from_parts(name.group(), buffer[args:end]) if end != NOT_JSON else None
        return Step(end, calls=[call]) if call else self._not_a_call()
