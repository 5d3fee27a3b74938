"""The worker's I/O half on the real engine's output (in-process, the default model), no Redis."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import patch

import pytest

from common.jobs import Job, SamplingParams
from common.models.config import ModelConfig
from common.settings import Settings
from tests.precision import F32
from workers.engine import protocol
from workers.engine.continuous import Engine
from workers.engine.protocol import EngineSpec
from workers.queue.publisher import Outbox
from workers.queue.reclaim import Continued
from workers.text.detokenizer import ByteTable
from workers.text.jobstate import RunningJob
from workers.text.progress import ChoiceProgress, Progress, end_record, ids_record
from workers.text.servable_info import ServableInfo
from workers.text.worker import TextWorker

PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


class Collected:
    """Stands where the publisher would: keeps what each step would have sent."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.records: dict[str, bytes] = {}  # each job's record of generated ids, as Redis would hold it

    def put(self, outbox: Outbox) -> None:
        for events in outbox.events.values():
            self.events.extend(events)
        for job, records in outbox.records.items():
            if job not in outbox.forgotten:
                self.records[job] = self.records.get(job, b"") + b"".join(records)
        for job in outbox.forgotten:
            self.records.pop(job, None)


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Engine:
    # f32, pinned: a continued job's greedy text is the uninterrupted run's only where the new engine's prefill of
    # the recorded ids rounds as the old one's step-by-step decoding did (bf16 flips a near-tie: precision.md).
    return Engine(EngineSpec(str(model_dir), "CPU", {"cache_size": 0}, F32, 8192))


@pytest.fixture
def worker(model_dir: Path) -> TextWorker:
    model = ModelConfig(name="smol", path=str(model_dir), cache_size=0)
    worker = TextWorker(Settings(redis_url="redis://127.0.0.1:1/0", stream_interval_ms=0), model, "CPU")
    worker.engine.send = lambda command: None  # type: ignore[method-assign]  # the engine runs in this test
    worker.publisher = Collected()  # type: ignore[assignment]
    return worker


