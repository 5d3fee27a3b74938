from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from tests.conftest import ROOT, Stack, free_port


@pytest.fixture()
def client(stack: Stack) -> OpenAI:
    return OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=120)


@dataclass
class Guarded:
    """A second API process on the stack's Redis and workers, with API and admin keys and short timeouts."""

    base: str
    api_key: str
    file_key: str
    admin_key: str
    log: Path
    timeouts: dict[str, float]

    def url(self, path: str) -> str:
        return self.base + path


GUARD_TIMEOUTS = {"header": 2.0, "body": 3.0, "write": 2.0, "keep_alive": 2.0}


@pytest.fixture(scope="session")
def guarded(stack: Stack) -> Iterator[Guarded]:
    work = stack.logs / "guarded"
    work.mkdir(exist_ok=True)
    (work / "keys.txt").write_text("sk-from-file-1\n\n  sk-from-file-2  \n")
    port = free_port()
    env = {**stack.env, "OVQ_PORT": str(port), "OVQ_API_PROCESSES": "1", "OVQ_LOG_LEVEL": "info",
           "OVQ_API_KEYS": '["sk-guarded-inline"]', "OVQ_API_KEY_FILE": str(work / "keys.txt"),
           "OVQ_ADMIN_KEYS": "adm-guarded", "OVQ_HEADER_TIMEOUT_S": str(GUARD_TIMEOUTS["header"]),
           "OVQ_BODY_TIMEOUT_S": str(GUARD_TIMEOUTS["body"]), "OVQ_WRITE_TIMEOUT_S": str(GUARD_TIMEOUTS["write"]),
           "OVQ_KEEP_ALIVE_S": str(int(GUARD_TIMEOUTS["keep_alive"])), "OVQ_SEND_BUFFER_BYTES": "32768"}
    log = work / "api.log"
    proc = subprocess.Popen([sys.executable, "-m", "api"], env=env, cwd=ROOT, stdout=log.open("wb"),
                            stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the guarded API did not start"
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield Guarded(base, "sk-guarded-inline", "sk-from-file-2", "adm-guarded", log, GUARD_TIMEOUTS)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
