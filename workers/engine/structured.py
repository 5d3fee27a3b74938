"""A job's structured-output tree (`common.structured`) as GenAI's `StructuredOutputConfig`.

JSON schemas become compact-JSON grammars where `compact_grammar` translates them (no whitespace between tokens;
see workers.engine.compact_json), else go to GenAI's JSON schema compiler as they are.
"""
from __future__ import annotations

import json
from typing import Any

from common.errors import OvqError
from workers.engine.compact_json import compact_grammar


def _node(g: Any, node: dict[str, Any]) -> Any:
    s = g.StructuredOutputConfig
    (kind, value), = node.items()
    if kind == "json_schema":
        grammar = compact_grammar(json.loads(value))
        return s.EBNF(grammar) if grammar is not None else s.JSONSchema(value)
    if kind == "regex":
        return s.Regex(value)
    if kind == "ebnf":
        return s.EBNF(value)
    if kind == "const":
        return s.ConstString(value)
    if kind == "any_text":
        return s.AnyText()
    if kind == "tag":
        return s.Tag(value["begin"], _node(g, value["content"]), value["end"])
    if kind in ("triggered_tags", "tags_with_separator"):
        tags = [_node(g, t) for t in value["tags"]]
        flags = {"at_least_one": value["at_least_one"], "stop_after_first": value["stop_after_first"]}
        if kind == "triggered_tags":
            return s.TriggeredTags(value["triggers"], tags, **flags)
        return s.TagsWithSeparator(tags, value["separator"], **flags)
    if kind == "concat":
        return s.Concat([_node(g, n) for n in value])
    if kind == "union":
        return s.Union([_node(g, n) for n in value])
    raise OvqError(f"unknown structured output node {kind!r}")


def structured_config(tree: dict[str, Any]) -> Any:
    import openvino_genai as g

    (kind, value), = tree.items()
    if kind == "json_schema":
        grammar = compact_grammar(json.loads(value))
        if grammar is not None:
            return g.StructuredOutputConfig(grammar=grammar)
        return g.StructuredOutputConfig(json_schema=value)
    if kind == "regex":
        return g.StructuredOutputConfig(regex=value)
    return g.StructuredOutputConfig(structural_tags_config=_node(g, tree))
