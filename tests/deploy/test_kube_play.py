"""deploy/podman/kube_play.py: what it plays of deploy/kubernetes, and how it adapts it for `podman kube play`."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.podman_scripts import load

pytestmark = pytest.mark.deploy

kube = load("kube_play")


def _played(tmp_path: Path, *existing: str) -> dict[str, list[dict[str, Any]]]:
    assert kube.main(tmp_path, set(existing)) == 0
    plan = dict(line.split() for line in (tmp_path / "plan.txt").read_text().splitlines())
    return {f"{name} {alias}": list(yaml.safe_load_all((tmp_path / name).read_text())) for name, alias in plan.items()}


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    pod = doc["spec"]["template"]["spec"]
    return pod.get("initContainers", []) + pod["containers"]


def test_every_workload_plays_behind_its_service_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    played = _played(tmp_path, "ovq-models")
    assert set(played) == {"redis.yaml redis", "api.yaml ovq-api", "batch-worker.yaml -",
                           "worker-smollm2-cpu.yaml -"}
    kinds = {doc["kind"] for docs in played.values() for doc in docs}
    assert kinds == {"Deployment", "PersistentVolumeClaim"}, "a StatefulSet, Service, PDB or CRD would not play"
    left_out = capsys.readouterr().err
    for kind in ("Namespace", "Service", "PodDisruptionBudget", "ScaledObject"):
        assert f"{kind} " in left_out, kind
    # Redis's StatefulSet is a Deployment of its pod template, its claim template a PVC the pod mounts.
    claim, redis = played["redis.yaml redis"]
    assert claim["kind"] == "PersistentVolumeClaim" and redis["kind"] == "Deployment"
    volumes = redis["spec"]["template"]["spec"]["volumes"]
    assert {"name": "data", "persistentVolumeClaim": {"claimName": claim["metadata"]["name"]}} in volumes
    # The claim made beforehand (filled with the prepared model) is not declared again.
    assert [d["kind"] for d in played["worker-smollm2-cpu.yaml -"]] == ["Deployment"]


def test_only_the_api_is_published_and_on_loopback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube, "API_PORT", 18123)
    for key, docs in _played(tmp_path).items():
        for doc in docs:
            if doc["kind"] != "Deployment":
                continue
            assert doc["spec"]["replicas"] == 1
            for container in _containers(doc):
                ports = container.get("ports", [])
                if key == "api.yaml ovq-api":
                    assert ports == [{"name": "http", "containerPort": 8000, "hostIP": "127.0.0.1",
                                      "hostPort": 18123}]
                else:
                    assert not ports, key
                for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                    check = next(iter(container.get(probe, {"x": {}}).values()))
                    assert not isinstance(check, dict) or isinstance(check.get("port", 0), int), (key, probe)


def test_init_containers_are_kept_between_starts(tmp_path: Path) -> None:
    (worker,) = _played(tmp_path, "ovq-models")["worker-smollm2-cpu.yaml -"]
    assert worker["spec"]["template"]["spec"]["initContainers"]
    assert worker["metadata"]["annotations"][kube.INIT_CONTAINER_TYPE] == "always"
