"""MiniCPM 5: one `<function>` element per call, no wrapper:

    <function name="get_weather"><param name="location">Paris</param><param name="days">3</param></function>

Values are raw text as in onyx (Python-quoted lists and objects are read too, as OVMS does).
"""
from __future__ import annotations

import re

from .tagged import TaggedReasoningParser
from .xmlcalls import XmlToolParser


class Minicpm5ToolParser(XmlToolParser):
    name = "minicpm5"
    marker = '<function name="'
    trigger = '<function name="'
    call_prefix = ""
    call_suffix = "</function>"
    end = "</function>"
    function = re.compile(r'<function name="([^"\n]+)">')
    parameter = re.compile(r'\s*<param name="([^"\n]+)">\n?(.*?)\n?</param>', re.DOTALL)
    close = re.compile(r"\s*</function>")

    def _opening(self, region: str) -> int:
        return 0  # the marker is the start of the function element itself


class Minicpm5ReasoningParser(TaggedReasoningParser):
    """MiniCPM 5's thinking: `<think>...</think>` before the answer, special tokens (OVMS's `minicpm5`)."""

    name = "minicpm5"
    open_tag = "<think>"
    end_tag = "</think>"
    needs_special_tokens = True
