"""Stopping a background task for certain.

On Python 3.11 one `task.cancel()` is not enough to end a retry loop: `asyncio.wait_for` returns (or raises) the
inner result when a cancel lands as that result arrives, and the cancel is gone. A loop that retries Redis then
catches the ConnectionError it got instead and sleeps into its next try, for ever. Seen in CI: the API's event
hub kept retrying a stopped Redis after SIGTERM until honcho SIGKILLed the process. `stop` cancels again until the
task has ended, within a bound.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

log = logging.getLogger("ovq.tasks")

RECANCEL_S = 0.05
STOP_S = 3.0


async def stop(tasks: Iterable[asyncio.Task] | asyncio.Task | None, timeout_s: float = STOP_S) -> bool:
    """Cancel `tasks` until each has ended, for up to `timeout_s`; True when all did. A task that outlives the
    bound is left running (the process is stopping) and named in a log line."""
    if tasks is None:
        return True
    pending = {tasks} if isinstance(tasks, asyncio.Task) else set(tasks)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while pending:
        left = deadline - loop.time()
        if left <= 0:
            log.warning("task(s) %s did not stop within %.1fs; leaving them", sorted(t.get_name() for t in pending),
                        timeout_s)
            return False
        for task in pending:
            task.cancel()
        done, pending = await asyncio.wait(pending, timeout=min(RECANCEL_S, left))
        for task in done:
            if not task.cancelled() and task.exception() is not None:  # retrieved, and said once
                log.warning("task %s ended with %r while stopping", task.get_name(), task.exception())
    return True
