from __future__ import annotations

from pathlib import Path

import pytest

from workers.text.detokenizer import ByteStream, ByteTable, Detokenizer, StopFilter

TEXTS = ["Hello, world!", "naïve café — 東京 🎉🎉 done", "  leading spaces\nand\ttabs  ", "ß∑😀x"]
MODELS = Path(__file__).resolve().parents[3] / "models"


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path):
    import openvino_genai

    return openvino_genai.Tokenizer(str(model_dir))


@pytest.fixture(scope="module", params=["byte-table", "window"])
def detokenizer(request: pytest.FixtureRequest, tokenizer) -> Detokenizer:
    table = ByteTable.build(tokenizer) if request.param == "byte-table" else None
    assert table is not None or request.param == "window"
    return Detokenizer(lambda seqs, skip: tokenizer.decode(seqs, skip_special_tokens=skip), table,
                       {tokenizer.get_eos_token_id()})


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).input_ids.data[0].tolist()


@pytest.mark.parametrize("text", TEXTS)
def test_token_by_token_equals_whole_decode(tokenizer, detokenizer: Detokenizer, text: str) -> None:
    ids = _ids(tokenizer, text)
    stream = detokenizer.stream()
    pieces = [detokenizer.step([(stream, [i])])[0] for i in ids]
    assert "".join(pieces) == tokenizer.decode(ids)
    assert not any("\ufffd" in p for p in pieces)


def test_several_tokens_at_once_and_special_tokens_skipped(tokenizer, detokenizer: Detokenizer) -> None:
    ids = _ids(tokenizer, TEXTS[1]) + [tokenizer.get_eos_token_id()]
    stream = detokenizer.stream()
    out = "".join(detokenizer.step([(stream, ids[i : i + 3])])[0] for i in range(0, len(ids), 3))
    assert out == tokenizer.decode(ids, skip_special_tokens=True) == TEXTS[1]


def test_one_step_serves_many_jobs_with_at_most_one_decode_call(tokenizer) -> None:
    calls = []

    def counting(sequences: list[list[int]], skip: bool) -> list[str]:
        calls.append(len(sequences))
        return tokenizer.decode(sequences, skip_special_tokens=skip)

    detokenizer = Detokenizer(counting, None)
    all_ids = [_ids(tokenizer, t) for t in TEXTS]
    streams = [detokenizer.stream() for _ in TEXTS]
    outs = [""] * len(TEXTS)
    for step in range(max(map(len, all_ids))):
        work = [(s, ids[step : step + 1]) for s, ids in zip(streams, all_ids, strict=True)]
        for i, text in enumerate(detokenizer.step(work)):
            outs[i] += text
    assert outs == TEXTS
    assert len(calls) == max(map(len, all_ids))


def test_kept_special_tokens_are_text_but_the_end_of_sequence_is_not(tokenizer, detokenizer: Detokenizer) -> None:
    start = tokenizer.get_bos_token_id()  # <|im_start|>: special, yet a tool or chat marker some parsers need
    ids = [start] + _ids(tokenizer, "hi") + [tokenizer.get_eos_token_id()]
    kept, skipped = detokenizer.stream(skip_special_tokens=False), detokenizer.stream()
    assert "".join(detokenizer.step([(kept, [i])])[0] for i in ids) == "<|im_start|>hi"
    assert "".join(detokenizer.step([(skipped, [i])])[0] for i in ids) == "hi"


def test_each_token_text_is_attributed_to_the_token_that_made_it(tokenizer, detokenizer: Detokenizer) -> None:
    ids = _ids(tokenizer, TEXTS[1])
    stream = detokenizer.stream()
    text = detokenizer.step([(stream, ids)])[0]
    assert len(stream.pieces) == len(ids) and sum(stream.pieces) == len(text)
    assert [text for text, _ in detokenizer.token_texts(ids[:2])] == [tokenizer.decode([i]) for i in ids[:2]]


def test_byte_table_is_used_only_where_it_agrees_with_the_tokenizer() -> None:
    import openvino_genai

    tiny = openvino_genai.Tokenizer(str(MODELS / "tiny-llama"))
    assert ByteTable.build(tiny) is not None

    class Lying:
        def get_vocab(self) -> dict[bytes, int]:
            return {b"a": 0, b"b": 1}

        def decode(self, seqs: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
            return ["x" for _ in seqs]

    assert ByteTable.build(Lying()) is None


def test_a_character_split_across_tokens_waits_until_it_is_whole() -> None:
    """Whole-character tokens come from the precomputed texts; a split one is held, bad bytes are replaced."""
    table = ByteTable([b"a", "東".encode()[:1], "東".encode()[1:], b"\xff", b"b", b"<s>"], special={5})
    assert table.texts[:2] == ["a", None]
    stream = ByteStream(table)
    assert [stream.text([1]), stream.pieces] == ["", [0]]
    assert [stream.text([2, 0]), stream.pieces] == ["東a", [1, 1]]
    assert [stream.text([3, 5, 4]), stream.pieces] == ["\ufffdb", [1, 0, 1]]
    assert ByteStream(table, skip=False).text([5, 1, 2]) == "<s>東"


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


def test_stop_string_kept_when_asked() -> None:
    flt = StopFilter(["STOP"], keep=True)
    assert flt.feed("abc ST") + flt.feed("OP and more") + flt.flush() == "abc STOP"


def test_no_stops_passes_text_through() -> None:
    assert _feed_all([], ["a", "b"]) == ("ab", False)


@pytest.mark.parametrize("text", TEXTS)
def test_a_replay_holds_what_streaming_held_and_goes_on_exactly(tokenizer, detokenizer: Detokenizer,
                                                                 text: str) -> None:
    """Ids streamed on another worker, replayed at once: the same text as they made one by one (a split character
    still held), and the ids after them go on with no character lost or repeated."""
    ids = _ids(tokenizer, text)
    for cut in range(1, len(ids)):
        streamed = detokenizer.stream()
        before = "".join(detokenizer.step([(streamed, [i])])[0] for i in ids[:cut])
        replayed = detokenizer.stream()
        assert detokenizer.replay([(replayed, ids[:cut])]) == [before], cut
        after = "".join(detokenizer.step([(replayed, [i])])[0] for i in ids[cut:])
        assert before + after == tokenizer.decode(ids), cut
