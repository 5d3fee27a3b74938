"""A prompt's true length past the tokenizer's cut, on the real default model's tokenizer (it cuts at 8192)."""
from __future__ import annotations

from pathlib import Path

import pytest

from workers.engine.prompt_length import prompt_length

CONTEXT = 8192
SENTENCE = "The quick brown fox, jumps over the lazy dog!\n\n  Two  spaces.\tTab. café 東京 ☔ <|im_end|>\n"


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path):
    import openvino_genai

    return openvino_genai.Tokenizer(str(model_dir))


def ids(tokenizer, text: str, special: bool = False) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=special).input_ids.data[0].tolist()


def test_the_tokenizer_cuts_long_prompts_and_the_count_does_not(tokenizer) -> None:
    short = SENTENCE * 100
    exact = len(ids(tokenizer, short))
    assert exact < CONTEXT
    long = short * 4  # about four times as many tokens
    cut = ids(tokenizer, long)
    assert len(cut) == CONTEXT  # what encode gives, whatever max_length or truncation say
    counted = prompt_length(tokenizer, long, False, cut, CONTEXT)
    assert abs(counted - 4 * exact) <= 4, (counted, exact)  # pieces split at word starts add up


def test_short_prompts_and_token_ids_are_their_own_length(tokenizer) -> None:
    assert prompt_length(tokenizer, "hello there", False, [1, 2], CONTEXT) == 2
    assert prompt_length(tokenizer, [5] * 9000, False, [5] * 9000, CONTEXT) == 9000


@pytest.mark.parametrize("words", [8500, 12000, 20000])
def test_the_issues_prompts_get_their_real_counts(tokenizer, words: int) -> None:
    text = "hello " * words
    assert len(ids(tokenizer, "hello " * 100)) == 101  # "hello", 99 times " hello", and the last space
    assert prompt_length(tokenizer, text, True, ids(tokenizer, text, True), CONTEXT) == words + 1
