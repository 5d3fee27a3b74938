"""A tier started before its Redis waits for it (one log line per try, with backoff) and serves once it is up;
a Redis that never comes is one line and exit 1 after OVQ_REDIS_WAIT_S; a malformed REDIS_URL is one line and
exit 2. Never a traceback."""
from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from openai import OpenAI

from common.redis.server import redis_binary
from tests.conftest import MODELS, Tiers, free_port

TINY = "tiny-llama"


def tiny() -> dict[str, dict]:
    return {TINY: {"path": str(MODELS / TINY), "cache_size": 0}}


@pytest.fixture()
def late_port() -> Iterator[tuple[int, list[subprocess.Popen[bytes]]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield free_port(), started
    for server in started:
        server.terminate()
        server.wait(10)


def _waiting_lines(t: Tiers, proc: subprocess.Popen[bytes], port: int) -> list[str]:
    return [line for line in t.log(proc).splitlines() if f"waiting for Redis at 127.0.0.1:{port}" in line]


def _until_up(url: str) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            redis.Redis.from_url(url).ping()
            return
        except redis.ConnectionError:
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)


def test_tiers_started_before_redis_wait_for_it_then_serve(tiers: Callable[..., Tiers], tmp_path: Path,
                                                           late_port: tuple[int, list]) -> None:
    port, started = late_port
    url = f"redis://127.0.0.1:{port}/0"
    t = tiers(tiny(), url=url, OVQ_REDIS_WAIT_S="120")
    api, worker = t.api(), t.worker(TINY)
    deadline = time.monotonic() + 60
    while not (len(_waiting_lines(t, api, port)) >= 2 and len(_waiting_lines(t, worker, port)) >= 2):
        assert time.monotonic() < deadline and api.poll() is None and worker.poll() is None, t.log(worker)[-2000:]
        time.sleep(0.1)
    for proc in (api, worker):
        line = _waiting_lines(t, proc, port)[0]
        assert "connection refused" in line.lower() or "connect" in line.lower(), line
    # Backoff: the tries thin out (a few lines over seconds, not one per millisecond).
    time.sleep(1.5)
    assert len(_waiting_lines(t, worker, port)) < 10
    started.append(subprocess.Popen([redis_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                     "--dir", str(tmp_path)], stdout=subprocess.DEVNULL))
    _until_up(url)
    t.wait_served(TINY)
    client = OpenAI(base_url=t.base_url, api_key="unused", max_retries=0, timeout=60)
    reply = client.chat.completions.create(model=TINY, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                           extra_body={"ignore_eos": True})  # the tiny model may sample EOS first
    assert reply.usage is not None and reply.usage.completion_tokens > 0
    assert all("Traceback" not in t.log(p) for p in (api, worker))


def test_a_redis_that_never_comes_is_one_line_and_exit_1(tiers: Callable[..., Tiers],
                                                         late_port: tuple[int, list]) -> None:
    port, _ = late_port
    t = tiers(tiny(), url=f"redis://127.0.0.1:{port}/0", OVQ_REDIS_WAIT_S="1")
    for proc in (t.api(), t.worker(TINY)):
        assert proc.wait(60) == 1
        text = t.log(proc)
        last = text.strip().splitlines()[-1]
        assert f"Redis at 127.0.0.1:{port} unreachable" in last and "Traceback" not in text, text[-2000:]


@pytest.mark.parametrize("url", ["localhost:6379", "redis://127.0.0.1:notaport/0"])
def test_a_malformed_redis_url_is_one_line_and_exit_2(tiers: Callable[..., Tiers], url: str) -> None:
    t = tiers(tiny(), url=url)
    procs = [t.api(), t.worker(TINY), t.start("batch-worker", name="batch")]
    for proc in procs:
        assert proc.wait(60) == 2, t.log(proc)
        text = t.log(proc)
        assert "REDIS_URL" in text.strip().splitlines()[-1] and "Traceback" not in text, text[-2000:]