def test_a_plain_jobs_tokens_take_the_fast_path_with_the_same_text(
        engine: Engine, worker: TextWorker, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's short updates go through `RunningJob.more` (no batched pass); the text is the decoder's."""
    taken: list[list[int]] = []
    more = RunningJob.more

    def counted(self: RunningJob, choice: Any, ids: list[int], text: str, now: float) -> Any:
        taken.append(ids)
        return more(self, choice, ids, text, now)

    monkeypatch.setattr(RunningJob, "more", counted)
    job = Job(model="smol", device="CPU", kind="chat", prompt=PROMPT, reply_to="api-1",
              params=SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
    worker._start(b"1-1", job, Outbox())
    out: list[list[Any]] = []
    engine.add(job.id, PROMPT, False, job.params.model_dump(), [], None, out)
    worker._on_message(out, None)
    ids: list[int] = []
    while engine.requests:
        out = []
        engine.step(out)
        ids += [i for u in out for i in u[1]]
        worker._on_message(out, engine.stats())
    text = "".join(e.get("text", "") for e in worker.publisher.events if e["type"] == "delta")  # type: ignore
    assert text == engine.tokenizer.decode(ids, skip_special_tokens=True)
    assert len(ids) == 10 and len(taken) >= 7  # all but the first token or two and the final update
    assert not worker.running


# ---- a job continued by another worker (its own died) -------------------------------------------------------------

@pytest.fixture(scope="module")
def info(model_dir: Path) -> ServableInfo:
    return ServableInfo.load(model_dir, ModelConfig(name="smol", path=str(model_dir), cache_size=0), "CPU")


@pytest.fixture(scope="module")
def byte_table(info: ServableInfo) -> ByteTable | None:
    return ByteTable.build(info.tokenizer)


def fresh_worker(model_dir: Path, commands: list[list[Any]], info: ServableInfo,
                 byte_table: ByteTable | None) -> TextWorker:
    model = ModelConfig(name="smol", path=str(model_dir), cache_size=0)
    # Loaded and built once (the byte table reads the whole vocabulary, half a second each time); neither changes.
    with patch.object(ServableInfo, "load", lambda *args: info), \
            patch.object(ByteTable, "build", lambda *args: byte_table):
        worker = TextWorker(Settings(redis_url="redis://127.0.0.1:1/0", stream_interval_ms=0), model, "CPU")
    worker.engine.send = commands.append  # type: ignore[method-assign]  # the engine runs in this test
    worker.publisher = Collected()  # type: ignore[assignment]
    return worker


def run(engine: Engine, worker: TextWorker, commands: list[list[Any]], steps: int | None = None) -> None:
    """Feed the worker's commands to the engine and its output back, for `steps` steps (None: to the end)."""
    done = 0
    while (worker.running or commands) and (steps is None or done < steps):
        out: list[list[Any]] = []
        sent, commands[:] = list(commands), []
        protocol.apply(engine, sent, out)
        if out:
            worker._on_message(out, None)
        if not engine.requests:
            continue
        out = []
        engine.step(out)
        done += 1
        worker._on_message(out, engine.stats())


def client_view(events: list[dict[str, Any]]) -> dict[str, Any]:
    """What a client makes of a job's events: each choice's text and log-probabilities, finish reasons, usage."""
    deltas = [e for e in events if e["type"] == "delta"]
    n = 1 + max((e.get("index", 0) for e in deltas), default=0)
    done = [e for e in events if e["type"] == "done"]
    return {"text": ["".join(e["text"] for e in deltas if e.get("index", 0) == i) for i in range(n)],
            "tokens": [[t["token"] for e in deltas if e.get("index", 0) == i for t in e.get("logprobs") or ()]
                       for i in range(n)],
            "logprobs": [[t["logprob"] for e in deltas if e.get("index", 0) == i for t in e.get("logprobs") or ()]
                         for i in range(n)],
            "finish": [e.get("finish_reason") for e in deltas if e.get("finish_reason")],
            "usage": done[0]["usage"] if done else None, "ended": [e["type"] for e in events if e["type"] in
                                                                    ("done", "error", "cancelled")]}


TAKEOVER_CASES = {
    "plain": {},
    "stop string": {"stop": ["STOP"]},  # replaced below by a piece of the answer itself
    "two choices with log-probabilities": {"n": 2, "logprobs": 0},
}


@pytest.mark.parametrize("case", list(TAKEOVER_CASES))
def test_a_job_continued_by_another_worker_streams_on_exactly(engine: Engine, model_dir: Path, info: ServableInfo,
                                                              byte_table: ByteTable | None, case: str) -> None:
    """A worker runs the job some steps and dies; another replays what it recorded and goes on: the client sees
    the text (log-probabilities, finish, usage) of an uninterrupted run, nothing lost or repeated, in order."""
    params = {"max_tokens": 14, "temperature": 0, "ignore_eos": True, **TAKEOVER_CASES[case]}
    job = Job(model="smol", device="CPU", kind="chat", prompt=PROMPT, reply_to="api-1",
              params=SamplingParams(**params))
    commands: list[list[Any]] = []
    alone = fresh_worker(model_dir, commands, info, byte_table)
    alone._start(b"1-1", job, Outbox())
    run(engine, alone, commands)
    reference = client_view(alone.publisher.events)  # type: ignore[attr-defined]
    if case == "stop string":  # a stop string that spans tokens, in the middle of the answer
        text = reference["text"][0]
        params["stop"] = [text[len(text) // 2 - 1: len(text) // 2 + 2]]
        job = job.model_copy(update={"params": SamplingParams(**params)})
        alone = fresh_worker(model_dir, commands, info, byte_table)
        alone._start(b"1-1", job, Outbox())
        run(engine, alone, commands)
        reference = client_view(alone.publisher.events)  # type: ignore[attr-defined]
        assert reference["finish"] == ["stop"]
    for kill_after in (1, 4, 7, 10):
        first = fresh_worker(model_dir, commands, info, byte_table)
        first._start(b"1-1", job, Outbox())
        run(engine, first, commands, steps=kill_after)
        seen = list(first.publisher.events)  # type: ignore[attr-defined]
        record = first.publisher.records.get(job.id)  # type: ignore[attr-defined]
        if job.id in engine.requests:  # the worker dies: its engine with it
            engine.cancel(job.id, [])
        if record is None:  # it had ended (or sent nothing): nothing to continue
            continue
        second = fresh_worker(model_dir, commands, info, byte_table)
        second._continuing[job.id] = Continued(b"1-1", job.to_fields(), record, seen[0]["prompt_tokens"])
        outbox = Outbox()  # where `admit_jobs` would have it: the `accepted` goes out first
        second._start(b"1-1", job, outbox)
        second.publisher.put(outbox)
        run(engine, second, commands)
        later = second.publisher.events  # type: ignore[attr-defined]
        assert later[0]["type"] == "accepted" and later[0]["worker"] == second.id
        events = seen + later
        assert [e["seq"] for e in events] == sorted({e["seq"] for e in events}), f"killed after {kill_after}"
        view = client_view(events)
        # The new engine prefills what the old one had decoded step by step: the same tokens, log-probabilities
        # a few hundredths apart (measured up to 0.03 on the default model).
        for got, want in zip(view.pop("logprobs"), reference["logprobs"], strict=True):
            assert got == pytest.approx(want, abs=0.1), f"killed after {kill_after} steps"
        assert view == {k: v for k, v in reference.items() if k != "logprobs"}, f"killed after {kill_after} steps"


def test_a_record_reads_back_its_choices_ends_and_order() -> None:
    data = (ids_record(0, 2, [5, 6]) + ids_record(1, 3, [9]) + ids_record(0, 4, [7]) + end_record(1, 5, "length", 3)
            + ids_record(0, 6, []))
    progress = Progress.read(data, logprobs=False)
    assert progress.seq == 6
    assert progress.choices[0] == ChoiceProgress([5, 6, 7])
    assert progress.choices[1] == ChoiceProgress([9], finish="length", tokens=3)
    with_logprobs = Progress.read(ids_record(0, 1, [1, 2], [-0.5, -1.25]), logprobs=True)
    assert with_logprobs.choices[0].logprobs == [-0.5, -1.25]
    with pytest.raises(ValueError):
        Progress.read(data[:-2], logprobs=False)


def test_an_idle_engines_report_replaces_the_last_busy_steps_stats(engine: Engine, model_dir: Path,
                                                                     info: ServableInfo,
                                                                     byte_table: ByteTable | None) -> None:
    """The last job's final update comes with its step's stats (KV cache still in use); the engine's idle report
    after it is what an idle worker shows (metrics, heartbeat), unless a job was sent to the engine meanwhile."""
    commands: list[list[Any]] = []
    worker = fresh_worker(model_dir, commands, info, byte_table)
    job = Job(model="smol", device="CPU", kind="chat", prompt=PROMPT, reply_to="api-1",
              params=SamplingParams(max_tokens=3, temperature=0))
    worker._start(b"1-1", job, Outbox())
    run(engine, worker, commands)
    worker._on_message([], [1, 1, 12.5, 0])  # the figure a busy step left behind
    assert not worker.running and worker.engine_stats() == [1, 1, 12.5, 0]
    worker._on_engine_idle([0, 0, 0.0, 0])
    assert worker.engine_stats() == [0, 0, 0.0, 0]
    worker._start(b"1-2", job.model_copy(update={"id": "another"}), Outbox())
    worker._on_message([], [1, 1, 6.0, 0])
    worker._on_engine_idle([0, 0, 0.0, 0])  # sent before the engine saw the new job: stale
    assert worker.running and worker.engine_stats() == [1, 1, 6.0, 0]
    engine.cancel("another", [])


def test_a_job_held_after_the_adapters_were_read_waits_for_the_next_read(worker: TextWorker) -> None:
    """Its adapter may have been loaded after that read: it is not ended a 404 as unloaded (CI saw one for an
    adapter loaded a moment before); a job held before the read whose adapter the read lacks is."""
    early, late = (Job(model="smol", device="CPU", kind="completion", prompt="x", reply_to="api",
                       params=SamplingParams(adapter="stays")) for _ in range(2))
    worker.running = {j.id: SimpleNamespace(job=j) for j in (early, late)}  # type: ignore[misc]
    worker._held, worker._held_since = {early.id: None, late.id: None}, {early.id: 1.0, late.id: 3.0}
    ended: list[tuple[str, int]] = []
    worker._end = lambda state, status, outbox, error=None: ended.append((state.job.id, error["status"]))  # type: ignore[method-assign,assignment]
    worker._poke.clear()
    worker._release_held({}, read_at=2.0)
    assert ended == [(early.id, 404)]
    assert list(worker._held) == [late.id] and worker._poke.is_set(), "the late one waits for the next read"
