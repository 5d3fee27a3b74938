"""The Procfile as shipped, under a Procfile runner (honcho): the embedded Redis, the API and a worker start on a
fresh cache dir, answer a chat through the openai SDK, and SIGTERM to the runner stops every one of them cleanly.

Run alone with `python -m pytest -m procfile`.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from openai import APIConnectionError, APIStatusError, OpenAI

from tests.conftest import MODEL, ROOT, free_port

pytestmark = pytest.mark.procfile

START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0


def _clean_env(cache: Path, port: int) -> dict[str, str]:
    """This process's environment without any ovq setting or Redis URL, so the Procfile's defaults are what runs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OVQ_") and k not in ("REDIS_URL",)}
    env.update(OVQ_CACHE_DIR=str(cache), OVQ_PORT=str(port), OVQ_LOG_LEVEL="warning", PYTHONPATH=str(ROOT),
               PYTHONUNBUFFERED="1")
    return env


def _ours(cache: Path) -> list[psutil.Process]:
    """Every process of this run: its cache dir is in its environment or its command line (redis-server's --dir)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.pid == os.getpid():
                continue
            in_cmdline = any(str(cache) in part for part in proc.info["cmdline"] or [])
            if in_cmdline or proc.environ().get("OVQ_CACHE_DIR") == str(cache):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _chat_once(port: int, runner: subprocess.Popen[bytes], log: Path) -> str:
    """One chat completion, retried while the stack starts (Redis, then the worker's engine), bounded."""
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v3", api_key="unused", max_retries=0, timeout=30)
    deadline = time.monotonic() + START_TIMEOUT_S
    last: Exception | None = None
    while time.monotonic() < deadline:
        if runner.poll() is not None:
            pytest.fail(f"the Procfile runner exited during start-up:\n{log.read_text()[-4000:]}")
        try:
            reply = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Say hi"}], max_tokens=8)
            return reply.choices[0].message.content or ""
        except (APIConnectionError, APIStatusError) as exc:  # not listening yet, or 503 until a worker is live
            last = exc
            time.sleep(0.5)
    pytest.fail(f"no chat completion within {START_TIMEOUT_S:.0f}s ({last!r}):\n{log.read_text()[-4000:]}")


def test_procfile_serves_and_stops_on_sigterm(model_dir: Path, tmp_path: Path) -> None:
    cache = tmp_path / "c"
    (cache / "models").mkdir(parents=True)
    (cache / "models" / MODEL).symlink_to(model_dir)  # prepared once per machine: nothing is downloaded
    port = free_port()
    log = tmp_path / "honcho.log"
    runner = subprocess.Popen(
        [sys.executable, "-m", "honcho", "start", "--no-colour", "-f", str(ROOT / "Procfile"), "-d", str(ROOT)],
        cwd=ROOT, env=_clean_env(cache, port), stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        text = _chat_once(port, runner, log)
        assert text.strip(), "the chat completion came back empty"
        runner.send_signal(signal.SIGTERM)
        runner.wait(timeout=STOP_TIMEOUT_S)
        output = log.read_text()
        # Each tier drained and exited by itself (honcho would have SIGKILLed a straggler: rc=-9).
        for name in ("redis", "api", "worker"):
            match = re.search(rf"^\S+ system\s+\| {name}\.1 stopped \(rc=(-?\d+)\)", output, re.MULTILINE)
            assert match, f"{name} did not report stopping:\n{output[-4000:]}"
            assert match.group(1) == "0", f"{name} exited with rc={match.group(1)}:\n{output[-4000:]}"
        _, alive = psutil.wait_procs(_ours(cache), timeout=10)
        assert not alive, f"left running after the runner stopped: {[p.info['cmdline'] for p in alive]}"
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
        for proc in _ours(cache):  # only processes of this run (its private cache dir)
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
