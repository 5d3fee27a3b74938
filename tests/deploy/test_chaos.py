"""benchmarks/chaos.py --minutes 3 on the image this tree builds: the compose fleet with Sentinel-backed Redis, a
mixed workload through both APIs, faults on a schedule (a Redis failover, an API SIGKILL, a partitioned worker, a
worker over its memory limit, a worker SIGKILL; the run goes on until each was injected once), and its checker
passing: nothing lost, hung, duplicated or mismatched, no 5xx but 503, no leaked key, no idle worker holding KV
cache. Skipped, in one line, where podman or podman-compose cannot run here (tests/deploy/test_image.py's reasons)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from benchmarks.chaos.faults import KINDS
from tests.conftest import ROOT
from tests.deploy.test_image import ENV, image  # noqa: F401 - the fixture: the image built from this tree

pytestmark = [pytest.mark.image, pytest.mark.timeout(1500)]

MINUTES = "3"  # issue 38: CI runs at least 3 minutes of chaos


def test_three_minutes_of_chaos_lose_nothing(image: str, model_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    path = f"{sysconfig.get_path('scripts')}{os.pathsep}{ENV['PATH']}"
    if shutil.which("podman-compose", path=path) is None:
        pytest.skip("podman-compose is not installed (pip install podman-compose, part of the test extra)")
    # Run from a directory of its own: nothing may land in the caller's (conmon's `oom` file did, at an OOM kill).
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "chaos.py"), "--minutes", MINUTES,
                             "--image", image, "--out", str(tmp_path / "run")],
                            capture_output=True, text=True, timeout=1400, cwd=cwd, env={**ENV, "PATH": path})
    print(result.stdout)
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    injected = dict(re.findall(r"^\| faults: ([a-z ]+?) +\| (\d+) \|$", result.stdout, re.M))
    assert set(injected) == set(KINDS) and all(int(n) >= 1 for n in injected.values()), injected
    assert "chaos: passed" in result.stdout
    assert list(cwd.iterdir()) == []
