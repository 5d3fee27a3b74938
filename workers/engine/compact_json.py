"""JSON schemas as EBNF grammars for compact JSON: no whitespace outside strings.

GenAI compiles a JSON schema with xgrammar's defaults, whose grammar allows any run of spaces, tabs and newlines
between tokens, and exposes no setting for it (openvino-genai 2026.4.1: `StructuredOutputConfig.JSONSchema` takes
the schema only; xgrammar's `any_whitespace` and `max_whitespace_cnt` are not reachable). Small models spend their
tokens on that whitespace (`{\\n\\n"name"\\n\\n:\\n\\n...`), so schemas are written here as EBNF for GenAI's `grammar`
instead. Only the common vocabulary is translated (types, properties and required, enum, const, anyOf/oneOf, items,
string and array lengths, local $refs, recursion included), with xgrammar's meaning: properties in schema order,
none beyond those listed. `compact_grammar` returns None for any other keyword, and the schema then goes to xgrammar
as it is. One difference: numbers have at most 16 digits before and after the point and 3 in the exponent (more
than a double holds), because a small model otherwise loops on digits (`1.5555…`) until the token limit.
"""
from __future__ import annotations

import json
from typing import Any

# Keywords that say nothing about the text: allowed anywhere, ignored.
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
                         "readOnly", "writeOnly", "$defs", "definitions"})
SCALARS = {"null": '"null"', "boolean": '("true" | "false")', "integer": "json_integer", "number": "json_number",
           "string": "json_string"}
BASE_RULES = r'''json_value ::= json_object | json_array | json_string | json_number | "true" | "false" | "null"
json_object ::= "{" (json_string ":" json_value ("," json_string ":" json_value)*)? "}"
json_array ::= "[" (json_value ("," json_value)*)? "]"
json_string ::= "\"" json_char* "\""
json_char ::= [^"\\\x00-\x1f] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
json_integer ::= "-"? ("0" | [1-9] [0-9]{0,15})
json_number ::= json_integer ("." [0-9]{1,16})? ([eE] [+-]? [0-9]{1,3})?
'''


class Unsupported(Exception):
    """A keyword this translation does not cover: xgrammar gets the schema instead."""


def compact_grammar(schema: Any) -> str | None:
    """The EBNF grammar of `schema`'s instances written without whitespace, or None where not translated."""
    try:
        return _Grammar(schema).build()
    except Unsupported:
        return None


