"""Structured output as it travels in a job: a JSON tree the engine turns into GenAI's StructuredOutputConfig.

A node is one of:
  {"json_schema": str}  {"regex": str}  {"ebnf": str}  {"const": str}  {"any_text": true}
  {"tag": {"begin": str, "content": node, "end": str}}
  {"triggered_tags": {"triggers": [str], "tags": [tag node], "at_least_one": bool, "stop_after_first": bool}}
  {"tags_with_separator": {"tags": [tag node], "separator": str, "at_least_one": bool, "stop_after_first": bool}}
  {"concat": [node]}  {"union": [node]}
A job's top-level `json_schema` or `regex` node uses GenAI's own field for it; anything else is a structural tag.
"""
from __future__ import annotations

import json
from typing import Any

Node = dict[str, Any]


def json_schema(schema: dict[str, Any] | str) -> Node:
    return {"json_schema": schema if isinstance(schema, str) else json.dumps(schema)}


def regex(pattern: str) -> Node:
    return {"regex": pattern}


def const(text: str) -> Node:
    return {"const": text}


def any_text() -> Node:
    return {"any_text": True}


def tag(begin: str, content: Node, end: str) -> Node:
    return {"tag": {"begin": begin, "content": content, "end": end}}


def triggered_tags(triggers: list[str], tags: list[Node], at_least_one: bool = False,
                   stop_after_first: bool = False) -> Node:
    return {"triggered_tags": {"triggers": triggers, "tags": tags, "at_least_one": at_least_one,
                               "stop_after_first": stop_after_first}}


def tags_with_separator(tags: list[Node], separator: str, at_least_one: bool = False,
                        stop_after_first: bool = False) -> Node:
    return {"tags_with_separator": {"tags": tags, "separator": separator, "at_least_one": at_least_one,
                                    "stop_after_first": stop_after_first}}


def concat(*nodes: Node) -> Node:
    return {"concat": list(nodes)}


def union(*nodes: Node) -> Node:
    return {"union": list(nodes)}
