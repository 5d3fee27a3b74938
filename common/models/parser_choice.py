"""The tool parser a chat template implies, for models whose models file (or graph) names none: as OVMS 2026.3
picks one, from the call format the template teaches the model."""
from __future__ import annotations

# (tool parser, strings the template must all contain), the most specific format first.
_SIGNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gptoss", ("<|channel|>", "<|message|>")),
    ("onyx", ("<atem:function_calls>",)),
    ("lfm2", ("<|tool_call_start|>",)),
    ("lfm2", ("<|tool_list_start|>",)),
    ("gemma4", ("<|tool_call>",)),
    ("minicpm5", ("<function name=", "<param name=")),
    ("qwen3coder", ("<function=", "<parameter=")),
    ("devstral", ("[TOOL_CALLS]", "[ARGS]")),
    ("mistral", ("[TOOL_CALLS]",)),
    ("hermes3", ("<tool_call>",)),
    ("phi4", ("functools",)),
    ("llama3", ("<|python_tag|>",)),
    ("llama3", ("ipython", '"parameters"')),
)


def tool_parser_for(template: str) -> str | None:
    """The tool parser for the call format this chat template writes, or None when it shows none."""
    return next((parser for parser, signs in _SIGNS if all(sign in template for sign in signs)), None)


def reasoning_parser_for(template: str) -> str | None:
    """The reasoning parser a chat template implies: only Harmony's (gpt-oss), whose every answer is channels
    that read as noise without it; `<think>` models are left to the models file, as before."""
    return "gptoss" if tool_parser_for(template) == "gptoss" else None
