"""Token ids in, text out, one step at a time: never a split UTF-8 character, never any text of a stop string.

Two ways, chosen once per worker:
- `ByteTable`: the tokenizer's own vocabulary as bytes (byte-level BPE), checked against GenAI's decoder at
  start. Detokenizing is then a table lookup and an incremental UTF-8 decode: microseconds per step.
- `WindowDetokenizer`: GenAI's decoder over a short window of ids, batched across the jobs of a step, for
  vocabularies the table cannot reproduce. Each decode is an OpenVINO inference (0.1-1 ms, more under load).
"""
from __future__ import annotations

import codecs
from collections.abc import Callable
from typing import Any, Protocol

BatchDecode = Callable[[list[list[int]]], list[str]]
SAMPLE = "Héllo wörld, naïve café — 東京 🎉🎉\n\tdone. ß∑😀x 123,456"


class Stream(Protocol):
    def windows(self, new_ids: list[int]) -> tuple[list[int], list[int]]: ...

    def commit(self, before: str, after: str) -> str: ...


class ByteStream:
    """Table lookups; the incremental UTF-8 decoder holds back a character split across tokens."""

    def __init__(self, table: ByteTable) -> None:
        self.table = table
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._text = ""

    def windows(self, new_ids: list[int]) -> tuple[list[int], list[int]]:
        table, special = self.table.bytes, self.table.special
        self._text = self._utf8.decode(b"".join(table[i] for i in new_ids if i not in special))
        return [], []

    def commit(self, before: str, after: str) -> str:
        return self._text


class ByteTable:
    def __init__(self, table: list[bytes], special: set[int]) -> None:
        self.bytes, self.special = table, special

    @classmethod
    def build(cls, tokenizer: Any) -> ByteTable | None:
        """The vocabulary as bytes, or None where it does not decode exactly as the tokenizer does."""
        try:
            vocab = tokenizer.get_vocab()
        except Exception:
            return None
        if not vocab or not all(isinstance(k, bytes) for k in vocab):
            return None
        table = [b""] * (max(vocab.values()) + 1)
        for token, index in vocab.items():
            table[index] = token
        singles = [[i] for i in range(len(table))]
        skipped = tokenizer.decode(singles, skip_special_tokens=True)
        kept = tokenizer.decode(singles, skip_special_tokens=False)
        special = {i for i in range(len(table)) if skipped[i] == "" and kept[i] != ""}
        built = cls(table, special)
        return built if built._agrees(tokenizer, skipped) else None

    def _agrees(self, tokenizer: Any, skipped: list[str]) -> bool:
        for index, token in enumerate(self.bytes):
            if index in self.special:
                continue
            try:
                text = token.decode("utf-8")
            except UnicodeDecodeError:
                continue  # a piece of a character: checked below, within whole characters
            if skipped[index] != text:
                return False
        ids = tokenizer.encode(SAMPLE, add_special_tokens=False).input_ids.data[0].tolist()
        stream = ByteStream(self)
        streamed = "".join(stream.commit(*stream.windows([i])) for i in ids)
        return streamed == tokenizer.decode(ids, skip_special_tokens=True)


class WindowDetokenizer:
    """Decodes a growing id list through a short window, so each step costs O(window), not O(length)."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self._prefix = 0  # start of the window that gives context to the next tokens
        self._read = 0  # ids before this are already emitted

    def windows(self, new_ids: list[int]) -> tuple[list[int], list[int]]:
        self.ids.extend(new_ids)
        if len(self.ids) == self._read:
            return [], []
        return self.ids[self._prefix : self._read], self.ids[self._prefix :]

    def commit(self, before: str, after: str) -> str:
        # GenAI's decoder drops (or marks) a trailing partial character: wait until it is whole.
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        return after[len(before) :]


class Detokenizer:
    def __init__(self, decode: BatchDecode, table: ByteTable | None) -> None:
        self.decode, self.table = decode, table

    def stream(self) -> Stream:
        return ByteStream(self.table) if self.table else WindowDetokenizer()

    def step(self, work: list[tuple[Stream, list[int]]]) -> list[str]:
        """New text for each (stream, new ids) pair, with at most one decode call for all of them."""
        sequences: list[list[int]] = []
        for stream, ids in work:
            sequences.extend(stream.windows(ids))
        texts = self.decode(sequences) if any(sequences) else [""] * len(sequences)
        return [stream.commit(texts[2 * i], texts[2 * i + 1]) for i, (stream, _) in enumerate(work)]


class StopFilter:
    """Cuts text at the first stop string and holds back any tail that could still become one."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self._held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        if not self.stops:
            return text
        buffer = self._held + text
        cut = min((i for i in (buffer.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self._held = ""
            return buffer[:cut]
        keep = self._partial_tail(buffer)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _partial_tail(self, buffer: str) -> int:
        """Length of the longest suffix of `buffer` that is a proper prefix of a stop string."""
        longest = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:size]):
                    longest = size
                    break
        return longest
