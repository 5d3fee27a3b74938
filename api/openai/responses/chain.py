"""A `previous_response_id` chain, kept bounded: what a response records of the responses before it.

A prompt can never hold more than the model's context, so a response need not know every response before it, only
the newest of them whose items could still reach a prompt: its *window*, each with its items' token count, oldest
first. Continuing a response reads that window, not the chain: what a turn reads and writes stays the same whatever
the chain's length, bounded by the context (and by MAX_WINDOW where token counts are unknown), not by the turns.

Token counts are the items' texts as the model's tokenizer counts them on this API host (api/openai/tokenize.py),
taken once, when the response is stored. They leave out the template's few tokens per message, so they are at most
what the items cost in a prompt: a window cut where they reach the context keeps everything a prompt could hold.
Where the API host has no tokenizer they are unknown (None): the window then keeps the newest MAX_WINDOW responses.
"""
from __future__ import annotations

import asyncio
import logging
import sys
from dataclasses import dataclass, field
from typing import Any

from api.openai.tokenize import TOKENIZERS
from common.settings import Settings

log = logging.getLogger("ovq.api.responses")
MAX_WINDOW = 1024  # earlier responses a response records at most, whatever their tokens


@dataclass
class Chain:
    """The responses before one: `window`, the (id, tokens) of those a continuation may still need, oldest first,
    the previous response last; `depth`, how many there are in all (the window's, and older ones out of reach)."""

    window: list[tuple[str, int | None]] = field(default_factory=list)
    depth: int = 0

    @property
    def cut(self) -> bool:
        """Older responses than the window's exist: the whole chain no longer fits any prompt."""
        return self.depth > len(self.window)

    @property
    def ids(self) -> list[str]:
        return [response_id for response_id, _ in self.window]

    def then(self, response_id: str, tokens: int | None) -> Chain:
        """The chain of a response that continues `response_id` (whose items count `tokens`), this its own."""
        return Chain([*self.window, (response_id, tokens)], self.depth + 1)

    def fitted(self, context: int) -> Chain:
        """The window cut to what a prompt of `context` tokens could reach: the newest responses until their
        counts pass it (the one that passes it stays: its last items may still fit), MAX_WINDOW at most."""
        if context <= 0:  # a card that does not say: no cut but MAX_WINDOW
            context = sys.maxsize
        total, keep = 0, 0
        for _, tokens in reversed(self.window):
            if keep == MAX_WINDOW or total >= context:
                break
            total += tokens or 0
            keep += 1
        return Chain(self.window[len(self.window) - keep:], self.depth)

    def dumped(self) -> list[Any]:
        return [list(pair) for pair in self.window]

    @classmethod
    def of(cls, window: list[Any], depth: int | None = None) -> Chain:
        """As stored: a window of [id, tokens] pairs, or (a response stored before windows were) the whole
        chain's ids, with no counts."""
        pairs = [(entry, None) if isinstance(entry, str) else (entry[0], entry[1]) for entry in window]
        return cls(pairs, len(pairs) if depth is None else depth)


def item_text(item: dict[str, Any]) -> str:
    """The text an item puts in a prompt, as far as the template is not concerned (what its count counts)."""
    kind = item.get("type", "message")
    if kind == "function_call":
        return f"{item.get('name', '')}{item.get('arguments', '')}"
    if kind == "function_call_output":
        return _text(item.get("output"))
    if kind == "compaction":
        return str(item.get("encrypted_content", ""))
    if kind == "reasoning":
        return _text(item.get("content")) or _text(item.get("summary"))
    return _text(item.get("content"))


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(str(part.get("text") or part.get("refusal") or "") for part in value if isinstance(part, dict))
    return ""


async def item_tokens(settings: Settings, model: str, items: list[dict[str, Any]]) -> list[int] | None:
    """Each item's token count (`item_text`) with `model`'s tokenizer; None where this API host has none."""
    def count() -> list[int]:
        return [TOKENIZERS.count(settings, model, item_text(item)) if item_text(item) else 0 for item in items]

    try:
        return await asyncio.to_thread(count)
    except Exception as exc:  # counts only bound what later turns read: the response is stored without them
        log.debug("no token counts for %s's items: %s", model, exc)
        return None
