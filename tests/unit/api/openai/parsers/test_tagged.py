"""Reasoning between tags at the start of the answer, for each model family's tags (OVMS's gemma4, lfm2, minicpm5
reasoning parsers): parsed whole, and streamed split everywhere to the same answer."""
from __future__ import annotations

import pytest

from api.openai.parsers import (
    Gemma4ReasoningParser,
    Lfm2ReasoningParser,
    Minicpm5ReasoningParser,
    output_parser,
)
from api.openai.parsers.tagged import TaggedReasoningParser
from tests.unit.api.openai.parsers.test_parsers import check_streaming

FAMILIES = [Gemma4ReasoningParser, Lfm2ReasoningParser, Minicpm5ReasoningParser]


def cases(kind: type[TaggedReasoningParser]) -> list[tuple[bool, str, str | None, str | None]]:
    start, end = kind.open_tag, kind.end_tag
    return [
        (False, f"{start}The user greets me.{end}\n\nHello!", "The user greets me.", "Hello!"),
        (True, f"The user greets me.{end}Hello!", "The user greets me.", "Hello!"),
        (False, "Hello without thinking.", None, "Hello without thinking."),
        (False, f"{start}Cut off by max_tokens", "Cut off by max_tokens", None),
        (False, f"Answer first {start}then this{end}", None, f"Answer first {start}then this{end}"),
        (False, f"  {start}{end}Hi", None, "Hi"),
        (False, start[:3], None, start[:3]),
    ]


@pytest.mark.parametrize("kind", FAMILIES, ids=lambda kind: kind.name)
def test_each_familys_tags_whole_and_streamed(kind: type[TaggedReasoningParser]) -> None:
    for opened, text, reasoning, content in cases(kind):
        assert kind(opened).parse(text) == (reasoning, content), text
        check_streaming(lambda opened=opened: kind(opened), text, (content, reasoning, []))


def test_markers_are_special_tokens_and_prompts_that_open_them() -> None:
    assert all(kind.needs_special_tokens for kind in FAMILIES)
    assert Gemma4ReasoningParser.opens("<|turn>model\n<|channel>thought\n")
    assert not Gemma4ReasoningParser.opens("<|turn>model\n")
    assert Lfm2ReasoningParser.opens("<|im_start|>assistant\n<think>")
    assert not Minicpm5ReasoningParser.opens("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_gemma4_thinking_then_a_tool_call() -> None:
    text = ('<|channel>thought\nThe user wants the weather.<channel|><|tool_call>call:get_weather'
            '{location:<|"|>Paris<|"|>}<tool_call|>')
    parsed = output_parser("gemma4", "gemma4").parse(text)
    assert parsed.reasoning == "The user wants the weather." and parsed.content is None
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("get_weather", '{"location": "Paris"}')]
