"""`truncation: "auto"`: the oldest items of a chain are dropped until the prompt fits the model's context.

As OpenAI documents it: with `auto`, when a response's input (its `previous_response_id` chain and its own input)
is over the context window, items are dropped from the beginning of the conversation; with `disabled` (the
default) such a request is a 400. What is left must fit the context with room for the answer: `max_output_tokens`
when the request sets it, else RESERVE_SHARE of the context.

The conversation is the chain's history then the request's input (which may itself be a long history, such as a
compacted window: compact.py). Whole turns are dropped (what is kept starts at a user message), so that no
`function_call_output` is left without its call and templates that want turns to alternate render what is left.
The last turn (from the last user message on) is never dropped: if it alone is over the context, the request is the
400 `disabled` gives.

The cut is found from the items' stored token counts (chain.py), then checked exactly: the prompt is rendered by
the model's template and counted by its tokenizer on this API host, once when it fits (the usual case), a few times
at most when the counts' missing template tokens put it over. So a turn costs a context's worth of rendering and
counting, whatever the chain's length.
"""
from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import Any

from api.openai.responses.chain import item_text
from api.openai.responses.protocol import ResponsesRequest
from api.openai.responses.store import context_exceeded

RESERVE_SHARE = 8  # without max_output_tokens, 1/8 of the context is kept for the answer
MESSAGE_TOKENS = 4  # what a template adds around a message, about (ChatML: <|im_start|>role\n ... <|im_end|>\n)
MAX_PASSES = 6  # exact counts before giving up (each pass drops at least one turn)

# The prompt's token count and the model's context, for a conversation's items.
Count = Callable[[list[dict[str, Any]]], Awaitable[tuple[int, int]]]


def room(body: ResponsesRequest, context: int) -> int:
    """The prompt tokens a request may use: its context less what is kept for the answer (a card that does not
    say its context: no limit here, the worker's own check stands)."""
    if context <= 0:
        return sys.maxsize
    return context - (body.max_output_tokens or context // RESERVE_SHARE)


async def fit(body: ResponsesRequest, items: list[dict[str, Any]], tokens: list[int | None],
              count: Count) -> tuple[list[dict[str, Any]], int]:
    """The newest items of a conversation (`items`, oldest first: the chain's history, then the request's input;
    `tokens` their counts, None where unknown) whose prompt fits, and that prompt's token count; a 400 when its
    last turn alone does not fit."""
    last = max((i for i, item in enumerate(items) if _turn_starts(item)), default=0)
    start = 0
    for _ in range(MAX_PASSES):
        used, context = await count(items[start:])
        over = used - room(body, context)
        if over <= 0:
            return items[start:], used
        if start >= last:
            break
        start = min(_cut(items, tokens, start, over), last)
    raise context_exceeded()


def _cut(items: list[dict[str, Any]], tokens: list[int | None], start: int, over: int) -> int:
    """Where the conversation starts once `over` tokens more are dropped: after enough items (by their counts, or
    a guess from their text's length), at the next user message."""
    end, dropped = start, 0
    while end < len(items) and dropped < over:
        known = tokens[end]
        dropped += (known if known is not None else len(item_text(items[end])) // 4) + MESSAGE_TOKENS
        end += 1
    end = max(end, start + 1)
    while end < len(items) and not _turn_starts(items[end]):
        end += 1
    return end


def _turn_starts(item: dict[str, Any]) -> bool:
    return item.get("type", "message") == "message" and item.get("role") == "user"
