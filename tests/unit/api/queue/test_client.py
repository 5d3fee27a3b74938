"""A response's jobs seen from the API: what a finished one leaves behind."""
from __future__ import annotations

import asyncio
import gc
import weakref
from types import SimpleNamespace
from typing import Any

from api.queue.client import Generation


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
        generation = Generation(client, [SimpleNamespace(id="job-1")], None, None)  # type: ignore[list-item]
        generation.watch(SilentClient())  # type: ignore[arg-type]
        await asyncio.sleep(0)  # the watcher waits on the client
        await generation.close()
        await asyncio.sleep(0)  # the watcher's cancellation runs
        freed = weakref.ref(generation)
        del generation
        assert freed() is None
    finally:
        gc.enable()
