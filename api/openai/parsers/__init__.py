"""Turning generated text into OpenAI chat fields (content, reasoning_content, tool_calls), whole or streamed.

Parser names are OpenVINO Model Server's `tool_parser` and `reasoning_parser` options.
"""
from __future__ import annotations

from .base import (
    Function,
    Parsed,
    ParsedDelta,
    ReasoningParser,
    ToolCall,
    ToolCallDelta,
    ToolParser,
)
from .devstral import DevstralToolParser
from .gemma4 import Gemma4ReasoningParser, Gemma4ToolParser
from .harmony import GptOssReasoningParser, GptOssToolParser
from .hermes3 import Hermes3ToolParser
from .lfm2 import Lfm2ReasoningParser, Lfm2ToolParser
from .llama3 import Llama3ToolParser
from .minicpm5 import Minicpm5ReasoningParser, Minicpm5ToolParser
from .mistral import MistralToolParser
from .onyx import OnyxReasoningParser, OnyxToolParser
from .output import OutputParser
from .phi4 import Phi4ToolParser
from .qwen3 import Qwen3ReasoningParser
from .qwen3coder import Qwen3CoderToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    parser.name: parser for parser in (Hermes3ToolParser, Llama3ToolParser, Phi4ToolParser, MistralToolParser,
                                       Qwen3CoderToolParser, DevstralToolParser, GptOssToolParser, Lfm2ToolParser,
                                       Gemma4ToolParser, OnyxToolParser, Minicpm5ToolParser)
}
REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    parser.name: parser for parser in (Qwen3ReasoningParser, GptOssReasoningParser, Gemma4ReasoningParser,
                                       Lfm2ReasoningParser, OnyxReasoningParser, Minicpm5ReasoningParser)
}


def output_parser(tool_parser: str | None, reasoning_parser: str | None, prompt: str = "",
                  forced: bool = False) -> OutputParser:
    """A fresh pipeline for one answer of a model with these options; `prompt` is the rendered prompt, which
    tells whether the output starts inside an already opened reasoning block; `forced`: the answer was guided to
    be tool calls only (tool_choice `required` or a named function)."""
    reasoning = None
    if reasoning_parser is not None:
        kind = REASONING_PARSERS[reasoning_parser]
        reasoning = kind(prompt_opened=kind.opens(prompt))
    return OutputParser(reasoning, TOOL_PARSERS[tool_parser](forced) if tool_parser is not None else None)

__all__ = [
    "REASONING_PARSERS",
    "DevstralToolParser",
    "Gemma4ReasoningParser",
    "Gemma4ToolParser",
    "GptOssReasoningParser",
    "GptOssToolParser",
    "Lfm2ReasoningParser",
    "Lfm2ToolParser",
    "Minicpm5ReasoningParser",
    "Minicpm5ToolParser",
    "OnyxReasoningParser",
    "OnyxToolParser",
    "Qwen3CoderToolParser",
    "TOOL_PARSERS",
    "Function",
    "Hermes3ToolParser",
    "Llama3ToolParser",
    "MistralToolParser",
    "OutputParser",
    "Parsed",
    "ParsedDelta",
    "Phi4ToolParser",
    "Qwen3ReasoningParser",
    "ReasoningParser",
    "ToolCall",
    "ToolCallDelta",
    "ToolParser",
    "output_parser",
]
