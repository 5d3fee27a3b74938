"""The stateful engine process, driven over its pipe as the I/O half drives it (tiny Llama, SmolLM2 if prepared)."""
from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import orjson
import pytest

from workers.engine.continuous import error_message
from workers.engine.protocol import EngineSpec
from workers.engine.stateful import pipeline_properties, run

TINY = Path(__file__).resolve().parents[3] / "models" / "tiny-llama"
TINY_PROMPT_LIMIT = 64
STATEFUL = {"ATTENTION_BACKEND": "SDPA"}  # the stateful pipeline on CPU
GREEDY = {"temperature": 0.0}
FRANCE = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


@dataclass
class Outcome:
    accepted: int | None = None
    ids: list[int] = field(default_factory=list)
    finish: str | None = None
    extra: Any = None
    updates: int = 0


class EngineProcess:
    """The engine in a spawned process, with the helpers a test needs to talk to it."""

    def __init__(self, spec: EngineSpec) -> None:
        ctx = mp.get_context("spawn")
        commands, self.commands = ctx.Pipe(duplex=False)
        self.conn, outputs = ctx.Pipe(duplex=False)
        self.process = ctx.Process(target=run, args=(commands, outputs, spec), daemon=True)
        self.process.start()
        commands.close()
        outputs.close()
        self.log: list[list[Any]] = []  # every update, in arrival order

    def ready(self, timeout: float = 60) -> dict[str, Any]:
        assert self.conn.poll(timeout), "the engine did not answer the handshake"
        return orjson.loads(self.conn.recv_bytes())

    def send(self, *commands: list[Any]) -> None:
        self.commands.send_bytes(orjson.dumps(list(commands)))

    def add(self, job: str, prompt: str | list[int], params: dict[str, Any], special: bool = True) -> None:
        self.send(["add", job, prompt, special, {**GREEDY, **params}, []])

    def until(self, done: Any, timeout: float = 30) -> None:
        """Read updates until `done(log)` holds."""
        deadline = time.monotonic() + timeout
        while not done(self.log):
            left = deadline - time.monotonic()
            assert left > 0 and self.conn.poll(left), f"no update in time; got {self.log}"
            self.log.extend(orjson.loads(self.conn.recv_bytes())["u"])

    def finish(self, *jobs: str, timeout: float = 30) -> dict[str, Outcome]:
        self.until(lambda log: all(any(u[0] == j and u[2] not in (None, "accepted") for u in log) for j in jobs),
                   timeout)
        return {job: outcome(self.log, job) for job in jobs}

    def close(self) -> None:
        if self.process.is_alive():
            self.send(["stop"])
            self.process.join(15)
        if self.process.is_alive():
            self.process.kill()
        self.conn.close()
        self.commands.close()


def outcome(log: list[list[Any]], job: str) -> Outcome:
    result = Outcome()
    for update_job, ids, state, extra in log:
        if update_job != job:
            continue
        result.ids.extend(ids)
        result.updates += 1
        if state == "accepted":
            result.accepted = extra
        elif state is not None:
            result.finish, result.extra = state, extra
    return result


def tiny_spec(**plugin: Any) -> EngineSpec:
    return EngineSpec(str(TINY), "CPU", {}, {**STATEFUL, "MAX_PROMPT_LEN": TINY_PROMPT_LIMIT, **plugin}, 2048,
                      vocab_size=512)


@pytest.fixture(scope="module")
def tiny() -> Iterator[EngineProcess]:
    engine = EngineProcess(tiny_spec())
    assert engine.ready() == {"ready": True}
    yield engine
    engine.close()


@pytest.fixture()
def engine(tiny: EngineProcess) -> EngineProcess:
    tiny.log.clear()
    return tiny


def reference_text(path: Path, prompt: str, max_new_tokens: int) -> str:
    import openvino_genai as g

    pipe = g.LLMPipeline(str(path), "CPU", **STATEFUL)
    config = g.GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, apply_chat_template=False)
    return str(pipe.generate(prompt, config))


@cache
def tokenizer(path: Path) -> Any:
    import openvino_genai as g

    return g.Tokenizer(str(path))


def decode(path: Path, ids: list[int]) -> str:
    return tokenizer(path).decode(ids)


def test_accepted_then_tokens_then_length_with_exactly_max_tokens(engine: EngineProcess) -> None:
    engine.add("a", "hello world", {"max_tokens": 40})
    result = engine.finish("a")["a"]
    assert engine.log[0] == ["a", [], "accepted", result.accepted] and result.accepted > 0
    assert result.finish == "length" and len(result.ids) == 40
    assert result.updates > 3, "ids should stream in several updates"


def test_streamed_ids_give_the_text_llmpipeline_generates(engine: EngineProcess) -> None:
    prompt = "the quick brown fox"
    engine.add("a", prompt, {"max_tokens": 30})
    result = engine.finish("a")["a"]
    assert decode(TINY, result.ids) == reference_text(TINY, prompt, 30)


def test_a_stop_string_ends_with_stop_and_every_id_counted(engine: EngineProcess) -> None:
    engine.add("full", "the quick brown fox", {"max_tokens": 30})
    full = engine.finish("full")["full"].ids
    stop = decode(TINY, full[:12])[-4:]
    # GenAI stops at the first id whose text holds the stop string, and keeps it (include_stop_str_in_output).
    expected = next(full[:k] for k in range(1, 31) if stop in decode(TINY, full[:k]))
    engine.add("stopped", "the quick brown fox", {"max_tokens": 30, "stop": [stop]})
    result = engine.finish("stopped")["stopped"]
    assert result.finish == "stop" and result.ids == expected and result.extra is None


