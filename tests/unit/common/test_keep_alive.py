"""Ollama's keep_alive: seconds, or a Go duration; negative keeps a model for good."""
from __future__ import annotations

import pytest

from common.keep_alive import parse


@pytest.mark.parametrize(("value", "seconds"), [
    ("5m", 300.0), ("1h30m", 5400.0), ("90s", 90.0), ("1.5h", 5400.0), ("500ms", 0.5), ("-1m", -60.0),
    ("300", 300.0), ("-1", -1.0), ("0", 0.0), (300, 300.0), (-1, -1.0), (2.5, 2.5)])
def test_durations_and_numbers(value: object, seconds: float) -> None:
    assert parse(value) == seconds  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["5 minutes", "", "m", "5m3", "5d", "nan", "inf", True, float("inf")])
def test_what_ollama_refuses_is_refused(value: object) -> None:
    with pytest.raises(ValueError):
        parse(value)  # type: ignore[arg-type]
