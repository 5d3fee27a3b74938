from __future__ import annotations

from pathlib import Path

import pytest

from workers.detokenizer import IncrementalDetokenizer, StopFilter

TEXTS = ["Hello, world!", "naïve café — 東京 🎉🎉 done", "  leading spaces\nand\ttabs  ", "ß∑😀x"]


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path):
    import openvino_genai

    return openvino_genai.Tokenizer(str(model_dir))


@pytest.mark.parametrize("text", TEXTS)
def test_token_by_token_equals_whole_decode(tokenizer, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False).input_ids.data[0].tolist()
    detok = IncrementalDetokenizer(lambda xs: tokenizer.decode(xs, skip_special_tokens=True))
    pieces = [detok.push([i]) for i in ids]
    assert "".join(pieces) == tokenizer.decode(ids)
    assert not any("\ufffd" in p for p in pieces)


def test_several_tokens_at_once(tokenizer) -> None:
    ids = tokenizer.encode(TEXTS[1], add_special_tokens=False).input_ids.data[0].tolist()
    detok = IncrementalDetokenizer(lambda xs: tokenizer.decode(xs))
    out = "".join(detok.push(ids[i : i + 3]) for i in range(0, len(ids), 3))
    assert out == tokenizer.decode(ids)


def _feed_all(stops: list[str], chunks: list[str]) -> tuple[str, bool]:
    flt = StopFilter(stops)
    out = "".join(flt.feed(c) for c in chunks) + flt.flush()
    return out, flt.stopped


@pytest.mark.parametrize("cut", range(1, 24))
def test_stop_string_split_anywhere_never_leaks(cut: int) -> None:
    text = "The answer is: STOP here"
    out, stopped = _feed_all(["STOP"], [text[:cut], text[cut:]])
    assert out == "The answer is: "
    assert stopped


def test_partial_stop_prefix_is_released_when_it_does_not_complete() -> None:
    flt = StopFilter(["STOP"])
    assert flt.feed("abc ST") == "abc "
    assert flt.feed("ART") == "START"
    assert flt.flush() == ""


def test_held_prefix_is_flushed_at_the_end() -> None:
    assert _feed_all(["STOP"], ["end ST"]) == ("end ST", False)


def test_earliest_of_several_stops_wins() -> None:
    assert _feed_all(["world", "lo"], ["hello world"]) == ("hel", True)


def test_no_stops_passes_text_through() -> None:
    assert _feed_all([], ["a", "b"]) == ("ab", False)
