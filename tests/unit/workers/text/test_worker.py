"""The worker's I/O half on the real engine's output (in-process, the default model), no Redis."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from common.jobs import Job, SamplingParams
from common.models.config import ModelConfig
from common.settings import Settings
from workers.engine.continuous import Engine
from workers.engine.protocol import EngineSpec
from workers.queue.publisher import Outbox
from workers.text.jobstate import RunningJob
from workers.text.worker import TextWorker

PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


class Collected:
    """Stands where the publisher would: keeps what each step would have sent."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def put(self, outbox: Outbox) -> None:
        for events in outbox.events.values():
            self.events.extend(events)


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Engine:
    return Engine(EngineSpec(str(model_dir), "CPU", {"cache_size": 0}, {}, 8192))


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
