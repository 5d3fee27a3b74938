"""Weighted aliases: keyed requests fall on the weights by hash (sticky, spread by weight); keyless ones are dealt
exactly by weight; the models file's `aliases` are checked against its models."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from common.models.aliases import Alias, Dealer
from common.models.config import ConfigError
from common.models.sources import load_catalog

CANARY = Alias(name="chat", weights={"model-a": 90, "model-b": 10})


def test_a_key_always_falls_on_the_same_target() -> None:
    for key in ("conversation-1", "user-42", "x" * 500):
        assert len({CANARY.by_key(key) for _ in range(20)}) == 1
    assert Alias(name="chat", weights={"model-a": 90, "model-b": 10}).by_key("k") == CANARY.by_key("k")


def test_keys_spread_by_weight() -> None:
    # sha256 of fixed keys: the count is the same on every run. The bound is 5 standard deviations of the binomial
    # (10,000 x 0.1 x 0.9 -> sd 30): a hash that ignored the weights (50/50) or the key (all on one) lands far out.
    counts = Counter(CANARY.by_key(f"conversation-{i}") for i in range(10_000))
    assert abs(counts["model-b"] - 1_000) < 150, counts


def test_changing_a_weight_moves_only_the_keys_between_the_boundaries() -> None:
    wider = Alias(name="chat", weights={"model-a": 80, "model-b": 20})
    moved = [k for k in (f"c{i}" for i in range(5_000)) if CANARY.by_key(k) != wider.by_key(k)]
    assert all(CANARY.by_key(k) == "model-a" and wider.by_key(k) == "model-b" for k in moved)
    assert 350 < len(moved) < 650  # about 10% of them


def test_a_zero_weight_gets_nothing() -> None:
    drained = Alias(name="chat", weights={"model-a": 0, "model-b": 1})
    assert {drained.by_key(f"k{i}") for i in range(500)} == {"model-b"}
    assert {Dealer(drained).next() for _ in range(50)} == {"model-b"}


def test_keyless_requests_are_dealt_exactly_by_weight_and_interleaved() -> None:
    dealer = Dealer(CANARY)
    dealt = [dealer.next() for _ in range(1_000)]
    for start in range(0, 1_000, 100):  # every run of sum(weights) requests: exactly the weights
        assert Counter(dealt[start:start + 100]) == {"model-a": 90, "model-b": 10}
    longest = max(len(run) for run in "".join("a" if t == "model-a" else "b" for t in dealt).split("b"))
    assert longest <= 9  # smooth: never 90 in a row


def test_the_models_file_reads_aliases(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text("models:\n  model-a: {path: /a}\n  model-b: {path: /b}\n"
                    "aliases:\n  chat: {model-a: 90, model-b: 10}\n")
    assert load_catalog(path).aliases == [CANARY]


@pytest.mark.parametrize(("aliases", "says"), [
    ("chat: {model-c: 1}", "model-c, not a model"),
    ("model-a: {model-b: 1}", "has the name of a model"),
    ("chat: {model-a: 0}", "at least one weight above 0"),
    ("chat: {model-a: -1, model-b: 2}", "weights are integers >= 0"),
    ("chat: {model-a: 0.5}", "integer weight"),
    ("chat: [model-a]", "integer weight"),
])
def test_a_bad_alias_names_the_file_and_the_alias(tmp_path: Path, aliases: str, says: str) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(f"models:\n  model-a: {{path: /a}}\n  model-b: {{path: /b}}\naliases:\n  {aliases}\n")
    with pytest.raises(ConfigError, match=says) as caught:
        load_catalog(path)
    assert str(path) in str(caught.value)
