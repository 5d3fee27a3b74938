"""The I/O half's side of the engine: start the engine process, send it commands, hear its steps, watch it.

Three ways an engine ends while the worker runs, told to `on_exit(kind, report)`:
- "broken": it reported a failed step (and which jobs were added since the last good one), then exited;
- "unresponsive": it had work and sent nothing for `watchdog_s` (a hung step), so it was killed;
- "crashed": its pipe closed with no report (a native crash, the OOM killer, a SIGKILL).
"""
from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import time
from collections.abc import Callable
from typing import Any

import orjson

from workers.engine import protocol
from workers.engine.pipe import EnginePipes
from workers.engine.protocol import EngineSpec, Updates

log = logging.getLogger("ovq.engine_client")

Target = Callable[[Any, Any, EngineSpec], None]


class EngineError(RuntimeError):
    pass


class EngineClient:
    def __init__(self, spec: EngineSpec, target: Target, on_message: Callable[[Updates, list[Any] | None], None],
                 on_exit: Callable[[str, dict[str, Any] | None], None], busy: Callable[[], bool],
                 watchdog_s: float, start_timeout_s: float,
                 on_idle: Callable[[list[Any]], None] | None = None) -> None:
        self.spec, self.target = spec, target
        self._on_idle = on_idle
        self._on_message, self._on_exit, self._busy = on_message, on_exit, busy
        self.watchdog_s, self.start_timeout_s = watchdog_s, start_timeout_s
        self._ctx = mp.get_context("spawn")
        self._process: Any = None
        self._pipes: EnginePipes | None = None
        self._pending: list[list[Any]] = []
        self._flush_scheduled = False
        self._ready = False  # commands wait in `_pending` while the engine (re)starts
        self._handshake: asyncio.Future[dict[str, Any]] | None = None
        self._report: dict[str, Any] | None = None
        self._killed = False
        self._stopping = False
        self._last_heard = time.monotonic()
        self._watchdog: asyncio.Task[None] | None = None
        self._replaced: asyncio.Future[None] | None = None  # set while `replace` waits for the old engine's end

    async def start(self) -> None:
        """Start the engine process and wait for its handshake; EngineError when it cannot open its device."""
        loop = asyncio.get_running_loop()
        if self._process is not None:  # the engine this one replaces: reap it (no zombie left behind)
            await loop.run_in_executor(None, self._process.join, 5)
        commands_in, commands_out = self._ctx.Pipe(duplex=False)
        outputs_in, outputs_out = self._ctx.Pipe(duplex=False)
        self._process = self._ctx.Process(target=self.target, args=(commands_in, outputs_out, self.spec),
                                          daemon=True, name="ovq-engine")
        self._report, self._killed, self._stopping = None, False, False  # (started again after a `stop`: a wake)
        self._handshake = loop.create_future()
        self._process.start()
        pipes = EnginePipes()
        await pipes.open(outputs_in.fileno(), commands_out.fileno(), self._on_frame, self._on_close)
        for end in (commands_in, outputs_out, commands_out, outputs_in):
            end.close()
        self._pipes = pipes
        try:
            ready = await asyncio.wait_for(self._handshake, self.start_timeout_s)
        except asyncio.TimeoutError:
            self._kill()
            raise EngineError(f"the engine did not start within {self.start_timeout_s:.0f}s") from None
        if not ready.get(protocol.READY):
            raise EngineError(ready.get(protocol.WHY) or "the engine could not start")
        self._ready = True
        self._last_heard = time.monotonic()
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = loop.create_task(self._watch(), name="engine-watchdog")
        self._flush()

    def send(self, command: list[Any]) -> None:
        """Queue a command (`protocol.add_command`, `cancel_command`); all commands of one event-loop turn go to
        the engine as one message."""
        if not self._pending and time.monotonic() - self._last_heard > self.watchdog_s:
            self._last_heard = time.monotonic()  # idle until now: the watchdog counts from this command
        self._pending.append(command)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._ready or not self._pending or self._pipes is None:
            return
        commands, self._pending = self._pending, []
        if not self._pipes.send(orjson.dumps(commands)):
            self._pending = commands + self._pending  # the engine is going; on_exit decides their fate

    def drop_pending(self) -> None:
        self._pending = []

    # ---- hearing the engine ----------------------------------------------------------------------------
    def _on_frame(self, payload: bytes) -> None:
        self._last_heard = time.monotonic()
        message = orjson.loads(payload)
        if self._handshake is not None and not self._handshake.done():
            self._handshake.set_result(message)
        elif protocol.BROKEN in message:
            self._report = message
        elif protocol.IDLE in message:
            if self._on_idle is not None:
                self._on_idle(message[protocol.IDLE])
        else:
            self._on_message(message[protocol.UPDATES], message[protocol.STATS])

    def _on_close(self) -> None:
        if self._handshake is not None and not self._handshake.done():
            self._handshake.set_result(protocol.ready("the engine process exited while starting"))
        self._detach()
        if self._replaced is not None:  # ended on purpose by `replace`: no failure to report
            if not self._replaced.done():
                self._replaced.set_result(None)
            return
        if self._stopping:
            return
        kind = "broken" if self._report else "unresponsive" if self._killed else "crashed"
        self._on_exit(kind, self._report)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.watchdog_s / 4))
            if not self._ready or self._stopping or not self._busy():
                continue
            silent = time.monotonic() - self._last_heard
            if silent > self.watchdog_s:
                log.error("the engine sent nothing for %.0fs while it had work (engine_watchdog_s %.0f); "
                          "killing it", silent, self.watchdog_s)
                self._kill()

    async def replace(self, spec: EngineSpec, timeout: float = 10.0) -> None:
        """End this engine process and start one with `spec` (EngineError if it cannot start). Whatever ran on the
        old one is the caller's to add again: nothing is answered for it."""
        self._replaced = asyncio.get_running_loop().create_future()
        # Commands from now on wait for the new engine: the old one's pipe stays open until it is dead, and what
        # went into it meanwhile would never be answered (a job added then was stuck for good).
        self._ready = False
        try:
            if self._process is not None and self._process.is_alive():
                self._process.kill()  # no state to save: the caller re-adds its jobs from what they have sent
                await asyncio.wait_for(self._replaced, timeout)
            else:
                self._detach()
        finally:
            self._replaced = None
        self.spec = spec
        await self.start()

    def _kill(self) -> None:
        if self._process is not None and self._process.is_alive():
            self._killed = True
            self._process.kill()

    @property
    def alive(self) -> bool:
        return self._ready and self._process is not None and self._process.is_alive()

    def _detach(self) -> None:
        self._ready = False
        if self._pipes is not None:
            self._pipes.close()
            self._pipes = None

    async def stop(self, timeout: float = 10.0) -> None:
        """End the engine process (its weights and KV cache go with it); `start` may start a new one later."""
        self._stopping = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._pipes is not None:
            self._pipes.send(orjson.dumps([protocol.stop_command()]))
        if self._process is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._process.join, timeout)
            if self._process.is_alive():
                self._process.kill()
                await asyncio.get_running_loop().run_in_executor(None, self._process.join, 5)
        self._detach()
