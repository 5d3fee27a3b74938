"""A prompt's true length in tokens, where the tokenizer cuts its encodings short.

A tokenizer IR may truncate every encoding to a length fixed when it was converted (GenAI's GGUF converter cuts at
the model's context, 8192 for SmolLM2), and `Tokenizer.encode`'s `max_length`/`truncation` arguments do not lift
that cut (measured with openvino-genai 2026.4.1). Such a prompt is refused anyway, as longer than the context;
counting it piece by piece lets the refusal say how long it really is.
"""
from __future__ import annotations

import re
from typing import Any

# Split before a space that follows a non-space: byte-level BPE pre-tokenizers start a word with its space, so
# the two pieces encode as they do inside the whole text.
_WORD_START = re.compile(r"(?<=\S) ")


def prompt_length(tokenizer: Any, prompt: str | list[int], add_special_tokens: bool, ids: list[int],
                  context: int) -> int:
    """The prompt's length: its ids, or, when they fill the context (perhaps cut there), its counted length."""
    if isinstance(prompt, list) or len(ids) < context:
        return len(ids)
    special = _length(tokenizer, "", add_special_tokens) if add_special_tokens else 0
    return special + _count(tokenizer, prompt, len(ids))


def _length(tokenizer: Any, text: str, add_special_tokens: bool = False) -> int:
    return int(tokenizer.encode(text, add_special_tokens=add_special_tokens).input_ids.get_shape()[1])


def _count(tokenizer: Any, text: str, cap: int) -> int:
    """Tokens in `text`, halving it (at a word start near the middle) while an encoding may have been cut."""
    length = _length(tokenizer, text)
    if length < cap or len(text) < 2:
        return length
    cut = _middle(text)
    return _count(tokenizer, text[:cut], cap) + _count(tokenizer, text[cut:], cap)


def _middle(text: str) -> int:
    middle = len(text) // 2
    before = text.rfind(" ", 0, middle + 1)
    while before > 0 and text[before - 1].isspace():
        before = text.rfind(" ", 0, before)
    after = _WORD_START.search(text, middle)
    candidates = [i for i in (before, after.start() if after else -1) if 0 < i < len(text)]
    return min(candidates, key=lambda i: abs(i - middle)) if candidates else middle
