"""Each token's log-probability travels with the text it made: held back with it, dropped when a stop string
cuts that text off, so a client sees exactly the tokens of the text it got, streamed or whole."""
from __future__ import annotations

from collections import deque
from typing import Any

TokenLogprob = dict[str, Any]  # {"token", "logprob", "bytes"}: see common.events.TokenLogprob


class LogprobAligner:
    def __init__(self) -> None:
        self._pending: deque[tuple[int, TokenLogprob]] = deque()  # (offset of the token's text, its entry)
        self._fed = 0  # characters of text fed to the stop filter so far

    def add(self, pieces: list[int], entries: list[TokenLogprob]) -> None:
        for size, entry in zip(pieces, entries, strict=True):
            self._pending.append((self._fed, entry))
            self._fed += size

    def release(self, emitted: int) -> list[TokenLogprob]:
        """Entries of the tokens whose text starts before `emitted` (characters the client has now)."""
        out = []
        while self._pending and self._pending[0][0] < emitted:
            out.append(self._pending.popleft()[1])
        return out

    def rest(self, stopped: bool, emitted: int) -> list[TokenLogprob]:
        """At the end: all that is left, or after a stop string only the tokens of text that was kept."""
        if stopped:
            out = self.release(emitted)
            self._pending.clear()
            return out
        out = [entry for _, entry in self._pending]
        self._pending.clear()
        return out
