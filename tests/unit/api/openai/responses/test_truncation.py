"""`truncation: auto`: whole turns dropped from the beginning until the exact count fits; never the last turn."""
from __future__ import annotations

from typing import Any

import pytest

from api.openai.responses.protocol import ResponsesRequest
from api.openai.responses.truncation import fit
from common.errors import OvqError

CONTEXT = 100
BODY = ResponsesRequest(model="m", max_output_tokens=20)  # room: 80 prompt tokens


def conversation(turns: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for i in range(turns):
        items += [{"type": "message", "role": "user", "content": f"q{i}"},
                  {"type": "message", "role": "assistant", "content": f"a{i}"}]
    return items[:-1]  # ends with the last question


def counter(per_item: int, calls: list[int]):
    async def count(items: list[dict[str, Any]]) -> tuple[int, int]:
        calls.append(len(items))
        return 5 + per_item * len(items), CONTEXT  # 5: the template's own
    return count


async def test_what_fits_is_kept_whole_with_one_count() -> None:
    calls: list[int] = []
    items = conversation(3)
    assert await fit(BODY, items, [1] * len(items), counter(10, calls)) == (items, 55)
    assert calls == [5]


async def test_the_oldest_turns_go_until_it_fits_and_what_is_kept_starts_a_turn() -> None:
    calls: list[int] = []
    items = conversation(10)  # 19 items: 195 tokens
    kept, used = await fit(BODY, items, [6] * len(items), counter(10, calls))
    assert used <= 80 and kept == items[len(items) - len(kept):] and kept[0]["role"] == "user"
    assert len(kept) == 7  # 3 turns and the question: 75 tokens (the next whole turn would be 95)
    assert len(calls) <= 4


async def test_a_last_turn_over_the_context_is_a_400() -> None:
    items = conversation(2)
    with pytest.raises(OvqError) as caught:
        await fit(BODY, items, [None] * len(items), counter(100, []))
    assert (caught.value.status, caught.value.body.code, caught.value.body.param) == \
        (400, "context_length_exceeded", "input")
