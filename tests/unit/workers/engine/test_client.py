"""workers/engine/client.py against a real engine process (a small target that answers each add after a pause)."""

from __future__ import annotations

import asyncio
import time
from multiprocessing.connection import Connection

import orjson

from workers.engine import protocol
from workers.engine.client import EngineClient
from workers.engine.protocol import EngineSpec

ANSWER_AFTER_S = 0.5


def slow_engine(commands: Connection, outputs: Connection, spec: EngineSpec) -> None:
    """Accepts each added job, ANSWER_AFTER_S after it came (a step's time: the engine can die in between)."""
    outputs.send_bytes(orjson.dumps(protocol.ready()))
    while True:
        try:
            batch = orjson.loads(commands.recv_bytes())
        except EOFError:
            return
        time.sleep(ANSWER_AFTER_S)
        updates = [protocol.accepted(command[1], 1) for command in batch if command[0] == protocol.ADD]
        outputs.send_bytes(orjson.dumps(protocol.report(updates)))


async def test_a_job_added_while_the_engine_is_replaced_reaches_the_new_engine() -> None:
    """An add sent after `replace` killed the old engine, before its pipe closed, went into the dying engine's pipe
    and was never answered: a request stuck until its client gave up (CI's LoRA soak: one base-model request timed
    out while the workers rebuilt their engines). It waits for the new engine instead."""
    heard: list[str] = []
    client = EngineClient(
        EngineSpec("/none", "CPU", {}, {}, 0),
        slow_engine,
        lambda updates, stats: heard.extend(u[0] for u in updates),
        lambda kind, report: None,
        lambda: False,
        watchdog_s=60,
        start_timeout_s=60,
    )
    await client.start()
    process = client._process
    loop = asyncio.get_running_loop()
    process.kill, kill = (lambda: loop.call_later(0.2, kill)), process.kill  # a SIGKILL that lands 0.2 s later
    replacing = asyncio.create_task(client.replace(client.spec))
    await asyncio.sleep(0.05)  # `replace` has "killed" the old engine and waits for its end
    client.send(protocol.add_command("late", "hi", True, {}, [], None, "chat"))
    await replacing
    deadline = time.monotonic() + 10
    while "late" not in heard and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await client.stop(timeout=5)
    assert heard == ["late"]
