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
    engine.add("json", PROMPT, False, {"structured": json_schema({"type": "object"}), "max_tokens": 2}, [], out)
    assert out == []  # held until the step that compiles its grammar
    engine.step(out)
    assert out[0] == ["json", [], "accepted", engine.requests["json"].prompt_len]
    engine.cancel("json", out)


def test_a_grammar_that_breaks_the_step_is_its_jobs_400_and_the_others_500(model_dir: Path) -> None:
    broken = Engine(EngineSpec(str(model_dir), "CPU", {"cache_size": 0}, {}, 8192))
    out: list[list] = []
    broken.add("bystander", PROMPT, False, {"max_tokens": 50, "ignore_eos": True}, [], out)
    broken.step(out)
    # Lookahead passes the JSON Schema meta-schema but not xgrammar (the API refuses it earlier too).
    bad = {"type": "string", "pattern": "^(?=a)a+$"}
    broken.add("culprit", PROMPT, False, {"structured": json_schema(bad), "max_tokens": 4}, [], out)
    with pytest.raises(RuntimeError):
        broken.step(out)
    errors = {u[0]: u[3] for u in out if u[2] == "error"}
    assert errors["culprit"]["status"] == 400 and "Lookahead" in errors["culprit"]["message"]
    assert errors["bystander"]["status"] == 500
    assert not broken.requests
