"""The I/O half's side of the engine pipe: start the engine process, send it commands, hear its steps."""
from __future__ import annotations

import asyncio
import multiprocessing as mp
from collections.abc import Callable
from typing import Any

import orjson

from workers.engine import EngineSpec

Outputs = list[list[Any]]
Target = Callable[[Any, EngineSpec], None]


class EngineError(RuntimeError):
    pass


class EngineClient:
    def __init__(self, spec: EngineSpec, target: Target, on_outputs: Callable[[Outputs], None],
                 on_exit: Callable[[], None]) -> None:
        self.spec, self.target = spec, target
        self._on_outputs = on_outputs
        self._on_exit = on_exit
        self._ctx = mp.get_context("spawn")
        self._process: Any = None
        self._conn: Any = None
        self._pending: list[list[Any]] = []
        self._flush_scheduled = False
        self._ready = False  # commands wait in `_pending` while the engine (re)starts

    async def start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._process = self._ctx.Process(target=self.target, args=(child, self.spec), daemon=True,
                                          name="ovq-engine")
        self._process.start()
        child.close()
        self._conn = parent
        loop = asyncio.get_running_loop()
        ready = orjson.loads(await loop.run_in_executor(None, parent.recv_bytes))
        if not ready["ready"]:
            raise EngineError(ready["error"])
        loop.add_reader(parent.fileno(), self._readable)
        self._ready = True
        self._flush()

    def send(self, command: list[Any]) -> None:
        """Queue a command; all commands of one event-loop turn go to the engine as one message."""
        self._pending.append(command)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._ready or not self._pending:
            return
        commands, self._pending = self._pending, []
        try:
            self._conn.send_bytes(orjson.dumps(commands))
        except OSError:  # the engine just died: its jobs are failed by on_exit; these go to the next one
            self._pending = commands + self._pending

    def drop_pending(self) -> None:
        self._pending = []

    def _readable(self) -> None:
        try:
            outputs = orjson.loads(self._conn.recv_bytes())
        except (EOFError, OSError):
            self._detach()
            self._on_exit()
            return
        self._on_outputs(outputs)

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def _detach(self) -> None:
        self._ready = False
        if self._conn is not None:
            asyncio.get_running_loop().remove_reader(self._conn.fileno())
            self._conn.close()
            self._conn = None

    async def stop(self) -> None:
        if self._conn is not None and self.alive:
            self._conn.send_bytes(orjson.dumps([["stop"]]))
        if self._conn is not None:
            self._detach()
        if self._process is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._process.join, 5)
            if self._process.is_alive():
                self._process.kill()
