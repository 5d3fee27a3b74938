"""The continuous-batching engine in-process on the real default model."""
from __future__ import annotations

import multiprocessing
import threading
from multiprocessing import Pipe
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest

from common.structured import json_schema
from tests.precision import F32
from workers.engine import protocol
from workers.engine.arrivals import ArrivalWindow
from workers.engine.continuous import Engine, Request, _take, run
from workers.engine.protocol import EngineSpec

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


def test_end_of_sequence_is_not_sent_but_its_stop_says_to_count_it(engine: Engine) -> None:
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
        finishes[budget] = (updates[-1][2], len(ids), updates[-1][3])
    assert finishes == {11: ("length", 11, None), 12: ("stop", 11, 1), 13: ("stop", 11, 1)}


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



def _running(engine: Engine, job: str) -> None:
    out: list[list] = []
    engine.add(job, PROMPT, False, {"max_tokens": 64, "temperature": 0, "ignore_eos": True}, [], None, out)
    engine.step(out)


@pytest.mark.timeout(20)
def test_after_a_step_that_ended_jobs_the_engine_waits_for_their_replacements_and_no_longer(engine: Engine) -> None:
    """The window is 60 s here: the test finishing at all shows the wait ended when the add came."""
    _running(engine, "busy")
    commands, to_engine = Pipe(duplex=False)
    _, outputs = Pipe(duplex=False)
    add = [["add", "next", PROMPT, False, {"max_tokens": 2}, [], None, "chat"]]
    sender = threading.Timer(0.2, lambda: to_engine.send_bytes(orjson.dumps(add)))
    sender.start()
    window, out = ArrivalWindow(60.0, allowance=60.0), []
    assert _take(commands, outputs, engine, out, window, ended=1)
    assert out == [["next", [], "accepted", engine.requests["next"].prompt_len]]
    assert window.allowance > 0  # it spent only what it waited
    for job in ("busy", "next"):
        engine.cancel(job, out)


@pytest.mark.timeout(20)
def test_without_an_allowance_the_engine_does_not_wait(engine: Engine) -> None:
    _running(engine, "alone")
    commands, to_engine = Pipe(duplex=False)  # open, silent: a wait would last its whole window
    _, outputs = Pipe(duplex=False)
    window = ArrivalWindow(60.0)  # nothing earned: a wait of 60 s would time the test out
    assert _take(commands, outputs, engine, [], window, ended=1)
    engine.cancel("alone", [])
    to_engine.close()


def test_greedy_output_with_a_draft_model_is_the_output_without_one() -> None:
    """Speculative decoding: the tiny Llama drafted by its own first layer (it agrees on some tokens, not on
    others) gives token for token what the tiny Llama gives alone, several jobs in one batch. At f32: in bf16 the
    verification of several drafted tokens in one pass rounds differently from decoding them one by one (pinned;
    docs/how-to/precision.md has the measurement)."""
    models = Path(__file__).resolve().parents[3] / "models"
    llama, draft = str(models / "tiny-llama"), str(models / "tiny-llama-draft")
    scheduler = {"cache_size": 0}
    plain = Engine(EngineSpec(llama, "CPU", scheduler, F32, 2048))
    drafted = Engine(EngineSpec(llama, "CPU", scheduler, F32, 2048,
                                draft={"path": draft, "device": "CPU", "scheduler": scheduler}))
    prompts = ["hello world the", "The quick brown fox", "What is the capital of France?"]
    asks = [{"max_tokens": 40, "temperature": 0}, {"max_tokens": 40, "temperature": 0, "num_assistant_tokens": 3},
            {"max_tokens": 40, "temperature": 0, "assistant_confidence_threshold": 0.2}]

    def generate(engine: Engine, params: dict) -> dict[str, list[int]]:
        out: list[list] = []
        for prompt in prompts:
            engine.add(prompt, prompt, True, params, [], None, out)
        while engine.requests:
            engine.step(out)
        return {p: [i for u in out if u[0] == p and u[2] != "accepted" for i in u[1]] for p in prompts}

    expected = generate(plain, asks[0])
    assert all(len(ids) == 40 for ids in expected.values())
    for params in asks:
        assert generate(drafted, params) == expected


