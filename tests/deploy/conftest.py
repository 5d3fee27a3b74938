"""Fixtures for the deploy/ tests: the repository's deployment files and a Redis 7 beside the embedded 6.2."""
from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from common.redis.server import server_args
from tests.conftest import ROOT, free_port

DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"


def redis7_binary() -> str | None:
    """Debian's redis-server (7.0 in bookworm: `apt-get install -y redis-server`), if installed."""
    for candidate in ("/usr/bin/redis-server", shutil.which("redis-server")):
        if not candidate or not Path(candidate).exists():
            continue
        version = subprocess.run([candidate, "--version"], capture_output=True, text=True, timeout=10).stdout
        match = re.search(r"v=(\d+)\.", version)
        if match and int(match.group(1)) >= 7:
            return candidate
    return None


@pytest.fixture(scope="session")
def redis7_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private Redis >= 7 on loopback TCP, started from its binary (not as a system service)."""
    binary = redis7_binary()
    if binary is None:
        pytest.skip("no redis-server >= 7 on this machine (Debian: apt-get install -y redis-server)")
    port = free_port()
    args = server_args(tmp_path_factory.mktemp("redis7"), port, appendonly=False)
    args[0] = binary
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5)
    deadline = time.monotonic() + 10
    try:
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("Debian's redis-server did not start")
                time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
