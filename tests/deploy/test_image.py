"""deploy/Dockerfile built with podman (deploy/podman/build-image.sh) and run as shipped: `ovq serve` answers a chat
through a published loopback port, the API refuses to start without a key, SIGTERM drains, the HEALTHCHECK passes
for both tiers, nothing runs as root. Skipped, in one line, where podman cannot build or run here.

Containers use a network this module creates (its port published on 127.0.0.1 only) or none at all, and the
model prepared on the host, mounted read-only: nothing is fetched at run time."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import MODEL, ROOT, free_port
from tests.deploy.test_manifests import OVQ_IMAGE

pytestmark = [pytest.mark.image, pytest.mark.timeout(1200)]

PODMAN_DIR = ROOT / "deploy" / "podman"
TAG = "localhost/ovq:test"
KEY = "sk-image-test"
MODELS = "/cache/models"


def _podman_env() -> dict[str, str]:
    """The environment deploy/podman/env.sh makes (its CONTAINERS_CONF), so this module's podman runs as the
    scripts' does."""
    out = subprocess.run(["bash", "-c", f". {PODMAN_DIR / 'env.sh'} && echo \"$CONTAINERS_CONF\""],
                         capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    return {**os.environ, "CONTAINERS_CONF": out}


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, env=ENV)
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: rc {result.returncode}\n{result.stdout}{result.stderr}")
    return result


ENV: dict[str, str] = {}


def _unusable() -> str | None:
    """Why podman cannot build and run the image here, for a reason outside the project; None if it can."""
    if shutil.which("podman") is None:
        return "podman is not installed (Debian: apt-get install -y podman debootstrap runc)"
    ENV.update(_podman_env())
    info = podman("info", check=False, timeout=60)
    if info.returncode != 0:
        return f"podman cannot run here: {(info.stderr.strip().splitlines() or ['?'])[-1]}"
    base = next(line.split("=", 1)[1] for line in (ROOT / "deploy" / "Dockerfile").read_text().splitlines()
                if line.startswith("ARG PYTHON_IMAGE="))
    if podman("image", "exists", base, check=False).returncode != 0 and \
            podman("pull", "-q", base, check=False, timeout=300).returncode != 0:
        if shutil.which("debootstrap") is None or os.geteuid() != 0:
            return f"{base} cannot be pulled and its stand-in needs root and debootstrap (apt-get install debootstrap)"
    return None


@pytest.fixture(scope="module")
def image() -> str:
    reason = _unusable()
    if reason:
        pytest.skip(reason)
    build = subprocess.run([str(PODMAN_DIR / "build-image.sh"), TAG], capture_output=True, text=True,
                           timeout=1500, env=ENV, cwd=ROOT)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    runs = podman("run", "--rm", "--network", "none", TAG, "true", check=False)
    if runs.returncode != 0:  # the image exists, yet no container starts: the host's runtime, not the project
        pytest.skip(f"podman cannot run a container here: {(runs.stderr.strip().splitlines() or ['?'])[-1]}")
    return TAG


@pytest.fixture(scope="module")
def network(image: str) -> Iterator[str]:
    """A bridge network of this module's own: the only way in is the port published on 127.0.0.1."""
    name = f"ovq-test-{uuid.uuid4().hex[:8]}"
    podman("network", "create", name)
    yield name
    podman("network", "rm", "-f", name, check=False)


@pytest.fixture()
def containers() -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        podman("rm", "-f", "-t", "0", name, check=False)


