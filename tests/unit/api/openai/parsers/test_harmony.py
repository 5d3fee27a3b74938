"""gpt-oss's Harmony output through the `gptoss` reasoning parser, alone and in front of the `gptoss` tool parser:
whole and streamed at every split must agree, as for every parser."""
from __future__ import annotations

import pytest

from api.openai.parsers import GptOssReasoningParser, output_parser

from .test_parsers import Answer, check_streaming, harmony, harmony_call

WEATHER = '{"location":"Tokyo"}'
THINK = 'User asks: "What is the weather in Tokyo?" The format is to=functions.get_weather, so call it.'
CALL = harmony("analysis", THINK) + "<|start|>assistant" + harmony_call("get_weather", WEATHER)
FINAL = harmony("analysis", "Simple sum.") + "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>"
PREAMBLE = (harmony("analysis", "Two steps.") + "<|start|>assistant" + harmony("commentary", "Checking Tokyo first.")
            + "<|start|>assistant" + harmony_call("get_weather", WEATHER))

CASES = [  # (tool parser, output, (content, reasoning, calls))
    ("gptoss", CALL, (None, THINK, [("get_weather", WEATHER)])),
    ("gptoss", FINAL, ("2 + 2 = 4.", "Simple sum.", [])),
    ("gptoss", PREAMBLE, ("Checking Tokyo first.", "Two steps.", [("get_weather", WEATHER)])),
    ("gptoss", "<|channel|>analysis<|message|>Thinking cut off by max_tok", (None, "Thinking cut off by max_tok", [])),
    ("gptoss", "<|channel|>analysis to=browser.search code<|message|>{\"query\": \"x\"}<|call|>", (None, None, [])),
    # No tools in the request: the call message (unexpected there) stays text; the headers of the rest go.
    (None, FINAL, ("2 + 2 = 4.", "Simple sum.", [])),
    (None, CALL, ("<|start|>assistant" + harmony_call("get_weather", WEATHER), THINK, [])),
]


@pytest.mark.parametrize(("tool_parser", "text", "expected"), CASES)
def test_reasoning_and_calls_whole_and_streamed(tool_parser: str | None, text: str, expected: Answer) -> None:
    prompt = "<|start|>user<|message|>Weather in Tokyo?<|end|><|start|>assistant"
    whole = output_parser(tool_parser, "gptoss", prompt).parse(text)
    assert (whole.content, whole.reasoning, [(call.name, call.arguments) for call in whole.tool_calls]) == expected
    check_streaming(lambda: output_parser(tool_parser, "gptoss", prompt), text, expected)


def test_reasoning_streams_before_the_message_ends() -> None:
    parser = output_parser("gptoss", "gptoss")
    assert parser.feed("<|channel|>analysis<|mess").reasoning == ""
    assert parser.feed("age|>The user").reasoning == "The user"
    assert parser.feed(" asks.<|end|><|start|>assistant<|channel|>final<|message|>Hel").content == "Hel"
    assert parser.feed("lo.").content == "lo."


def test_the_harmony_markers_need_special_tokens_kept() -> None:
    assert GptOssReasoningParser.needs_special_tokens
    assert not GptOssReasoningParser.opens("<|start|>assistant")
