"""A queued job's estimated tokens, as the pool weighs waiting work."""
from __future__ import annotations

import orjson

from workers.pool.demand import OUTPUT_GUESS, job_tokens


def test_a_job_counts_its_prompt_and_its_output_budget() -> None:
    assert job_tokens(orjson.dumps({"prompt": "x" * 400, "params": {"max_tokens": 50}})) == 150
    assert job_tokens(orjson.dumps({"prompt": [1, 2, 3], "params": {"max_tokens": 10, "n": 2}})) == 23


def test_no_max_tokens_or_an_unreadable_job_gets_a_guess() -> None:
    assert job_tokens(orjson.dumps({"prompt": "", "params": {}})) == OUTPUT_GUESS
    assert job_tokens(b"not json") == OUTPUT_GUESS
