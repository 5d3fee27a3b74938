"""Protected mode, as real processes: an API on a non-loopback address with no API key refuses to start (one line,
exit 2, no traceback), `ovq serve` says the same before starting anything, and a key or `--allow-unauthenticated`
lets it serve."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, free_port


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """No ovq setting from this process's environment: only what the test says."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OVQ_") and k != "REDIS_URL"}
    return {**env, "OVQ_CACHE_DIR": str(tmp_path / "cache"), "OVQ_LOG_LEVEL": "warning", "PYTHONPATH": str(ROOT),
            "OVQ_PORT": str(free_port()), **extra}


def _refused(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-m", *args], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output, output
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    return lines[0]


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_an_api_on_every_address_without_a_key_refuses_to_start(tmp_path: Path, host: str) -> None:
    line = _refused(["api"], _env(tmp_path, OVQ_HOST=host))
    assert line.startswith("ovq api: refusing to serve on") and "--api-key" in line
    assert "--allow-unauthenticated" in line


def test_ovq_api_and_serve_refuse_before_starting_anything(tmp_path: Path) -> None:
    env = _env(tmp_path)
    assert "OVQ_ALLOW_UNAUTHENTICATED" in _refused(["cli.main", "api", "--host", "0.0.0.0"], env)
    line = _refused(["cli.main", "serve", "--host", "0.0.0.0", "--admin-key", "adm-only"], env)
    assert line.startswith("ovq serve: refusing to serve on 0.0.0.0")
    assert not (tmp_path / "cache" / "redis").exists(), "serve started its Redis before refusing"


def _serves(args: list[str], env: dict[str, str], log: Path) -> httpx.Response:
    """Start the API, wait for its readiness on 127.0.0.1 (it listens on every address), stop it."""
    proc = subprocess.Popen([sys.executable, "-m", *args], env=env, cwd=ROOT, stdout=log.open("wb"),
                            stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{env['OVQ_PORT']}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the API did not start"
            try:
                if httpx.get(f"{base}/v3/health", timeout=2).status_code == 200:
                    return httpx.get(f"{base}/v3/models", timeout=10)
            except httpx.HTTPError:
                time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_key_or_the_explicit_flag_lets_it_serve_on_every_address(tmp_path: Path, redis_url: str) -> None:
    keyed = _env(tmp_path, OVQ_HOST="0.0.0.0", REDIS_URL=redis_url, OVQ_API_KEYS="sk-protected")
    assert _serves(["api"], keyed, tmp_path / "keyed.log").status_code == 401
    opened = _env(tmp_path, REDIS_URL=redis_url)
    log = tmp_path / "open.log"
    assert _serves(["cli.main", "api", "--host", "0.0.0.0", "--allow-unauthenticated"], opened, log).status_code == 200
    assert "no API key is asked for" in log.read_text()
