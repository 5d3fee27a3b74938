"""A response's jobs seen from the API: what leaving one does, its express lane, what a finished one leaves behind."""
from __future__ import annotations

import asyncio
import gc
import weakref
from types import SimpleNamespace
from typing import Any

import pytest

from api.queue.client import Generation
from common.errors import OvqError
from common.events import ACCEPTED
from common.settings import Settings


class SilentClient:
    """A client that neither sends nor leaves: its disconnect watcher waits until cancelled."""

    def __init__(self) -> None:
        self.never = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        await self.never.wait()
        return {"type": "http.disconnect"}


async def test_a_closed_generation_is_freed_without_the_cycle_collector() -> None:
    """The cancelled watcher's frames hold the generation: if it held the watcher, only a full GC would free it
    (every request's objects, under load a quarter of the API's CPU)."""
    hub = SimpleNamespace(register=lambda job_id, inbox: None, unregister=lambda job_id: None)
    client: Any = SimpleNamespace(hub=hub)
    gc.disable()
    try:
        generation = Generation(client, [SimpleNamespace(id="job-1", model="m")], None, None)  # type: ignore[list-item]
        generation.watch(SilentClient())  # type: ignore[arg-type]
        await asyncio.sleep(0)  # the watcher waits on the client
        await generation.close()
        await asyncio.sleep(0)  # the watcher's cancellation runs
        freed = weakref.ref(generation)
        del generation
        assert freed() is None
    finally:
        gc.enable()


class Jobs:
    """A hub, registry and client as a generation uses them: each job is accepted as soon as it is queued."""

    def __init__(self) -> None:
        self.inboxes: dict[str, Any] = {}
        self.cancelled: list[str] = []
        self.hub = SimpleNamespace(register=self.inboxes.__setitem__, unregister=self.inboxes.pop, channel=str,
                                   listen=self.listen)
        self.registry = SimpleNamespace(enqueue=self.enqueue)

    async def listen(self, model: str) -> bool:
        return True

    async def enqueue(self, servable: Any, job: Any, owner: str | None = None) -> str:
        self.inboxes[job.id].push({"type": ACCEPTED, "job": job.id, "seq": 0, "worker": "w", "prompt_tokens": 1,
                                   "queue_ms": 0.0})
        return "CPU"

    async def cancel(self, job_ids: list[str], model: str = "") -> None:
        self.cancelled += job_ids


def generation(jobs: Jobs) -> Generation:
    return Generation(jobs, [SimpleNamespace(id="job-1", model="m")], None, None)  # type: ignore[arg-type,list-item]


async def test_leaving_the_generation_cancels_its_unfinished_jobs() -> None:
    jobs = Jobs()
    async with generation(jobs) as running:
        assert running.accepted.keys() == {"job-1"}
    assert jobs.cancelled == ["job-1"] and not jobs.inboxes


async def test_a_generation_handed_to_a_stream_is_closed_by_the_stream() -> None:
    jobs = Jobs()
    async with generation(jobs) as running:
        running.hand_over()
    assert jobs.cancelled == [] and "job-1" in jobs.inboxes
    await running.close()  # the stream's end
    assert jobs.cancelled == ["job-1"]


def test_the_express_lane_is_there_only_inside_and_only_with_a_direct_write() -> None:
    running = generation(Jobs())
    with running.express(lambda write: lambda event: write(b"x")):
        assert running.inbox.express is None  # this server offers no direct write: every event takes the loop
    written: list[bytes] = []
    running.writes_to(lambda data: written.append(data) is None)
    delta = {"type": "delta", "job": "job-1", "seq": 1, "text": "a", "tokens": 1}
    with pytest.raises(RuntimeError), running.express(lambda write: lambda event: write(b"x")):
        running.inbox.push(delta)  # type: ignore[arg-type]
        raise RuntimeError("the stream failed")
    assert written == [b"x"] and running.inbox.express is None
    running.inbox.push(delta)  # type: ignore[arg-type]
    assert running.inbox.events == [delta]


async def test_a_job_whose_worker_died_waits_for_another_worker_to_continue_it_within_the_queue_timeout() -> None:
    jobs = Jobs()
    alive = {"w": False, "w2": True}

    async def workers_alive(workers: list[str]) -> list[bool]:
        return [alive[w] for w in workers]

    jobs.settings = Settings(first_event_check_s=0, queue_timeout_s=30)  # type: ignore[attr-defined]
    jobs.workers_alive = workers_alive  # type: ignore[attr-defined]
    async with generation(jobs) as running:
        await running._check()  # its worker is dead: no error yet, another may continue the job
        running.inbox.push({"type": ACCEPTED, "job": "job-1", "seq": 9, "worker": "w2", "prompt_tokens": 1,
                            "queue_ms": 0.0})
        assert await running.events() == []  # the second `accepted` is no event for the response
        assert running.accepted["job-1"]["worker"] == "w2"
        alive["w2"] = False
        await running._check()
        running._orphaned_since -= 29  # type: ignore[operator]
        await running._check()  # still within the queue timeout
        running._orphaned_since -= 2  # type: ignore[operator]
        with pytest.raises(OvqError) as failed:
            await running._check()
    assert failed.value.status == 500 and failed.value.body.code == "worker_died"
    assert jobs.cancelled == ["job-1"]


class Waiting(Jobs):
    """Jobs no worker takes: each waits in its stream (no live worker) until withdrawn."""

    def __init__(self) -> None:
        super().__init__()
        self.withdrawn: list[str] = []
        self.registry = SimpleNamespace(enqueue=self.enqueue, withdraw=self.withdraw)
        self.settings = Settings(first_event_check_s=3600, queue_timeout_s=0)

    async def enqueue(self, servable: Any, job: Any, owner: str | None = None) -> Any:
        return SimpleNamespace(live=False)

    async def withdraw(self, queued: Any, job_id: str, model: str) -> None:
        self.withdrawn.append(job_id)


async def test_a_queue_timeout_takes_the_job_off_its_stream_before_the_error_goes_out() -> None:
    """A stream writes its error event before `close()` runs: the job must have left its stream by then, or a worker
    that comes up meanwhile runs it for nobody (CI once read the stream's end and still found the job queued)."""
    jobs = Waiting()
    running = generation(jobs)
    running.holds = False  # a stream's: entering returns while its job waits
    async with running:
        with pytest.raises(OvqError) as failed:
            await running._check()
        assert failed.value.status == 503 and jobs.withdrawn == ["job-1"] and jobs.cancelled == ["job-1"]
    assert jobs.withdrawn == ["job-1"] and jobs.cancelled == ["job-1"]  # `close()` had nothing left to withdraw
