"""A chain's window: bounded by the context (and MAX_WINDOW), whatever the chain's length."""
from __future__ import annotations

from api.openai.responses.chain import MAX_WINDOW, Chain, item_text


def grown(turns: int, tokens: int | None, context: int) -> Chain:
    chain = Chain()
    for i in range(turns):
        chain = chain.then(f"resp_{i}", tokens).fitted(context)
    return chain


def test_the_window_keeps_what_a_prompt_could_reach_and_the_depth_counts_all() -> None:
    chain = grown(1000, 100, 1000)
    assert len(chain.window) == 10 and chain.depth == 1000 and chain.cut  # the 10th passes 1,000 tokens: kept
    assert chain.ids == [f"resp_{i}" for i in range(990, 1000)]
    short = grown(5, 100, 1000)
    assert len(short.window) == 5 and not short.cut


def test_unknown_counts_keep_max_window() -> None:
    assert len(grown(MAX_WINDOW + 50, None, 1000).window) == MAX_WINDOW


def test_a_chain_stored_before_windows_reads_as_a_whole_uncounted_window() -> None:
    assert Chain.of(["resp_a", "resp_b"]) == Chain([("resp_a", None), ("resp_b", None)], 2)
    assert Chain.of([["resp_a", 3]], 7) == Chain([("resp_a", 3)], 7)


def test_item_text_is_what_the_item_puts_in_a_prompt() -> None:
    assert item_text({"type": "message", "role": "user", "content": "hi"}) == "hi"
    assert item_text({"type": "message", "role": "assistant",
                      "content": [{"type": "output_text", "text": "a"}, {"type": "output_text", "text": "b"}]}) == "ab"
    assert item_text({"type": "function_call", "name": "f", "arguments": "{}"}) == "f{}"
    assert item_text({"type": "function_call_output", "output": "42"}) == "42"


def test_a_card_without_a_context_cuts_nothing_but_max_window() -> None:
    assert len(grown(5, 100, 0).window) == 5
