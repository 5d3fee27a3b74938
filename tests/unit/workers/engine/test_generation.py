from __future__ import annotations

import pytest

from common.errors import OvqError
from common.jobs import SamplingParams
from workers.engine.generation import choice_configs, engine_config, prompt_param, token_budget


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


def test_sampled_choices_are_separate_requests_with_consecutive_seeds() -> None:
    configs = choice_configs(SamplingParams(n=3, seed=2**32 - 1, temperature=0.7), {}, 8)
    assert [c["rng_seed"] for c in configs] == [2**32 - 1, 0, 1]
    unseeded = choice_configs(SamplingParams(n=2, temperature=0.7), {}, 8)
    assert unseeded[1]["rng_seed"] == (unseeded[0]["rng_seed"] + 1) % 2**32


def test_best_of_is_one_beam_search_request() -> None:
    (config,) = choice_configs(SamplingParams(n=2, best_of=4, temperature=0.9, length_penalty=0.5), {}, 8)
    assert (config["num_beams"], config["num_return_sequences"], config["do_sample"]) == (4, 2, False)
    assert "temperature" not in config and config["length_penalty"] == 0.5


def test_top_logprob_needs_greedy() -> None:
    assert choice_configs(SamplingParams(logprobs=1, temperature=0), {}, 8)[0]["logprobs"] == 1
    with pytest.raises(OvqError, match="greedy"):
        choice_configs(SamplingParams(logprobs=1, temperature=0.5), {}, 8)


def test_a_prompt_too_long_names_the_field_it_came_from() -> None:
    for kind, param in (("chat", "messages"), ("completion", "prompt")):
        with pytest.raises(OvqError) as caught:
            token_budget(SamplingParams(), {}, prompt_tokens=20001, context=8192, param=prompt_param(kind))
        assert caught.value.body.param == param and "resulted in 20001 tokens" in caught.value.body.message
