"""The speech worker's job lifecycle on the tiny SpeechT5 (no Redis: what it sends stays in its publisher's queue)."""
from __future__ import annotations

import asyncio
from pathlib import Path

from common.jobs import Job, SpeechParams
from common.models.config import ModelConfig
from common.settings import Settings
from workers.audio.worker import SpeechWorker
from workers.queue.publisher import Outbox

MODELS = Path(__file__).resolve().parents[3] / "models"


def sent(worker: SpeechWorker) -> list[dict]:
    events = []
    while not worker.publisher._queue.empty():
        outbox = worker.publisher._queue.get_nowait()
        events += [event for batch in outbox.events.values() for event in batch]
    return events


async def test_a_cancel_during_synthesis_drops_the_speech_once_the_call_returns() -> None:
    # Text2SpeechPipeline.generate takes no callback, so the call runs to its end; then the speech is neither
    # encoded nor stored (storing would need Redis, which this worker cannot reach: an error, not a cancel).
    worker = SpeechWorker(Settings(redis_url="redis://127.0.0.1:1"), ModelConfig(name="t", path=MODELS /
                                                                                   "tiny-speecht5"), "CPU")
    await asyncio.to_thread(worker.pipes.load)
    job = Job(id="j1", model="t", device="CPU", kind="speech", prompt="Hello there.", reply_to="api",
              speech=SpeechParams(task="speak"))
    synthesize = worker.pipes.speak

    def speak_then_cancel(text: str, params: SpeechParams) -> tuple:
        result = synthesize(text, params)
        worker.cancel_running("j1")  # as a cancel arriving while generate() runs
        return result

    worker.pipes.speak = speak_then_cancel  # type: ignore[method-assign]
    worker._start(b"1-0", job, Outbox())
    await asyncio.gather(*worker._tasks)
    (event,) = sent(worker)
    assert (event["job"], event["type"]) == ("j1", "cancelled") and not worker.running
