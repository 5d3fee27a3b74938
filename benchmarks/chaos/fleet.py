"""The containerized fleet the chaos run breaks: deploy/compose.yaml's, derived by deploy/podman/compose_fleet.py
with `--sentinel` (two APIs, two SmolLM2 workers, the batch worker, Redis with a replica and three sentinels), plus
what the run needs to see and to check:

- a project of its own (`ovq-chaos-PID`), so it never touches a fleet someone else (or another run) has on the host;
- a worker of the tiny embeddings model (`tests/models/tiny-embed`, 220 KB) beside the SmolLM2 workers, in a models
  file of the run's own (deploy/models.yaml plus that model);
- `OVQ_KEEP_JOB_TEXT=1` on the workers: each job's hash keeps its text, the server's record the checker compares
  with what the client received;
- both Redis servers published on 127.0.0.1 (ports of the run's choosing), so the checker reads keys and memory.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
PODMAN_DIR = ROOT / "deploy" / "podman"
# Each run's own project (containers, network, volumes): two runs on one host never touch each other's fleet.
PROJECT = os.environ.get("OVQ_CHAOS_PROJECT") or f"ovq-chaos-{os.getpid()}"
LLM = "smollm2-135m-instruct"
EMBED = "tiny-embed"
EMBED_DIR = ROOT / "tests" / "models" / EMBED
# Where podman runs: conmon writes an empty file `oom` into the working directory it inherits when its container is
# OOM-killed (a compatibility leftover of conmon's), which left one at the checkout's root after every chaos run.
PODMAN_CWD = tempfile.gettempdir()


def _compose_fleet() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compose_fleet", PODMAN_DIR / "compose_fleet.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@functools.cache
def env() -> dict[str, str]:
    """deploy/podman/env.sh's CONTAINERS_CONF (an operator's own wins), so podman runs here as the deploy scripts
    run it."""
    out = subprocess.run(["bash", "-c", f". {PODMAN_DIR / 'env.sh'} && echo \"$CONTAINERS_CONF\""],
                         capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    return {**os.environ, "CONTAINERS_CONF": out}


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, env=env(),
                            cwd=PODMAN_CWD)
    if check and result.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)}: rc {result.returncode}: {result.stderr.strip()[-500:]}")
    return result


@dataclass(frozen=True)
class Fleet:
    directory: Path
    apis: tuple[str, str]  # base URLs, http://127.0.0.1:PORT
    redis_ports: dict[str, int]  # container name -> loopback port
    key: str

    @property
    def network(self) -> str:
        return f"{PROJECT}_default"

    def container(self, service: str, index: int = 1) -> str:
        return f"{PROJECT}_{service}_{index}"

    @property
    def workers(self) -> list[str]:
        return [self.container("worker", 1), self.container("worker", 2)]

    @property
    def api_containers(self) -> list[str]:
        return [self.container("api"), self.container("api-2")]

    def compose(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["podman-compose", "-f", str(self.directory / "compose.yaml"), *args],
                              capture_output=True, text=True, timeout=timeout, env=env(), cwd=PODMAN_CWD)


def _models_file(directory: Path) -> Path:
    models = yaml.safe_load((ROOT / "deploy" / "models.yaml").read_text())
    models["models"][EMBED] = {"path": f"/cache/models/{EMBED}", "pooling": "MEAN", "devices": ["CPU"]}
    path = directory / "models.yaml"
    path.write_text(yaml.safe_dump(models, sort_keys=False))
    return path


def _derive(directory: Path, image: str, api_ports: tuple[int, int], redis_ports: dict[str, int]) -> None:
    """compose_fleet's --sentinel fleet, adapted as the module docstring says, written to directory/compose.yaml."""
    cf = _compose_fleet()
    cf.write(directory, True, api_ports)
    fleet: dict[str, Any] = yaml.safe_load((directory / "compose.yaml").read_text())
    fleet["name"] = PROJECT
    models = str(_models_file(directory))
    services = fleet["services"]
    for service in services.values():
        if str(service.get("image", "")).startswith("ovq:"):
            service["image"] = image
        service["volumes"] = [f"{models}:/etc/ovq/models.yaml:ro" if v.endswith("/etc/ovq/models.yaml:ro") else v
                              for v in service.get("volumes", [])]
    services["worker"]["environment"]["OVQ_KEEP_JOB_TEXT"] = "1"
    embed = yaml.safe_load(yaml.safe_dump(services["worker"]))
    embed["command"] = [EMBED if part == LLM else part for part in embed["command"]]
    embed.pop("scale", None)
    services["worker-embed"] = embed
    for name, port in redis_ports.items():
        services[name]["ports"] = [f"127.0.0.1:{port}:6379"]
    (directory / "compose.yaml").write_text(yaml.safe_dump(fleet, sort_keys=False))


