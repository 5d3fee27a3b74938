"""Every tier drains on a stop signal: it takes no new work, the running work ends normally, it exits 0, and it
says in one log line why it stops. `ovq api` and `ovq worker` are the tier itself (exec), also as PID 1."""
from __future__ import annotations

import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from openai import OpenAI

from tests.conftest import MODEL, Tiers

STREAMS = 6
TOKENS = 48


class Streams:
    """Concurrent streaming chats; each records whether it started and how it finished."""

    def __init__(self, base_url: str, n: int = STREAMS) -> None:
        self.client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
        self.started = [threading.Event() for _ in range(n)]
        self.results: list[tuple[str | None, int] | str] = [""] * n
        self.threads = [threading.Thread(target=self._one, args=(i,)) for i in range(n)]
        for thread in self.threads:
            thread.start()

    def _one(self, i: int) -> None:
        try:
            stream = self.client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"Count from {i} upwards."}],
                max_tokens=TOKENS, temperature=0, stream=True, stream_options={"include_usage": True},
                extra_body={"ignore_eos": True})
            finish, tokens = None, 0
            for chunk in stream:
                self.started[i].set()
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
                if chunk.usage:
                    tokens = chunk.usage.completion_tokens
            self.results[i] = (finish, tokens)
        except Exception as exc:  # the assertion below shows it
            self.results[i] = f"{type(exc).__name__}: {exc}"
        finally:
            self.started[i].set()

    def wait_started(self, timeout: float = 60) -> None:
        for event in self.started:
            assert event.wait(timeout)

    def finished(self, timeout: float = 120) -> list[tuple[str | None, int] | str]:
        for thread in self.threads:
            thread.join(timeout)
        return self.results


def stack(tiers: Callable[..., Tiers], model_dir: Path, **env: str) -> Tiers:
    t = tiers({MODEL: {"path": str(model_dir), "cache_size": 0}}, **env)
    t.api()
    return t


def assert_drained(t: Tiers, proc: subprocess.Popen[bytes], streams: Streams, signame: str) -> None:
    assert streams.finished() == [("length", TOKENS)] * STREAMS
    assert proc.wait(60) == 0
    log = t.log(proc)
    assert f"({signame})" in log or signame in log, log[-2000:]
    assert "leaked" not in log and "Traceback" not in log, log[-3000:]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_worker_drains_its_running_streams_on_a_stop_signal(tiers: Callable[..., Tiers], model_dir: Path,
                                                              sig: signal.Signals) -> None:
    t = stack(tiers, model_dir)
    worker = t.worker(MODEL)
    t.wait_served(MODEL)
    # `ovq worker` became the worker (exec): the signal reaches the tier, not a wrapper.
    assert "workers" in psutil.Process(worker.pid).cmdline()
    streams = Streams(t.base_url)
    streams.wait_started()
    worker.send_signal(sig)
    assert_drained(t, worker, streams, sig.name)


def test_the_api_drains_its_open_streams_on_sigterm(tiers: Callable[..., Tiers], model_dir: Path) -> None:
    t = stack(tiers, model_dir)
    t.worker(MODEL)
    t.wait_served(MODEL)
    api = t.procs[0]
    streams = Streams(t.base_url)
    streams.wait_started()
    api.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    with pytest.raises(Exception):  # noqa: B017 - no new connections once draining
        OpenAI(base_url=t.base_url, api_key="x", max_retries=0, timeout=5).models.list()
    assert_drained(t, api, streams, "SIGTERM")


@pytest.mark.skipif(shutil.which("unshare") is None, reason="unshare (util-linux) is not installed")
def test_a_worker_as_pid_1_of_its_namespace_drains_on_sigterm(tiers: Callable[..., Tiers], model_dir: Path) -> None:
    probe = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"new PID namespaces are not allowed here: {probe.stderr.decode().strip()}")
    t = stack(tiers, model_dir)
    outer = t.start("worker", "--model", MODEL, name="pid1", prefix=["unshare", "--pid", "--fork", "--kill-child"])
    t.wait_served(MODEL)
    (worker,) = psutil.Process(outer.pid).children()  # PID 1 inside the namespace
    streams = Streams(t.base_url)
    streams.wait_started()
    worker.send_signal(signal.SIGTERM)
    assert_drained(t, outer, streams, "SIGTERM")


@pytest.mark.parametrize("delay", [0.3, 1.5])
def test_an_api_stopped_while_it_starts_exits_0_saying_why(tiers: Callable[..., Tiers], delay: float) -> None:
    """A stop signal that lands while the API is still starting (before or while uvicorn sets up) is neither lost
    nor a crash: the API stops at once, or serves and drains, exits 0 and says why."""
    t = tiers({})
    api = t.api()
    time.sleep(delay)
    api.send_signal(signal.SIGTERM)
    assert api.wait(30) == 0, t.log(api)
    assert "SIGTERM" in t.log(api) or "Shutting down" in t.log(api), t.log(api)


@pytest.mark.parametrize("delay", [0.3, 1.5, 4.0])
def test_a_worker_stopped_while_it_starts_exits_0_saying_why(tiers: Callable[..., Tiers], model_dir: Path,
                                                             delay: float) -> None:
    """A stop signal while a worker imports, prepares its model or builds its engine (a scale-in of a pod still
    starting) is neither lost nor a kill: the worker stops at once, or starts and drains, exits 0 and says why."""
    t = tiers({MODEL: {"path": str(model_dir), "cache_size": 0}})
    worker = t.worker(MODEL)
    time.sleep(delay)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(120) == 0, t.log(worker)[-3000:]
    assert "SIGTERM" in t.log(worker), t.log(worker)[-3000:]
    assert "Traceback" not in t.log(worker), t.log(worker)[-3000:]
