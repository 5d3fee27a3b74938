"""LFM2 / LFM2.5 (Liquid AI): Python-style calls in a list between special tokens:

    <|tool_call_start|>[get_weather(location="Paris", unit="celsius"), get_time(tz='UTC')]<|tool_call_end|>

Arguments are keyword arguments with Python literal values (strings in either quote, numbers, True/False/None,
lists, dicts); JSON's true/false/null are taken too, as OVMS does.
"""
from __future__ import annotations

import ast
import json
from typing import Any

from .base import Step, ToolCall
from .marked import MarkedToolParser
from .tagged import TaggedReasoningParser

END = "<|tool_call_end|>"
_NAMES = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}


def python_value(node: ast.expr) -> Any:
    """A literal's value; ValueError for anything that is not a literal (a call, a variable, an operation)."""
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, ast.List | ast.Tuple):
        return [python_value(element) for element in node.elts]
    if isinstance(node, ast.Dict):
        if any(key is None for key in node.keys):
            raise ValueError("** in a dict literal")
        return {str(python_value(key)): python_value(value) for key, value in zip(node.keys, node.values, strict=True)}
    return ast.literal_eval(node)


def python_calls(text: str) -> list[ToolCall] | None:
    """The calls a Python list of calls (or one bare call) describes; None unless every element is a call of a
    (dotted) name with keyword arguments whose values are literals."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError):
        return None
    nodes = tree.elts if isinstance(tree, ast.List | ast.Tuple) else [tree]
    calls = []
    for node in nodes:
        if not isinstance(node, ast.Call) or node.args or any(k.arg is None for k in node.keywords):
            return None
        try:
            name = ast.unparse(node.func)
            arguments = json.dumps({k.arg: python_value(k.value) for k in node.keywords}, ensure_ascii=False)
        except (ValueError, TypeError, SyntaxError, RecursionError):  # not a literal, or not JSON (a set, bytes)
            return None
        if not isinstance(node.func, ast.Name | ast.Attribute):
            return None
        calls.append(ToolCall(name, arguments))
    return calls or None


class Lfm2ToolParser(MarkedToolParser):
    """A region is read once `<|tool_call_end|>` has arrived, or at the end of the output (the model may stop
    right after the list). Guided generation is not offered: the calls are Python, not JSON."""

    name = "lfm2"
    marker = "<|tool_call_start|>"
    trigger = "<|tool_call_start|>"
    call_prefix = "<|tool_call_start|>["
    call_suffix = "]<|tool_call_end|>"
    guidable = False

    def _call(self, buffer: str, final: bool) -> Step | None:
        return self._closed(buffer, final, END, python_calls)


class Lfm2ReasoningParser(TaggedReasoningParser):
    """LFM2.5's thinking: `<think>...</think>` before the answer, both special tokens (OVMS's `lfm2`)."""

    name = "lfm2"
    open_tag = "<think>"
    end_tag = "</think>"
    needs_special_tokens = True