def _prepared_model() -> Path:
    from common.models.prepare import prepare
    from common.models.sources import default_model
    from common.settings import Settings
    return Path(prepare(default_model(Settings())))


def _fill_models(image: str) -> None:
    """The models volume holds the host's prepared SmolLM2 and the tiny embeddings model: no container downloads."""
    podman("volume", "rm", "-f", f"{PROJECT}_models", check=False)
    podman("volume", "create", f"{PROJECT}_models")
    podman("run", "--rm", "--network", "none", "--user", "0", "-v", f"{PROJECT}_models:/cache/models",
           "-v", f"{_prepared_model()}:/src:ro", "-v", f"{EMBED_DIR}:/embed:ro", image, "sh", "-c",
           f"cp -a /src /cache/models/{LLM} && cp -a /embed /cache/models/{EMBED} && chown -R 10001:0 /cache/models",
           timeout=300)


def _redis_image() -> None:
    """The Redis image compose.yaml names, pulled or built from Debian's packages where the host has none
    (deploy/podman/redis-image.sh; at once when it has). On a fresh host nothing else had built it yet."""
    made = subprocess.run([str(PODMAN_DIR / "redis-image.sh")], capture_output=True, text=True, timeout=900,
                          env=env(), cwd=PODMAN_CWD)
    if made.returncode != 0:
        raise RuntimeError(f"deploy/podman/redis-image.sh: rc {made.returncode}: {made.stderr.strip()[-1500:]}")


def up(directory: Path, image: str) -> Fleet:
    """Derive, fill the models volume, start the fleet and wait until both APIs answer and a batch completes."""
    api_ports = (free_port(), free_port())
    redis_ports = {"redis": free_port(), "redis-replica": free_port()}
    down(directory)  # a previous run's leftovers
    _redis_image()
    _derive(directory, image, api_ports, redis_ports)
    _fill_models(image)
    fleet = Fleet(directory, tuple(f"http://127.0.0.1:{p}" for p in api_ports),  # type: ignore[arg-type]
                  {f"{PROJECT}_{name}_1": port for name, port in redis_ports.items()},
                  (directory / "secrets" / "api-keys").read_text().strip())
    for attempt in (1, 2):
        started = fleet.compose("up", "-d")
        (directory / f"compose-up-{attempt}.log").write_text(started.stdout + started.stderr)
        if started.returncode == 0:
            break
        # Seen once, in CI on a host where podman had never run: every container's create failed after the pod's.
        # The first error says why; the rest repeat "no container with name or ID".
        first = "\n".join(line for line in started.stderr.splitlines() if "condition check" not in line)[:1500]
        if attempt == 2:
            raise RuntimeError(f"podman-compose up failed twice; the second time:\n{first}")
        print(f"chaos: podman-compose up failed; taking it down and trying once more. It said:\n{first}", flush=True)
        down(directory)
        _fill_models(image)
    _compose_fleet().check(directory)
    return fleet


def save_logs(directory: Path) -> None:
    """Every container's log into directory/logs/NAME.log (what the run's faults looked like from inside)."""
    logs = directory / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    names = podman("ps", "-a", "--filter", f"label=io.podman.compose.project={PROJECT}", "--format",
                   "{{.Names}}", check=False).stdout.split()
    for name in names:
        out = podman("logs", name, check=False, timeout=120)
        (logs / f"{name}.log").write_text(out.stdout + out.stderr)


def down(directory: Path) -> None:
    """Take the run's fleet down, volumes included (also one a crashed earlier run left)."""
    if (directory / "compose.yaml").exists():
        subprocess.run(["podman-compose", "-f", str(directory / "compose.yaml"), "down", "-v", "-t", "10"],
                       capture_output=True, text=True, timeout=600, env=env(), cwd=PODMAN_CWD)
    names = podman("ps", "-a", "--filter", f"label=io.podman.compose.project={PROJECT}", "--format",
                   "{{.Names}}", check=False).stdout.split()
    if names:
        podman("rm", "-f", "-t", "5", *names, check=False, timeout=300)
    for volume in podman("volume", "ls", "--format", "{{.Name}}", check=False).stdout.split():
        if volume.startswith(f"{PROJECT}_"):
            podman("volume", "rm", "-f", volume, check=False)
    podman("network", "rm", "-f", f"{PROJECT}_default", check=False)
    podman("pod", "rm", "-f", f"pod_{PROJECT}", check=False)  # podman-compose's pod: left after a failed up


def wait_until(what: str, timeout_s: float, probe: Any, every_s: float = 1.0) -> Any:
    """probe() until true, at most timeout_s (every wait on the fleet is bounded)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if result := probe():
                return result
        except Exception:  # noqa: BLE001 - a fleet mid-fault answers anything; the bound decides
            pass
        time.sleep(every_s)
    raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")
