"""Qwen3 reasoning: `<think>\n...\n</think>\n\nanswer`, or, when the prompt already opened the block, reasoning
from the first character up to `</think>`."""
from __future__ import annotations

from .tagged import TaggedReasoningParser

OPEN = "<think>"
CLOSE = "</think>"


class Qwen3ReasoningParser(TaggedReasoningParser):
    name = "qwen3"
    open_tag = OPEN
    end_tag = CLOSE