def test_token_id_prompts_are_checked_against_the_vocabulary(engine: EngineProcess) -> None:
    engine.add("ok", [5, 6, 7], {"max_tokens": 3})
    engine.add("bad", [5, 600], {"max_tokens": 3})
    results = engine.finish("ok", "bad")
    assert results["ok"].accepted == 3 and results["ok"].finish == "length" and len(results["ok"].ids) == 3
    assert results["bad"].finish == "error" and results["bad"].extra["param"] == "prompt"


def test_cancel_mid_generation_then_the_next_job_is_served(engine: EngineProcess) -> None:
    engine.add("long", "hello world", {"max_tokens": 1900})
    engine.until(lambda log: any(u[0] == "long" and u[1] for u in log))
    engine.send(["cancel", "long"])
    long = engine.finish("long")["long"]
    assert long.finish == "cancelled" and 0 < len(long.ids) < 1900
    engine.add("next", "hello world", {"max_tokens": 5})
    nxt = engine.finish("next")["next"]
    assert nxt.finish == "length" and len(nxt.ids) == 5
    assert not any(u[0] == "long" for u in engine.log[engine.log.index(["next", [], "accepted", nxt.accepted]):])


def test_a_job_sent_while_one_runs_waits_for_it(engine: EngineProcess) -> None:
    engine.add("first", "hello world", {"max_tokens": 200})
    engine.until(lambda log: any(u[0] == "first" and u[1] for u in log))
    engine.add("second", "the quick brown fox", {"max_tokens": 7})
    results = engine.finish("first", "second")
    assert results["first"].finish == "length" and len(results["first"].ids) == 200
    assert results["second"].finish == "length" and len(results["second"].ids) == 7
    ended = next(i for i, u in enumerate(engine.log) if u[0] == "first" and u[2] == "length")
    assert not any(u[0] == "second" and u[1] for u in engine.log[:ended]), "the jobs overlapped"


def test_cancel_of_a_queued_job(engine: EngineProcess) -> None:
    engine.add("first", "hello world", {"max_tokens": 100})
    engine.add("queued", "hello world", {"max_tokens": 100})
    engine.send(["cancel", "queued"])
    results = engine.finish("first", "queued")
    assert results["queued"].finish == "cancelled" and results["queued"].ids == []
    assert results["first"].finish == "length" and len(results["first"].ids) == 100


def test_prompt_over_max_prompt_len_is_refused(engine: EngineProcess) -> None:
    engine.add("big", "hello world " * 40, {"max_tokens": 5})
    result = engine.finish("big")["big"]
    assert result.finish == "error" and result.accepted is None
    assert result.extra["status"] == 400 and result.extra["code"] == "context_length_exceeded"
    assert result.extra["param"] == "messages" and f"MAX_PROMPT_LEN {TINY_PROMPT_LIMIT}" in result.extra["message"]


@pytest.mark.parametrize(("params", "words"), [
    ({"temperature": 0.7, "top_p": 2.0}, "top_p"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"n": 2}, "one sequence"),
    ({"num_beams": 4}, "one sequence"),
    ({"max_tokens": 4000}, "maximum context length"),
])
def test_invalid_configs_are_400s(engine: EngineProcess, params: dict[str, Any], words: str) -> None:
    engine.add("bad", "hello world", params)
    result = engine.finish("bad")["bad"]
    assert result.finish == "error" and result.extra["status"] == 400
    assert words in result.extra["message"] and "Check '" not in result.extra["message"]


def test_stop_cancels_the_running_generation_and_exits() -> None:
    engine = EngineProcess(tiny_spec())
    try:
        assert engine.ready()["ready"]
        engine.add("long", "hello world", {"max_tokens": 1900})
        engine.until(lambda log: any(u[0] == "long" and u[1] for u in log))
        started = time.monotonic()
        engine.send(["stop"])
        engine.process.join(10)
        assert engine.process.exitcode == 0 and time.monotonic() - started < 5
    finally:
        engine.close()


def test_a_model_that_does_not_load_reports_not_ready(tmp_path: Path) -> None:
    engine = EngineProcess(EngineSpec(str(tmp_path), "CPU", {}, STATEFUL, 2048))
    try:
        ready = engine.ready()
        assert ready["ready"] is False and "Could not find a model" in ready["error"] and "\n" not in ready["error"]
    finally:
        engine.close()


def test_npu_only_properties_stay_off_other_devices() -> None:
    properties, limit, context = pipeline_properties(tiny_spec(MIN_RESPONSE_LEN=16))
    assert properties == STATEFUL and limit == TINY_PROMPT_LIMIT and context == 2048
    npu = EngineSpec("m", "NPU", {}, {}, 4096)
    assert pipeline_properties(npu) == ({}, 1024, 1024 + 128)


def test_error_message_skips_openvino_source_locations() -> None:
    exc = RuntimeError("Check 'temperature > 0' failed at src/cpp/src/generation_config.cpp:344:\n"
                       "When 'do_sample' is true, temperature must be a strictly positive float, but got 0\n")
    assert error_message(exc).startswith("When 'do_sample' is true")
    assert error_message(RuntimeError("plain")) == "plain"


def test_smollm2_answers_paris_like_llmpipeline(model_dir: Path) -> None:
    spec = EngineSpec(str(model_dir), "CPU", {}, dict(STATEFUL), 8192, vocab_size=None)
    engine = EngineProcess(spec)
    try:
        expected = reference_text(model_dir, FRANCE, 64)  # loads while the engine process does
        assert engine.ready()["ready"]
        engine.add("paris", FRANCE, {"max_tokens": 64}, special=False)
        result = engine.finish("paris")["paris"]
        text = decode(model_dir, result.ids)
        assert result.finish == "stop" and "Paris" in text and text == expected
        assert len(result.ids) < 64 and result.extra == 1  # ended on its end of sequence: not sent, counted
    finally:
        engine.close()