def test_lora_jobs_run_in_groups_and_match_genais_own_output() -> None:
    """GenAI batches one adapter set at a time: base and adapter jobs sent together each get what GenAI's own
    generate() gives with their adapters, and the adapter changes the answer."""
    import numpy as np
    import openvino as ov
    import openvino_genai as g

    models = Path(__file__).resolve().parents[3] / "models"
    llama, lora = str(models / "tiny-llama"), str(models / "tiny-llama-lora" / "adapter_model.safetensors")
    spec = EngineSpec(llama, "CPU", {"cache_size": 0}, {}, 2048, adapters={"tiny": {"path": lora, "alpha": 0.7}})
    engine = Engine(spec)
    out: list[list] = []
    jobs = {"base1": None, "lora1": "tiny", "base2": None, "lora2": "tiny"}
    for job, adapter in jobs.items():
        engine.add(job, "hello world the", True, {"max_tokens": 12, "temperature": 0, "adapter": adapter}, [], None,
                   out)
    # base1 runs; the rest wait behind the first job for another adapter, in arrival order
    assert list(engine.adapters.waiting) == ["lora1", "base2", "lora2"]
    while engine.requests or engine.adapters.waiting:
        engine.step(out)
    got = {job: [i for u in out if u[0] == job and u[2] != "accepted" for i in u[1]] for job in jobs}

    reference = g.ContinuousBatchingPipeline(llama, g.SchedulerConfig(), "CPU",
                                             {"adapters": g.AdapterConfig(g.Adapter(lora))})
    ids = ov.Tensor(np.asarray([engine.tokenize("hello world the", True)], dtype=np.int64))

    def own(adapters: g.AdapterConfig) -> list[int]:
        config = g.GenerationConfig(max_new_tokens=12)
        config.adapters = adapters
        return list(reference.generate([ids], [config])[0].m_generation_ids[0])

    adapted, base = own(g.AdapterConfig(g.Adapter(lora), 0.7)), own(g.AdapterConfig())
    assert adapted != base
    assert got == {"base1": base, "lora1": adapted, "base2": base, "lora2": adapted}
    refused: list[list] = []
    engine.add("nope", "hi", True, {"max_tokens": 2, "adapter": "other"}, [], None, refused)
    assert refused[0][2] == "error" and refused[0][3]["status"] == 400


def test_cancelling_the_batch_lets_the_waiting_adapter_group_in() -> None:
    """A job waiting for another adapter is cancelled without having run; cancelling the running one lets the next
    group in at once (the pipeline frees what the cancelled job held before it switches adapters)."""
    models = Path(__file__).resolve().parents[3] / "models"
    lora = str(models / "tiny-llama-lora" / "adapter_model.safetensors")
    engine = Engine(EngineSpec(str(models / "tiny-llama"), "CPU", {"cache_size": 0}, {}, 2048,
                               adapters={"tiny": {"path": lora, "alpha": 1.0}}))
    out: list[list] = []
    for job, adapter in (("base", None), ("gone", "tiny"), ("next", "tiny")):
        engine.add(job, "hello", True, {"max_tokens": 50, "temperature": 0, "adapter": adapter}, [], None, out)
    engine.step(out)
    engine.cancel("gone", out)
    assert ["gone", [], "cancelled", None] in [u[:4] for u in out]
    engine.cancel("base", out)
    assert set(engine.requests) == {"next"} and engine.adapters.active == "tiny"
    engine.stop(out)
def test_the_i_o_half_ending_the_last_choice_lets_the_waiting_adapter_group_in() -> None:
    """The I/O half ends choices itself (a stop string it matched): when it drops the batch's last one, the group
    waiting for another adapter goes in then, not at some later command (nothing else would come: the engine
    blocked for its next command while the waiting jobs' clients waited for them, until the watchdog)."""
    models = Path(__file__).resolve().parents[3] / "models"
    lora = str(models / "tiny-llama-lora" / "adapter_model.safetensors")
    engine = Engine(EngineSpec(str(models / "tiny-llama"), "CPU", {"cache_size": 0}, {}, 2048,
                               adapters={"tiny": {"path": lora, "alpha": 1.0}}))
    out: list[list] = []
    engine.add("base", "hello", True, {"max_tokens": 50, "temperature": 0, "n": 2}, [], None, out)
    engine.add("next", "hello", True, {"max_tokens": 50, "temperature": 0, "adapter": "tiny"}, [], None, out)
    engine.step(out)
    engine.cancel("base", out, index=0)
    engine.cancel("base", out, index=1)
    assert set(engine.requests) == {"next"} and not engine.adapters.waiting and engine.adapters.active == "tiny"
    engine.stop(out)


