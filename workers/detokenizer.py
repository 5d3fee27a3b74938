"""Token ids in, text out, one step at a time: never a split UTF-8 character, never any text of a stop string."""
from __future__ import annotations

from collections.abc import Callable

Decode = Callable[[list[int]], str]


class IncrementalDetokenizer:
    """Decodes a growing id list through a short window, so each step costs O(window), not O(length).

    Byte-level BPE splits multi-byte characters across tokens: a window that ends in U+FFFD is held back
    until the next token completes it.
    """

    def __init__(self, decode: Decode) -> None:
        self._decode = decode
        self.ids: list[int] = []
        self._prefix = 0  # start of the window that gives context to the next tokens
        self._read = 0  # ids before this are already emitted

    def push(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        if len(self.ids) == self._read:
            return ""
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        return after[len(before) :]


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
