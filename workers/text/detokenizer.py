"""Token ids in, text out, one step at a time: never a split UTF-8 character, never any text of a stop string.

Two ways, chosen once per worker:
- `ByteTable`: the tokenizer's own vocabulary as bytes (byte-level BPE), checked against GenAI's decoder at
  start. Detokenizing is then a table lookup and an incremental UTF-8 decode: microseconds per step.
- `WindowDetokenizer`: GenAI's decoder over a short window of ids, batched across the jobs of a step, for
  vocabularies the table cannot reproduce. Each decode is an OpenVINO inference (0.1-1 ms, more under load).
"""
from __future__ import annotations

from codecs import utf_8_decode
from collections.abc import Callable
from typing import Any, Protocol

BatchDecode = Callable[[list[list[int]], bool], list[str]]  # (sequences, skip_special_tokens) -> texts
SAMPLE = "Héllo wörld, naïve café — 東京 🎉🎉\n\tdone. ß∑😀x 123,456"


class Stream(Protocol):
    skip: bool
    # Characters of the last commit's text that each of its ids made (a token's log-probability goes with them).
    pieces: list[int]

    def windows(self, new_ids: list[int]) -> tuple[list[int], list[int]]: ...

    def commit(self, before: str, after: str) -> str: ...


class ByteStream:
    """Table lookups: a token that is whole characters on its own is its precomputed text; bytes of a character
    split across tokens are held until it is whole (the incremental UTF-8 decode, one C call)."""

    def __init__(self, table: ByteTable, skip: bool = True) -> None:
        self.table, self.skip = table, skip
        self._held = b""  # the start of a character whose other bytes are in the next token
        self._text = ""
        self.pieces: list[int] = []

    def text(self, ids: list[int]) -> str:
        """The new text of `ids`; `pieces` says which of its characters each id made."""
        if len(ids) == 1:  # the usual step: one token
            text = self._piece(ids[0])
            self.pieces = [len(text)]
            return text
        texts = [self._piece(i) for i in ids]
        self.pieces = [len(t) for t in texts]
        return "".join(texts)

    def _piece(self, i: int) -> str:
        table = self.table
        if self.skip and i in table.special:
            return ""
        if not self._held:
            whole = table.texts[i]
            if whole is not None:
                return whole
        data = self._held + table.bytes[i]
        text, used = utf_8_decode(data, "replace", False)
        self._held = data[used:]
        return text

    def windows(self, new_ids: list[int]) -> tuple[list[int], list[int]]:
        self._text = self.text(new_ids)
        return [], []

    def commit(self, before: str, after: str) -> str:
        return self._text


class ByteTable:
    def __init__(self, table: list[bytes], special: set[int]) -> None:
        self.bytes, self.special = table, special
        self.texts = [_whole(token) for token in table]  # None: not whole characters on its own

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


def _whole(token: bytes) -> str | None:
    try:
        return token.decode("utf-8")
    except UnicodeDecodeError:
        return None


class WindowDetokenizer:
    """Decodes a growing id list through a short window, so each step costs O(window), not O(length)."""

    def __init__(self, skip: bool = True) -> None:
        self.skip = skip
        self.ids: list[int] = []
        self._prefix = 0  # start of the window that gives context to the next tokens
        self._read = 0  # ids before this are already emitted
        self._new = 0
        self.pieces: list[int] = []

    def windows(self, new_ids: list[int]) -> tuple[list[int], list[int]]:
        self.ids.extend(new_ids)
        self._new = len(new_ids)
        if len(self.ids) == self._read:
            return [], []
        return self.ids[self._prefix : self._read], self.ids[self._prefix :]

    def commit(self, before: str, after: str) -> str:
        # GenAI's decoder drops (or marks) a trailing partial character: wait until it is whole.
        self.pieces = [0] * self._new
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        text = after[len(before) :]
        if self.pieces:  # which token made which character is unknown here: the last one gets them all
            self.pieces[-1] = len(text)
        return text


