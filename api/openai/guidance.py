"""What constrains an answer: the client's response_format, or the tools' call format (guided generation).

Checked here, before anything is queued: a JSON schema GenAI's grammar compiler would refuse breaks the engine
step it lands in, so schemas are validated against their JSON Schema meta-schema first.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from jsonschema import SchemaError
from jsonschema.validators import validator_for

from api.openai.parsers import REASONING_PARSERS, TOOL_PARSERS, Function, OutputParser, output_parser
from api.openai.protocol import ChatCompletionRequest, NamedToolChoice, ResponseFormat
from common import structured
from common.errors import OvqError
from common.modelcard import ModelCard

EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


# Regex features xgrammar's compiler refuses (lookaround, backreferences): measured to break the engine step.
UNSUPPORTED_REGEX = re.compile(r"\(\?<?[=!]|\\[1-9]")


def check_schema(schema: Any, param: str) -> None:
    """A 400 for what the meta-schema refuses, `$ref`s that lead nowhere and patterns xgrammar cannot compile."""
    if not isinstance(schema, dict):
        raise OvqError(f"{param} must be a JSON schema object", param=param)
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        raise OvqError(f"{param} is not a valid JSON schema: {exc.message}" + (f" (at {where})" if where else ""),
                       param=param) from None
    for node in _nodes(schema):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#") and not _resolves(schema, ref):
            raise OvqError(f"{param}: $ref '{ref}' does not resolve within the schema", param=param)
        patterns = [node.get("pattern")] + list(node.get("patternProperties") or {})
        for pattern in patterns:
            if isinstance(pattern, str) and UNSUPPORTED_REGEX.search(pattern):
                raise OvqError(f"{param}: pattern {pattern!r} uses lookaround or backreferences, which "
                               "structured generation does not support", param=param)


def _nodes(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, dict):
        yield value
        for item in value.values():
            yield from _nodes(item)
    elif isinstance(value, list):
        for item in value:
            yield from _nodes(item)


def _resolves(schema: dict[str, Any], ref: str) -> bool:
    target: Any = schema
    for part in (p for p in ref[1:].split("/") if p):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and part in target:
            target = target[part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            return False
    return True


def response_structure(response_format: ResponseFormat | None) -> structured.Node | None:
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return structured.json_schema({"type": "object"})
    schema = response_format.json_schema.json_schema if response_format.json_schema else None
    check_schema(schema, "response_format.json_schema.schema")
    return structured.json_schema(schema)


@dataclass
class ChatPlan:
    """How one chat request is rendered, constrained and parsed."""

    tools: list[dict[str, Any]] | None = None  # what the chat template sees
    tool_parser: str | None = None
    forced: bool = False  # tool_choice `required` or a named function: the answer is calls only
    structure: structured.Node | None = None
    reasoning_parser: str | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    prompt: str = ""

    def parser(self) -> OutputParser | None:
        """A fresh parser for one choice, or None when the text goes out as it is."""
        if self.tool_parser is None and self.reasoning_parser is None:
            return None
        return output_parser(self.tool_parser, self.reasoning_parser, self.prompt, self.forced)

    def keeps_special_tokens(self) -> bool:
        """Whether the reasoning parser reads special tokens (Harmony's), so the text must be decoded with them."""
        return self.reasoning_parser is not None and REASONING_PARSERS[self.reasoning_parser].needs_special_tokens

    def opened(self, prompt: str) -> None:
        """Note whether the template left the prompt inside a reasoning block (thinking on, `<think>` written).

        If so, a constraint applies to the answer only: reasoning stays free text up to its end tag.
        """
        self.prompt = prompt
        if not self.reasoning_parser:
            return
        kind = REASONING_PARSERS[self.reasoning_parser]
        if kind.opens(prompt) and self.structure is not None:
            self.structure = structured.concat(structured.tag("", structured.any_text(), kind.end_tag),
                                               self.structure)


def chat_plan(body: ChatCompletionRequest, card: ModelCard) -> ChatPlan:
    plan = ChatPlan(reasoning_parser=card.reasoning_parser, template_kwargs=dict(body.chat_template_kwargs or {}))
    structure = response_structure(body.response_format)
    # tool_choice "none": the template gets no tools, so nothing invites a call, and nothing is parsed as one.
    if not body.tools or body.tool_choice == "none":
        plan.structure = structure
        return plan
    for i, tool in enumerate(body.tools):
        if tool.function.parameters is not None:
            check_schema(tool.function.parameters, f"tools[{i}].function.parameters")
    plan.tools = [tool.model_dump(exclude_none=True) for tool in body.tools]
    forced = body.tool_choice == "required" or isinstance(body.tool_choice, NamedToolChoice)
    if card.tool_parser is None:
        if forced:
            raise OvqError(f"tool_choice {_choice_name(body)} needs a model served with a tool_parser, and "
                           f"`{card.name}` has none", param="tool_choice")
        plan.structure = structure
        return plan
    plan.tool_parser = card.tool_parser
    plan.forced = forced
    if not TOOL_PARSERS[card.tool_parser].guidable:
        if forced:
            raise OvqError(f"tool_choice {_choice_name(body)} needs guided generation, which the "
                           f"{card.tool_parser} tool parser does not offer: use tool_choice 'auto'",
                           param="tool_choice")
        plan.structure = structure
        return plan
    # A forced call is always guided (nothing else can guarantee it); `auto` when the model asks for it.
    if forced or (card.enable_tool_guided_generation and structure is None):
        plan.structure = _tool_structure(body, card.tool_parser, forced)
    else:
        plan.structure = structure
    return plan


def _choice_name(body: ChatCompletionRequest) -> str:
    choice = body.tool_choice
    return f"'{choice.function.name}'" if isinstance(choice, NamedToolChoice) else f"'{choice}'"


def _tool_structure(body: ChatCompletionRequest, parser: str, forced: bool) -> structured.Node:
    tools = body.tools or []
    if isinstance(body.tool_choice, NamedToolChoice):
        tools = [t for t in tools if t.function.name == body.tool_choice.function.name]
    functions = [Function(t.function.name, t.function.parameters or EMPTY_PARAMETERS) for t in tools]
    # A named function is one call (as vLLM does): left to repeat calls, a small greedy model writes the same
    # call again and again until the token limit. `required` allows several when parallel_tool_calls says so.
    parallel = body.parallel_tool_calls and not isinstance(body.tool_choice, NamedToolChoice)
    return TOOL_PARSERS[parser]().guided(functions, required=forced, parallel=parallel)
