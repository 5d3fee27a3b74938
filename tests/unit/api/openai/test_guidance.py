from __future__ import annotations

import pytest

from api.openai.guidance import chat_plan, check_schema
from api.openai.protocol import ChatCompletionRequest
from common.errors import OvqError
from common.modelcard import ModelCard
from common.servable import ServableType

MSG = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                     "properties": {"a": {"type": "integer"}}}}}


def card(**options) -> ModelCard:
    return ModelCard(name="m", device="CPU", servable_type=ServableType.LM_CB, created=0, **options)


def plan(options: dict, **body):
    return chat_plan(ChatCompletionRequest(model="m", messages=MSG, **body), card(**options))


@pytest.mark.parametrize(("schema", "message"), [
    ({"type": "foo"}, "is not a valid JSON schema"),
    ({"properties": {"a": {"$ref": "#/$defs/nope"}}}, "does not resolve"),
    ({"type": "string", "pattern": "(?!x)y"}, "lookaround"),
    ({"type": "string", "pattern": r"(a)\1"}, "backreferences"),
    ([1], "must be a JSON schema object"),
])
def test_schemas_the_grammar_compiler_would_refuse_are_400s(schema, message: str) -> None:
    with pytest.raises(OvqError, match=message):
        check_schema(schema, "p")


def test_resolvable_refs_pass() -> None:
    check_schema({"$defs": {"x": {"type": "string"}}, "properties": {"a": {"$ref": "#/$defs/x"}}}, "p")


def test_response_format_becomes_a_schema() -> None:
    assert plan({}, response_format={"type": "json_object"}).structure == {"json_schema": '{"type": "object"}'}
    assert plan({}, response_format={"type": "text"}).structure is None


def test_tool_choice_none_hides_the_tools_and_parses_nothing() -> None:
    result = plan({"tool_parser": "hermes3"}, tools=[TOOL], tool_choice="none")
    assert result.tools is None and result.tool_parser is None and result.structure is None


def test_auto_is_guided_only_when_the_model_enables_it() -> None:
    assert plan({"tool_parser": "hermes3"}, tools=[TOOL]).structure is None
    guided = plan({"tool_parser": "hermes3", "enable_tool_guided_generation": True}, tools=[TOOL]).structure
    assert guided["triggered_tags"]["at_least_one"] is False


def test_forced_calls_are_always_guided_to_the_named_function() -> None:
    named = {"type": "function", "function": {"name": "g"}}
    tools = [TOOL, {"type": "function", "function": {"name": "g"}}]
    result = plan({"tool_parser": "hermes3"}, tools=tools, tool_choice=named, parallel_tool_calls=False)
    calls = result.structure["tags_with_separator"]
    assert calls["at_least_one"] and calls["stop_after_first"]
    assert [t["tag"]["begin"] for t in calls["tags"]] == ['<tool_call>\n{"name": "g", "arguments": ']
    assert result.forced and result.parser().tools.forced
    parallel = plan({"tool_parser": "hermes3"}, tools=tools, tool_choice=named, parallel_tool_calls=True)
    assert parallel.structure["tags_with_separator"]["stop_after_first"]  # a named function: one call
    required = plan({"tool_parser": "hermes3"}, tools=tools, tool_choice="required", parallel_tool_calls=True)
    assert not required.structure["tags_with_separator"]["stop_after_first"]
    assert not plan({"tool_parser": "hermes3"}, tools=tools).parser().tools.forced


def test_forced_call_without_a_tool_parser_is_a_400() -> None:
    with pytest.raises(OvqError, match="needs a model served with a tool_parser"):
        plan({}, tools=[TOOL], tool_choice="required")
    assert plan({}, tools=[TOOL]).tools  # auto: the template still sees them


def test_reasoning_parser_follows_the_rendered_prompt() -> None:
    result = plan({"reasoning_parser": "qwen3"})
    result.opened("<|im_start|>assistant\n<think>\n")
    parser = result.parser()
    assert parser.parse("step one</think>\n\nanswer").reasoning == "step one"


def test_a_constraint_waits_for_the_end_of_reasoning_when_the_prompt_opened_it() -> None:
    result = plan({"reasoning_parser": "qwen3"}, response_format={"type": "json_object"})
    result.opened("<|im_start|>assistant\n<think>\n")
    first, answer = result.structure["concat"]
    assert first == {"tag": {"begin": "", "content": {"any_text": True}, "end": "</think>"}}
    assert answer == {"json_schema": '{"type": "object"}'}


@pytest.mark.parametrize(("ids", "ok"), [([0, 49151], True), ([49152], False), ([-1], False)])
def test_stop_token_ids_are_checked_against_the_vocabulary(ids: list[int], ok: bool) -> None:
    from api.openai.checks import check_for_model

    body = ChatCompletionRequest(model="m", messages=MSG, stop_token_ids=ids)
    if ok:
        check_for_model(body, card(vocab_size=49152))
        return
    with pytest.raises(OvqError) as caught:
        check_for_model(body, card(vocab_size=49152))
    assert caught.value.body.param == "stop_token_ids"


def test_a_parser_without_guided_generation_answers_auto_unguided_and_refuses_forced_calls() -> None:
    options = {"tool_parser": "qwen3coder", "enable_tool_guided_generation": True}
    auto = plan(options, tools=[TOOL])
    assert auto.tool_parser == "qwen3coder" and auto.structure is None
    with pytest.raises(OvqError, match="qwen3coder tool parser does not offer") as caught:
        plan(options, tools=[TOOL], tool_choice="required")
    assert caught.value.body.param == "tool_choice"


def test_harmony_reasoning_keeps_special_tokens_even_without_tools() -> None:
    """gpt-oss's channels are special tokens: the `gptoss` reasoning parser needs them decoded, tools or not."""
    assert plan({"tool_parser": "gptoss", "reasoning_parser": "gptoss"}).keeps_special_tokens()
    assert not plan({"reasoning_parser": "qwen3"}).keeps_special_tokens()
    assert not plan({}).keeps_special_tokens()