@pytest.fixture(scope="module")
def model_copy(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The prepared model, readable by the containers' user (the host's cache may be private to its owner)."""
    copy = tmp_path_factory.mktemp("image-model") / MODEL
    shutil.copytree(model_dir, copy)
    for path in [copy, *copy.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return copy


def _model_mount(model: Path) -> list[str]:
    return ["-v", f"{model}:{MODELS}/{MODEL}:ro"]


def _logs(name: str) -> str:
    logs = podman("logs", name, check=False)
    return (logs.stdout + logs.stderr)[-4000:]


def _wait_answer(base: str, name: str, timeout: float = 300) -> float:
    """Seconds until a chat is answered through the published port (the container may still be starting)."""
    start = time.monotonic()
    deadline = start + timeout
    while True:
        try:
            response = httpx.post(f"{base}/v3/chat/completions", timeout=60, headers={"Authorization": f"Bearer {KEY}"},
                                  json={"model": MODEL, "max_tokens": 8,
                                        "messages": [{"role": "user", "content": "Hi"}]})
            if response.status_code == 200:
                assert response.json()["choices"][0]["message"]["content"]
                return time.monotonic() - start
        except httpx.TransportError:
            pass
        state = podman("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
        if state != "running" or time.monotonic() > deadline:
            raise AssertionError(f"{name} is {state}, no answer:\n{_logs(name)}")
        time.sleep(1)


def _stream_through_sigterm(base: str, name: str) -> list[dict]:
    """A long stream; SIGTERM reaches the container after its first chunk. The chunks it got."""
    chunks: list[dict] = []
    body = {"model": MODEL, "stream": True, "max_tokens": 256, "ignore_eos": True, "temperature": 0,
            "messages": [{"role": "user", "content": "Count from one to one hundred."}]}
    with httpx.stream("POST", f"{base}/v3/chat/completions", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {KEY}"}) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                chunks.append({"done": True})
                break
            chunks.append(json.loads(line[6:]))
            if len(chunks) == 1:
                podman("kill", "--signal", "TERM", name)
    return chunks


def test_serve_in_the_image_answers_drains_on_sigterm_and_runs_as_non_root(
        image: str, network: str, containers: list[str], model_copy: Path) -> None:
    name, port = f"ovq-serve-{uuid.uuid4().hex[:8]}", free_port()
    containers.append(name)
    podman("run", "-d", "--name", name, "--network", network, "-p", f"127.0.0.1:{port}:8000",
           "-e", f"OVQ_API_KEYS={KEY}", *_model_mount(model_copy), image, "ovq", "serve")
    base = f"http://127.0.0.1:{port}"
    cold_start = _wait_answer(base, name)
    print(f"cold start to the first answer: {cold_start:.1f} s")

    # The HEALTHCHECK's API branch (no OVQ_WORKER_PORT): /v2/health/live on OVQ_PORT.
    podman("healthcheck", "run", name)
    users = podman("top", name, "user", "args").stdout.splitlines()[1:]
    assert users and all(line.split()[0] not in ("root", "0") for line in users), users

    chunks = _stream_through_sigterm(base, name)
    assert chunks[-1] == {"done": True}, "the stream was cut by SIGTERM instead of finishing"
    finish = [c["choices"][0]["finish_reason"] for c in chunks[:-1] if c.get("choices")]
    assert finish[-1] == "length" and len(finish) > 2, finish[-3:]
    assert podman("wait", name, timeout=90).stdout.strip() == "0", _logs(name)


def test_worker_healthcheck_probes_its_own_port(image: str, containers: list[str], model_copy: Path,
                                                tmp_path: Path) -> None:
    """The worker tier's HEALTHCHECK (OVQ_WORKER_PORT set) passes once it is live; its container has no network
    at all: it reaches `ovq redis` (another container of this image) through a socket in a shared directory."""
    shared = tmp_path / "redis"
    shared.mkdir()
    shared.chmod(0o777)  # the containers' user (10001) makes the socket there
    redis_name, worker_name = f"ovq-redis-{uuid.uuid4().hex[:8]}", f"ovq-worker-{uuid.uuid4().hex[:8]}"
    containers.extend([worker_name, redis_name])
    mount = ["-v", f"{shared}:/cache/redis"]
    podman("run", "-d", "--name", redis_name, "--network", "none", *mount, image, "ovq", "redis", "--no-appendonly")
    podman("run", "-d", "--name", worker_name, "--network", "none", *mount, *_model_mount(model_copy),
           "-e", "OVQ_WORKER_PORT=8081", image, "ovq", "worker", "--model", MODEL, "--device", "CPU")
    deadline = time.monotonic() + 300
    while podman("healthcheck", "run", worker_name, check=False).returncode != 0:
        state = podman("inspect", "--format", "{{.State.Status}}", worker_name).stdout.strip()
        if state != "running" or time.monotonic() > deadline:
            raise AssertionError(f"worker {state}, never healthy:\n{_logs(worker_name)}")
        time.sleep(2)
    podman("stop", "-t", "45", worker_name, timeout=90)
    assert podman("inspect", "--format", "{{.State.ExitCode}}", worker_name).stdout.strip() == "0"


def test_api_without_a_key_refuses_to_start_in_one_line(image: str) -> None:
    """The image's default command (`ovq api` on 0.0.0.0) with no key: exit 2 and one line saying so."""
    result = podman("run", "--rm", "--network", "none", image, check=False)
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    lines = [line for line in lines if "level=error" not in line]  # podman's own complaints (no systemd timers)
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(lines) == 1 and "key" in lines[0].lower(), lines


def _script(name: str, **env: str) -> subprocess.CompletedProcess[str]:
    """A deploy/podman script, with this Python (ovq installed) and the test extra's podman-compose on PATH."""
    path = f"{sysconfig.get_path('scripts')}{os.pathsep}{ENV['PATH']}"
    return subprocess.run([str(PODMAN_DIR / name)], capture_output=True, text=True, timeout=1200, cwd=ROOT,
                          env={**ENV, "PATH": path, "PYTHON": sys.executable, **env})


def test_compose_fleet_answers_on_both_apis_and_completes_a_batch(image: str, model_dir: Path) -> None:
    """compose.yaml's fleet under podman-compose (compose-fleet.sh): two APIs, two workers, the batch worker and
    Redis, every healthcheck passing; the script takes it down again."""
    if shutil.which("podman-compose", path=f"{sysconfig.get_path('scripts')}{os.pathsep}{ENV['PATH']}") is None:
        pytest.skip("podman-compose is not installed (pip install podman-compose, part of the test extra)")
    podman("tag", image, OVQ_IMAGE)  # the image compose.yaml names: this tree's
    result = _script("compose-fleet.sh", OVQ_FLEET_API_PORTS=f"{free_port()} {free_port()}")
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert result.stdout.count("healthy\n") == 6 and "prepare exited 0" in result.stdout, result.stdout


def test_kubernetes_manifests_answer_under_kube_play(image: str, model_dir: Path) -> None:
    """deploy/kubernetes as far as `podman kube play` runs it (kube-play.sh): the API answers through it."""
    podman("tag", image, OVQ_IMAGE)
    result = _script("kube-play.sh", OVQ_KUBE_API_PORT=str(free_port()))
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "kube-play: the API answered" in result.stdout, result.stdout