class Detokenizer:
    def __init__(self, decode: BatchDecode, table: ByteTable | None, hidden: set[int] | None = None) -> None:
        self.decode, self.table = decode, table
        # End-of-sequence ids: never text, even for jobs that keep special tokens (the answer ends there).
        self.hidden = hidden or set()

    def stream(self, skip_special_tokens: bool = True) -> Stream:
        return ByteStream(self.table, skip_special_tokens) if self.table else WindowDetokenizer(skip_special_tokens)

    def step(self, work: list[tuple[Stream, list[int]]]) -> list[str]:
        """New text for each (stream, new ids) pair, with at most one decode call per special-token mode."""
        if self.table is not None:  # byte-table streams: no decode call at all
            return [stream.text(self._shown(stream, ids)) for stream, ids in work]  # type: ignore[attr-defined]
        windows: list[tuple[list[int], list[int]]] = []
        for stream, ids in work:
            windows.append(stream.windows(self._shown(stream, ids)))
        texts: dict[int, tuple[str, str]] = {}
        for skip in (True, False):
            group = [i for i, (stream, _) in enumerate(work) if stream.skip is skip and windows[i][1]]
            if group:
                decoded = self._decode([seq for i in group for seq in windows[i]], skip)
                texts.update((i, (decoded[2 * k], decoded[2 * k + 1])) for k, i in enumerate(group))
        return [stream.commit(*texts.get(i, ("", ""))) for i, (stream, _) in enumerate(work)]

    def replay(self, work: list[tuple[Stream, list[int]]]) -> list[str]:
        """`step()` for ids streamed before, on another worker, all at once: a window stream commits them only up
        to their last whole character (what streaming had committed), the rest waits for the next ids as it did."""
        if self.table is not None:
            return self.step(work)
        texts = []
        for stream, ids in work:
            shown = self._shown(stream, ids)
            cut = len(shown)
            # A split character is at most four byte tokens; a few more for decoders that mark them differently.
            while cut > 0 and len(shown) - cut < 8 and self._decode([shown[:cut]], stream.skip)[0].endswith("\ufffd"):
                cut -= 1
            text = self.step([(stream, shown[:cut])])[0] if cut else ""
            texts.append(text + (self.step([(stream, shown[cut:])])[0] if cut < len(shown) else ""))
        return texts

    def _shown(self, stream: Stream, ids: list[int]) -> list[int]:
        """End-of-sequence ids are dropped even where special tokens are kept."""
        if not stream.skip and self.hidden and not self.hidden.isdisjoint(ids):
            return [i for i in ids if i not in self.hidden]
        return ids

    def _decode(self, sequences: list[list[int]], skip: bool) -> list[str]:
        if skip:
            return self.decode(sequences, True)
        # A batch is padded with the pad token, which only skip_special_tokens removes again: one at a time.
        return [self.decode([seq], False)[0] if seq else "" for seq in sequences]

    def token_texts(self, ids: list[int]) -> list[tuple[str, bytes]]:
        """Each id's own text and bytes, special tokens included (log-probabilities name their tokens)."""
        if self.table:
            table = self.table.bytes
            raw = [table[i] if 0 <= i < len(table) else b"" for i in ids]
        else:
            raw = [t.encode() for t in self.decode([[i] for i in ids], False)]
        return [(b.decode("utf-8", "replace"), b) for b in raw]


class StopFilter:
    """Cuts text at the first stop string (after it, if asked to keep it) and holds back any tail that could
    still become one, so no text of a stop string ever reaches a client that did not ask for it."""

    def __init__(self, stops: list[str], keep: bool = False) -> None:
        self.stops = [s for s in stops if s]
        self.keep = keep
        self._held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        if not self.stops:
            return text
        buffer = self._held + text
        found = [(i, len(s)) for i, s in ((buffer.find(s), s) for s in self.stops) if i >= 0]
        if found:
            cut, size = min(found)
            self.stopped = True
            self._held = ""
            return buffer[: cut + size] if self.keep else buffer[:cut]
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
