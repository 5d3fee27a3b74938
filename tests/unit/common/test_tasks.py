import asyncio
import logging

import pytest

from common import tasks


async def _retry_loop(attempts: list[asyncio.Future]) -> None:
    """A Redis retry loop as the API's event hub had it: each try is an `asyncio.wait_for`; a failed try sleeps
    and tries again."""
    while True:
        attempt = asyncio.get_running_loop().create_future()
        attempts.append(attempt)
        try:
            await asyncio.wait_for(attempt, 5)
        except ConnectionError:
            await asyncio.sleep(0.2)


async def test_a_retry_loop_whose_cancel_lands_with_a_failed_try_still_stops() -> None:
    attempts: list[asyncio.Future] = []
    loop = asyncio.create_task(_retry_loop(attempts), name="retrying")
    await asyncio.sleep(0)
    # The try fails in the same turn as the stop: Python 3.11's wait_for raises the ConnectionError, not the cancel.
    attempts[-1].set_exception(ConnectionError("Redis stopped"))
    stopping = asyncio.create_task(tasks.stop(loop, timeout_s=2))
    assert await stopping and loop.cancelled()


async def test_a_task_that_never_ends_is_left_after_the_bound_and_named(caplog: pytest.LogCaptureFixture) -> None:
    stubborn_for = [True]

    async def stubborn() -> None:
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if not stubborn_for[0]:
                    raise

    task = asyncio.create_task(stubborn(), name="stubborn")
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING, logger="ovq.tasks"):
        assert not await tasks.stop(task, timeout_s=0.2)
    assert "stubborn" in caplog.text and not task.done()
    stubborn_for[0] = False
    assert await tasks.stop(task, timeout_s=1)


async def test_nothing_to_stop_and_ended_tasks_are_fine() -> None:
    async def fails() -> None:
        raise ValueError("ended badly")

    ended = asyncio.create_task(fails())
    await asyncio.sleep(0)
    assert await tasks.stop(None) and await tasks.stop([ended]) and await tasks.stop([])
