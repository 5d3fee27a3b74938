"""The continuous-batching engine in-process on the real default model."""
from __future__ import annotations

from pathlib import Path

import pytest

from common.structured import json_schema
from workers.engine import Engine, EngineSpec

PROMPT = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Engine:
    return Engine(EngineSpec(str(model_dir), "CPU", {"cache_size": 0}, {}, 8192))


def test_structured_job_is_accepted_only_after_its_grammar_compiled(engine: Engine) -> None:
    out: list[list] = []
    engine.add("json", PROMPT, False, {"structured": json_schema({"type": "object"}), "max_tokens": 2}, [], None, out)
    assert out == []  # held until the step that compiles its grammar
    engine.step(out)
    assert out[0] == ["json", [], "accepted", engine.requests["json"].prompt_len]
    engine.cancel("json", out)


def test_a_step_that_fails_names_the_jobs_added_since_the_last_good_one(model_dir: Path) -> None:
    broken = Engine(EngineSpec(str(model_dir), "CPU", {"cache_size": 0}, {}, 8192))
    out: list[list] = []
    broken.add("bystander", PROMPT, False, {"max_tokens": 50, "ignore_eos": True}, [], None, out)
    broken.step(out)
    assert broken.added == set()
    # Lookahead passes the JSON Schema meta-schema but not xgrammar (the API refuses it earlier too).
    bad = {"type": "string", "pattern": "^(?=a)a+$"}
    broken.add("culprit", PROMPT, False, {"structured": json_schema(bad), "max_tokens": 4}, [], None, out)
    assert broken.added == {"culprit"}
    with pytest.raises(RuntimeError, match="(?i)lookahead"):
        broken.step(out)


def test_end_of_sequence_is_neither_text_nor_counted_and_ends_with_stop(engine: Engine) -> None:
    """SmolLM2 answers this in 11 tokens then EOS: with exactly 12 allowed, EOS is the last one allowed."""
    prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    finishes = {}
    for budget in (11, 12, 13):
        out: list[list] = []
        engine.add(f"eos{budget}", prompt, False, {"max_tokens": budget, "temperature": 0, "logprobs": 0}, [],
                   None, out)
        while f"eos{budget}" in engine.requests:
            engine.step(out)
        updates = [u for u in out if u[0] == f"eos{budget}" and u[2] != "accepted"]
        ids = [i for u in updates for i in u[1]]
        logprobs = [p for u in updates for p in (u[5] or [])]
        assert engine.eos not in ids and len(logprobs) == len(ids)
        finishes[budget] = (updates[-1][2], len(ids))
    assert finishes == {11: ("length", 11), 12: ("stop", 11), 13: ("stop", 11)}


def test_a_resumed_job_goes_on_from_its_generated_ids(engine: Engine) -> None:
    greedy = {"max_tokens": 12, "temperature": 0}
    whole: list[list] = []
    engine.add("whole", PROMPT, False, greedy, [], None, whole)
    while "whole" in engine.requests:
        engine.step(whole)
    ids = [i for u in whole if u[2] != "accepted" for i in u[1]]
    resumed: list[list] = []
    engine.add("rest", PROMPT, False, greedy, [], {"generated": {"0": ids[:5]}, "done": []}, resumed)
    while "rest" in engine.requests:
        engine.step(resumed)
    assert not any(u[2] == "accepted" for u in resumed)  # it was accepted on the engine that failed
    assert ids[:5] + [i for u in resumed for i in u[1]] == ids
    assert resumed[-1][2] == whole[-1][2]


def test_a_plain_choices_running_updates_are_the_short_form(engine: Engine) -> None:
    """The I/O half takes `[job, ids, None, None]` on its fast path; index and log-probabilities only when needed."""
    out: list[list] = []
    engine.add("plain", PROMPT, False, {"max_tokens": 4, "temperature": 0, "ignore_eos": True}, [], None, out)
    engine.add("probs", PROMPT, False, {"max_tokens": 4, "temperature": 0, "ignore_eos": True, "logprobs": 0}, [],
               None, out)
    while engine.requests:
        engine.step(out)
    plain = [u for u in out if u[0] == "plain" and u[2] != "accepted"]
    assert [len(u) for u in plain] == [4, 4, 4, 6] and plain[-1][2] == "length"
    assert all(len(u) == 6 for u in out if u[0] == "probs" and u[2] != "accepted")
