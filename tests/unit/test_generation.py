from __future__ import annotations

import pytest

from common.errors import OvqError
from common.jobs import SamplingParams
from workers.generation import engine_config, token_budget


def test_budget_defaults_to_the_room_left_in_the_context() -> None:
    assert token_budget(SamplingParams(), {}, prompt_tokens=100, context=2048) == 1948
    assert token_budget(SamplingParams(), {"max_tokens": 32}, 100, 2048) == 32
    assert token_budget(SamplingParams(max_tokens=5), {"max_tokens": 32}, 100, 2048) == 5


def test_prompt_or_request_too_long_is_a_400() -> None:
    with pytest.raises(OvqError) as caught:
        token_budget(SamplingParams(), {}, prompt_tokens=2048, context=2048)
    assert caught.value.status == 400 and caught.value.body.code == "context_length_exceeded"
    with pytest.raises(OvqError):
        token_budget(SamplingParams(max_tokens=100), {}, prompt_tokens=2000, context=2048)


def test_request_then_model_then_builtin_defaults() -> None:
    assert engine_config(SamplingParams(), {}, 8) == {"max_new_tokens": 8, "do_sample": True, "temperature": 1.0,
                                                       "top_p": 1.0}
    assert engine_config(SamplingParams(), {"temperature": 0.0}, 8)["do_sample"] is False
    config = engine_config(SamplingParams(temperature=0.5, top_k=40, seed=3), {"temperature": 0.0}, 8)
    assert (config["temperature"], config["top_k"], config["rng_seed"]) == (0.5, 40, 3)


def test_stop_strings_are_kept_in_engine_output_for_the_filter() -> None:
    config = engine_config(SamplingParams(temperature=0, stop=["x"], ignore_eos=True), {}, 8)
    assert config["stop_strings"] == ["x"] and config["include_stop_str_in_output"] is True
    assert config["ignore_eos"] is True and "temperature" not in config
