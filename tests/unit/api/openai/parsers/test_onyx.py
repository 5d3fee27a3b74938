"""Onyx's turns (OVMS's `onyx` reasoning parser): turns to `self` are the reasoning, the other turns' bodies the
content, without their framing; parsed whole, and streamed split everywhere to the same answer."""
from __future__ import annotations

import pytest

from api.openai.parsers import OnyxReasoningParser, output_parser
from tests.unit.api.openai.parsers.test_parsers import check_streaming

CALL = ('<atem:function_calls>\n<atem:invoke name="get_weather">\n<atem:parameter name="location">Paris'
        '</atem:parameter>\n</atem:invoke>\n</atem:function_calls>')


@pytest.mark.parametrize(("text", "reasoning", "content"), [
    ("to=self<|message|>The user greets me.<|eom|><|start|>assistant to=user<|message|>Hello!<|eot|>",
     "The user greets me.", "Hello!"),
    (" to=self<|message|>First.<|eom|><|start|>assistant to=self<|message|>Second.<|eom|>"
     "<|start|>assistant to=user<|message|>Done.<|eot|>", "First.\nSecond.", "Done."),
    ("to=user<|message|>No thinking.<|eot|>", None, "No thinking."),
    ("Plain text, no envelope.", None, "Plain text, no envelope."),
    ("to=self<|message|>Cut off by max_tokens", "Cut off by max_tokens", None),
    ("to=self<|message|>a to=b <|eo", "a to=b <|eo", None),
    ("to=", None, "to="),
    ("", None, None),
])
def test_turns_whole_and_streamed(text: str, reasoning: str | None, content: str | None) -> None:
    assert OnyxReasoningParser().parse(text) == (reasoning, content)
    check_streaming(OnyxReasoningParser, text, (content, reasoning, []))


def test_reasoning_then_a_call_turn() -> None:
    text = f"to=self<|message|>I need the weather.<|eom|><|start|>assistant to=functions<|message|>{CALL}<|eom|>"
    parsed = output_parser("onyx", "onyx").parse(text)
    assert parsed.reasoning == "I need the weather." and parsed.content is None
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("get_weather", '{"location": "Paris"}')]
    assert OnyxReasoningParser.needs_special_tokens and not OnyxReasoningParser.opens("<|start|>assistant")