def literal(value: Any) -> str:
    """A JSON value's compact text as an EBNF string literal."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class _Grammar:
    def __init__(self, root: Any) -> None:
        self.root = root
        self.rules: dict[str, str] = {}
        self.refs: dict[str, str] = {}

    def build(self) -> str:
        root = self.value(self.root)
        lines = [f"root ::= {root}"] + [f"{name} ::= {body}" for name, body in self.rules.items()]
        return "\n".join(lines) + "\n" + BASE_RULES

    def rule(self, body: str) -> str:
        name = f"r{len(self.rules)}"
        self.rules[name] = body
        return name

    def value(self, schema: Any) -> str:
        """An EBNF expression for the instances of `schema`."""
        if schema is True or schema == {}:
            return "json_value"
        if not isinstance(schema, dict):
            raise Unsupported(schema)
        keys = set(schema) - ANNOTATIONS
        if "$ref" in keys:
            return self._ref(schema["$ref"], keys)
        if "const" in keys:
            return self._only(keys, {"const", "type"}, literal(schema["const"]))
        if "enum" in keys:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise Unsupported(schema)
            return self._only(keys, {"enum", "type"}, "(" + " | ".join(literal(v) for v in values) + ")")
        for key in ("anyOf", "oneOf"):
            if key in keys:
                options = schema[key]
                if not isinstance(options, list) or not options:
                    raise Unsupported(schema)
                return self._only(keys, {key}, "(" + " | ".join(self.value(o) for o in options) + ")")
        kind = schema.get("type")
        if isinstance(kind, list) and kind:
            return "(" + " | ".join(self.value({**schema, "type": k}) for k in kind) + ")"
        if kind in ("null", "boolean"):
            return self._only(keys, {"type"}, SCALARS[kind])
        if kind in ("integer", "number"):
            return self._only(keys, {"type"}, SCALARS[kind])
        if kind == "string":
            return self._string(schema, keys)
        if kind == "array":
            return self._array(schema, keys)
        if kind == "object":
            return self._object(schema, keys)
        raise Unsupported(schema)

    @staticmethod
    def _only(keys: set[str], allowed: set[str], expression: str) -> str:
        if keys - allowed:
            raise Unsupported(keys - allowed)
        return expression

    def _ref(self, ref: Any, keys: set[str]) -> str:
        if keys != {"$ref"} or not isinstance(ref, str):
            raise Unsupported(keys)
        if ref not in self.refs:
            target = self._resolve(ref)
            name = self.refs[ref] = self.rule("")  # named before it is built: the schema may refer to itself
            self.rules[name] = self.value(target)
        return self.refs[ref]

    def _resolve(self, ref: str) -> Any:
        if ref == "#":
            return self.root
        if not ref.startswith("#/"):
            raise Unsupported(ref)
        target: Any = self.root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise Unsupported(ref)
            target = target[part]
        return target

    def _string(self, schema: dict[str, Any], keys: set[str]) -> str:
        self._only(keys, {"type", "minLength", "maxLength"}, "")
        low, high = schema.get("minLength", 0), schema.get("maxLength")
        if low == 0 and high is None:
            return "json_string"
        return '("\\"" json_char' + _repeat(low, high) + ' "\\"")'

    def _array(self, schema: dict[str, Any], keys: set[str]) -> str:
        self._only(keys, {"type", "items", "minItems", "maxItems"}, "")
        item = self.value(schema.get("items", True))
        low, high = schema.get("minItems", 0), schema.get("maxItems")
        if high == 0:
            return '"[]"'
        if high is not None and low > high:
            raise Unsupported(schema)
        rest = "(\",\" " + item + ")" + _repeat(max(low - 1, 0), None if high is None else high - 1)
        items = f"{item} {rest}"
        return f'("[" {items} "]")' if low > 0 else f'("[" ({items})? "]")'

    def _object(self, schema: dict[str, Any], keys: set[str]) -> str:
        self._only(keys, {"type", "properties", "required", "additionalProperties"}, "")
        properties = schema.get("properties") or {}
        required = schema.get("required") or []
        extra = schema.get("additionalProperties", not properties)
        if not isinstance(properties, dict) or not isinstance(required, list):
            raise Unsupported(schema)
        if not properties:
            if extra is False:
                return '"{}"'
            if extra is True and not required:
                return "json_object"
            raise Unsupported(schema)
        if extra is not False or set(required) - set(properties):
            raise Unsupported(schema)  # extra properties beside listed ones, or required ones never listed
        members = [(f"{literal(name)[:-1]}:\" {self.value(sub)}", name in required)
                   for name, sub in properties.items()]
        return f'("{{" {self._members(members)} "}}")'

    def _members(self, members: list[tuple[str, bool]]) -> str:
        """The members in order, each optional unless required, with a comma between two that are written."""
        rest = ['""']  # rest[i]: members i.. after something was written (each behind a comma)
        for member, needed in reversed(members[1:]):
            written = f'"," {member} {rest[-1]}' if needed else f'("," {member})? {rest[-1]}'
            rest.append(self.rule(written))
        rest = [""] + rest[::-1]  # the first member never follows another

        def first(i: int) -> str:  # members i.. with nothing written yet
            if i == len(members):
                return '""'
            member, needed = members[i]
            written = f"{member} {rest[i + 1]}"
            return written if needed else self.rule(f"{written} | {first(i + 1)}")

        return first(0)


def _repeat(low: int, high: int | None) -> str:
    if not isinstance(low, int) or low < 0 or (high is not None and (not isinstance(high, int) or high < low)):
        raise Unsupported((low, high))
    if high is None:
        return f"{{{low},}}" if low else "*"
    return f"{{{low},{high}}}"
