"""A request without max_tokens gets the model's default: the models file's, else generation_config.json's."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from common.models.config import ModelConfig
from workers.text.servable_info import announced_sampling, model_defaults

TINY = Path(__file__).resolve().parents[3] / "models" / "tiny-llama"  # generation_config: max_new_tokens 32


@pytest.mark.parametrize(("options", "expected"), [
    ({}, 32),  # generation_config.json's max_new_tokens
    ({"max_tokens_default": 64}, 64),  # the models file's, over the directory's
    ({"max_tokens_limit": 16}, 16),  # the limit caps the default
    ({"max_tokens_default": 64, "max_tokens_limit": 48}, 48),
    ({"max_tokens_limit": 4096}, 32),
])
def test_max_tokens_default(options: dict[str, Any], expected: int) -> None:
    assert model_defaults(ModelConfig(name="m", path=TINY, **options), TINY)["max_tokens"] == expected


def test_without_any_default_the_limit_is_one_and_without_a_limit_the_context_is(tmp_path: Path) -> None:
    assert model_defaults(ModelConfig(name="m", path=tmp_path, max_tokens_limit=100), tmp_path) == {"max_tokens": 100}
    assert "max_tokens" not in model_defaults(ModelConfig(name="m", path=tmp_path), tmp_path)



def test_the_card_announces_the_sampling_a_request_that_sets_none_gets() -> None:
    assert announced_sampling({"temperature": 0.2, "top_p": 0.9, "max_tokens": 512}) == {
        "temperature": 0.2, "top_p": 0.9, "presence_penalty": 0.0, "frequency_penalty": 0.0}
    assert announced_sampling({"presence_penalty": 1}) == {
        "temperature": 1.0, "top_p": 1.0, "presence_penalty": 1.0, "frequency_penalty": 0.0}
