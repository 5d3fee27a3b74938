"""Hollow workers, for benchmarks only: K real text-worker I/O halves in one process, each with a simulated engine
(`simengine.run`) in a thread behind real OS pipes, so a few processes hold a fleet of hundreds (issue 40; the idea
of kubemark's hollow nodes).

Nothing in the product is changed: the text worker is handed `simengine.run` as its engine target (the seam is
`workers.text.worker.engine_target`), and each worker's `EngineClient` a context whose `Process` is a thread
(`ThreadContext`), so the pipe's framing, the handshake, the watchdog and the stop are the real ones. The model
directory's tokenizer and card are loaded once and shared (`ServableInfo.load`, memoised here).

  python benchmarks/fleetsim/hollow.py --model NAME --count K            # K workers until SIGTERM / SIGINT
  python benchmarks/fleetsim/hollow.py --model NAME --churn N [--at-once M] [--hold S]
      N starts and stops, M at a time: each worker starts, heartbeats once, runs S seconds more, drains and stops.
The environment is a worker's (REDIS_URL, OVQ_CONFIG, OVQ_KEY_PREFIX, ...); OVQ_SIM_PROFILE picks the profile.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import multiprocessing.connection
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import uvloop

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import simengine  # noqa: E402

from common.models.sources import find_model  # noqa: E402
from common.settings import Settings  # noqa: E402
from workers.text import worker as text_worker  # noqa: E402
from workers.text.servable_info import ServableInfo  # noqa: E402

FLEET: list[Any] = []


class ThreadProcess:
    """What `EngineClient` needs of a process, as a thread: it closes its own ends of the pipes once started, so
    the thread is given duplicates of them."""

    def __init__(self, target: Any, args: tuple[Any, ...], daemon: bool = True, name: str = "") -> None:
        self._target, self._args, self._name = target, args, name
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        args = tuple(multiprocessing.connection.Connection(os.dup(a.fileno()))
                     if isinstance(a, multiprocessing.connection.Connection) else a for a in self._args)
        self._thread = threading.Thread(target=self._run, args=args, daemon=True, name=self._name)
        self._thread.start()

    def _run(self, commands: Any, outputs: Any, spec: Any) -> None:
        try:
            self._target(commands, outputs, spec)
        except OSError:
            pass  # the I/O half closed its ends: as a process would, the engine ends
        finally:
            commands.close()
            outputs.close()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def kill(self) -> None:
        pass  # a thread cannot be killed; the simulated engine never hangs


class ThreadContext:
    Pipe = staticmethod(multiprocessing.Pipe)
    Process = ThreadProcess


class HollowWorker(text_worker.TextWorker):
    """A text worker whose engine is simulated; a signal to any one stops the whole host (each `run` installs its
    own handler, so only the last one's would fire)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.engine._ctx = ThreadContext()
        FLEET.append(self)

    def stop(self, why: str) -> None:
        for worker in FLEET:
            text_worker.TextWorker.stop(worker, why)


def patch() -> None:
    text_worker.engine_target = lambda kind: simengine.run
    load, loaded = ServableInfo.load, {}

    def once(path: Path, model: Any, device: str) -> ServableInfo:
        if (path, model.name, device) not in loaded:
            loaded[path, model.name, device] = load(path, model, device)
        return loaded[path, model.name, device]

    text_worker.ServableInfo.load = once  # type: ignore[method-assign]


async def fleet(settings: Settings, model: Any, count: int) -> None:
    workers = [HollowWorker(settings, model, "CPU") for _ in range(count)]
    await asyncio.gather(*(w.run() for w in workers))


async def churn(settings: Settings, model: Any, total: int, at_once: int, hold_s: float) -> None:
    """`total` workers started and stopped, `at_once` at a time: each runs until its first heartbeat is sent, and
    `hold_s` more (0: stopped while that beat may be in flight)."""
    async def one() -> None:
        worker = HollowWorker(settings, model, "CPU")
        FLEET.remove(worker)
        task = asyncio.create_task(worker.run())
        beat = time.monotonic() + 60
        while not worker.heartbeat.rate.samples and time.monotonic() < beat:
            await asyncio.sleep(0.05)
        await asyncio.sleep(hold_s)
        text_worker.TextWorker.stop(worker, "churn")  # itself alone (`HollowWorker.stop` stops the host)
        await asyncio.wait_for(task, 60)

    started = time.monotonic()
    for done in range(0, total, at_once):
        await asyncio.gather(*(one() for _ in range(min(at_once, total - done))))
        if done and done % 100 == 0:
            print(f"churn: {done} workers in {time.monotonic() - started:.0f}s", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(prog="hollow")
    parser.add_argument("--model", required=True)
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--churn", type=int, default=0)
    parser.add_argument("--at-once", type=int, default=10)
    parser.add_argument("--hold", type=float, default=0.0, help="churn: seconds each runs after its first beat")
    args = parser.parse_args()
    settings = Settings()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    model = find_model(settings, args.model)
    patch()
    if args.churn:
        uvloop.run(churn(settings, model, args.churn, args.at_once, args.hold))
    else:
        uvloop.run(fleet(settings, model, args.count))
    return 0


if __name__ == "__main__":
    sys.exit(main())
