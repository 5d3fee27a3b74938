"""A queued job's estimated tokens, as the pool weighs waiting work."""
from __future__ import annotations

import orjson

from workers.pool.demand import OUTPUT_GUESS, held_by, job_tokens


def test_a_job_counts_its_prompt_and_its_output_budget() -> None:
    assert job_tokens(orjson.dumps({"prompt": "x" * 400, "params": {"max_tokens": 50}})) == 150
    assert job_tokens(orjson.dumps({"prompt": [1, 2, 3], "params": {"max_tokens": 10, "n": 2}})) == 23


def test_no_max_tokens_or_an_unreadable_job_gets_a_guess() -> None:
    assert job_tokens(orjson.dumps({"prompt": "", "params": {}})) == OUTPUT_GUESS
    assert job_tokens(b"not json") == OUTPUT_GUESS


def test_jobs_a_dead_worker_held_wait_and_a_live_workers_do_not() -> None:
    pending = {"pending": 5, "consumers": [{"name": b"live-1", "pending": 2}, {"name": b"dead-1", "pending": 1},
                                           {"name": b"park", "pending": 2}]}
    assert held_by(pending, {"live-1"}) == 2
    assert held_by({"pending": 0, "min": None, "consumers": []}, set()) == 0