def _request(prompt_len: int, prefilled: bool = False) -> Request:
    return Request({}, 16, prompt_len, 1, False, False, False, prefilled=prefilled)


def test_a_prompt_longer_than_a_step_counts_only_what_it_still_has_to_prefill() -> None:
    # GenAI's split-fuse scheduler: a token per running sequence, the rest of the step's budget to waiting prompts.
    bare = Engine.__new__(Engine)
    bare.spec = SimpleNamespace(scheduler={"max_num_batched_tokens": 256, "dynamic_split_fuse": True})
    bare.requests = {"running": _request(40, prefilled=True), "a": _request(286), "b": _request(286)}
    bare._prefilled()
    assert (bare.requests["a"].computed, bare.requests["b"].computed) == (255, 0)
    bare._prefilled()
    assert (bare.requests["a"].computed, bare.requests["b"].computed) == (286, 224)


def test_an_engine_gone_idle_reports_what_it_holds_then(model_dir: Path) -> None:
    """After its last job (one ran out, one was cancelled) the engine frees their KV blocks and says so: the idle
    report reads 0 % where the last busy step read more, so an idle worker's gauge is not that step's figure."""
    spawn = multiprocessing.get_context("spawn")  # as the worker starts it: signals are the process's own
    commands, to_engine = spawn.Pipe(duplex=False)
    from_engine, outputs = spawn.Pipe(duplex=False)
    spec = EngineSpec(str(model_dir), "CPU", {"cache_size": 0}, {}, 8192)
    engine = spawn.Process(target=run, args=(commands, outputs, spec), daemon=True)
    engine.start()

    def until(wanted: str) -> list[dict]:
        seen = []
        while from_engine.poll(120):
            seen.append(orjson.loads(from_engine.recv_bytes()))
            if wanted in seen[-1]:
                return seen
        raise AssertionError(f"no {wanted!r} message from the engine: {seen}")

    assert until("ready")[-1]["ready"] and until("idle")  # loaded: it reports once before any job
    long, short = {"max_tokens": 400, "ignore_eos": True}, {"max_tokens": 12, "ignore_eos": True}
    to_engine.send_bytes(orjson.dumps([protocol.add_command("long", PROMPT, False, long, [], None, "chat"),
                                       protocol.add_command("short", PROMPT, False, short, [], None, "chat")]))
    busy = [m for m in until("u") if "u" in m]
    while not any(u[0] == "short" and u[2] == "length" for m in busy for u in m["u"]):
        busy += [m for m in until("u") if "u" in m]
    to_engine.send_bytes(orjson.dumps([protocol.cancel_command("long")]))
    seen = until("idle")
    last_busy = [m["s"] for m in busy + seen if m.get("s")][-1]
    assert last_busy[2] > 0  # the figure an idle worker used to keep showing
    assert seen[-1]["idle"][:2] == [0, 0] and seen[-1]["idle"][2] == 0.0, seen[-1]
    to_engine.send_bytes(orjson.dumps([protocol.stop_command()]))
    engine.join(60)
    assert engine.exitcode == 0


def test_a_thousand_cancels_and_continuations_leave_the_kv_cache_as_they_found_it(engine: Engine) -> None:
    """A soak of what a long-running worker sees: jobs cancelled after 0-3 steps and jobs continued from ids
    another engine generated (a takeover's resume), 16 at a time. Once idle, the engine holds no request and no
    KV block: nothing it ran has shrunk the cache it has for the next jobs."""
    engine.release()
    assert engine.pipe.get_metrics().cache_usage == 0.0
    out: list[list] = []
    for wave in range(63):  # 1,008 jobs
        for i in range(16):
            name, params = f"{wave}-{i}", {"max_tokens": 40, "ignore_eos": True}
            resume = {"generated": {"0": [28, 4, 1025 + i]}, "done": []} if i % 2 else None
            engine.add(name, PROMPT, False, params, [], resume, out)
        for _ in range(wave % 4):
            engine.step(out)
        for i in range(16):
            engine.cancel(f"{wave}-{i}", out)
    assert not engine.requests
    engine.release()
    metrics = engine.pipe.get_metrics()
    assert (metrics.requests, metrics.scheduled_requests, metrics.cache_usage) == (0, 0, 0.0)
    assert sum(1 for u in out if u[2] == "cancelled") == 1008
