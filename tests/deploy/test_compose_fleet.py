"""deploy/podman/compose_fleet.py: the fleet it derives from compose.yaml is valid compose, publishes on loopback
only, and differs from compose.yaml only where podman needs it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import DEPLOY
from tests.deploy.podman_scripts import load

pytestmark = pytest.mark.deploy

fleet = load("compose_fleet")
SOURCE = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]


@pytest.mark.parametrize("sentinel", [False, True])
def test_the_derived_fleet_is_valid_compose(tmp_path: Path, sentinel: bool) -> None:
    fleet.write(tmp_path, sentinel, (18000, 18001))
    result = subprocess.run([sys.executable, "-m", "check_jsonschema", "--schemafile",
                             str(DEPLOY / "schemas" / "compose-spec.json"), str(tmp_path / "compose.yaml")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    for secret in yaml.safe_load((tmp_path / "compose.yaml").read_text())["secrets"].values():
        assert (tmp_path / secret["file"]).read_text().strip(), "a key is made for the run"


def test_two_apis_on_loopback_two_workers_and_nothing_else_changed() -> None:
    services = fleet.derive(False, (18000, 18001))["services"]
    assert set(services) == {"redis", "prepare", "api", "api-2", "worker", "batch"}
    assert services["api"]["ports"] == ["127.0.0.1:18000:8000"]
    assert services["api-2"]["ports"] == ["127.0.0.1:18001:8000"]
    assert services["worker"]["scale"] == 2
    for name in ("redis", "prepare", "worker"):
        derived = {k: v for k, v in services[name].items() if k not in ("volumes", "scale")}
        assert derived == {k: v for k, v in SOURCE[name].items() if k not in ("volumes", "build")}, name
    assert services["api-2"]["command"] == SOURCE["api"]["command"]


def test_the_sentinel_profile_points_every_tier_at_the_sentinels() -> None:
    services = fleet.derive(True, (8000, 8001))["services"]
    assert {"redis-replica", "sentinel-1", "sentinel-2", "sentinel-3"} <= set(services)
    assert not any("profiles" in service for service in services.values())
    for name in ("api", "api-2", "worker", "batch"):
        url = services[name]["environment"]["REDIS_URL"]
        assert url.startswith("redis+sentinel://sentinel-1:26379,sentinel-2:26379,sentinel-3:26379/"), name
