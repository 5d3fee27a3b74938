"""The faults, one at a time on a schedule, each waiting (bounded) until the fleet has recovered before the next:

- `worker kill`: SIGKILL to a SmolLM2 worker container, started again 2 s later (as an orchestrator would);
- `api kill`: SIGKILL to an API container, started again 2 s later;
- `redis failover`: SIGKILL to the Redis primary; the sentinels promote the replica; the old primary is started
  again and the sentinels make it the new primary's replica;
- `partition`: a worker disconnected from the fleet's network for PARTITION_S (longer than OVQ_WORKER_TTL_S plus
  the reclaim interval, so its jobs are taken over), then connected again;
- `oom`: a worker's memory limit lowered to its current usage + 32 MiB (`podman update --memory`), then memory
  allocated inside the container (a process `podman exec`ed into it) until the cgroup is over its limit: the
  kernel's OOM killer kills the container's largest process (the worker's engine); the limit is then lifted.
"""
from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import Callable

import redis

from .fleet import PODMAN_CWD, PROJECT, Fleet, env, podman, wait_until
from .records import Fault

PARTITION_S = 20.0
RECOVERY_S = 300.0
KINDS = ("redis failover", "api kill", "partition", "oom", "worker kill")  # the quickest to recover first
HOG = ("import time\nchunks = []\nfor _ in range(64):\n    chunks.append(bytearray(8 << 20))\n    time.sleep(0.05)\n"
       "time.sleep(2)")  # 512 MiB, held 2 s: past any limit set here, short enough not to starve the restart
OOM_WAIT_S = 60.0
NO_LIMIT = "16g"  # podman 4.3 on cgroup v1 cannot set `unlimited` back (-1 is refused): far above any use here


def _worker_ready(name: str) -> bool:
    probe = "import urllib.request as u; u.urlopen('http://127.0.0.1:8081/ready', timeout=4)"
    return podman("exec", name, "python", "-c", probe, check=False, timeout=30).returncode == 0


def _running(name: str) -> bool:
    return podman("inspect", "--format", "{{.State.Running}}", name, check=False).stdout.strip() == "true"


def _start_ready(name: str) -> None:
    """Started if it is not running (also if it stops while it is waited for), then ready."""
    def ready() -> bool:
        if not _running(name):
            podman("start", name, timeout=120)
        return _worker_ready(name)
    wait_until(f"{name} ready", RECOVERY_S, ready, every_s=2)


def kill_worker(fleet: Fleet, fault: Fault) -> None:
    podman("kill", "-s", "KILL", fault.target)
    time.sleep(2)
    _start_ready(fault.target)


def kill_api(fleet: Fleet, fault: Fault) -> None:
    podman("kill", "-s", "KILL", fault.target)
    time.sleep(2)
    podman("start", fault.target, timeout=120)
    probe = "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=4)"
    wait_until(f"{fault.target} ready", RECOVERY_S,
               lambda: podman("exec", fault.target, "python", "-c", probe, check=False).returncode == 0, every_s=2)


def role(port: int) -> str:
    info = redis.Redis(port=port, socket_timeout=2, socket_connect_timeout=2).info("replication")
    if info["role"] == "slave" and info.get("master_link_status") != "up":
        return "replica (link down)"
    return str(info["role"])


def primary(fleet: Fleet) -> str:
    """The container whose Redis is the primary now."""
    return wait_until("a Redis primary", RECOVERY_S,
                      lambda: next((n for n, p in fleet.redis_ports.items() if role(p) == "master"), None))


SENTINELS = ("sentinel-1", "sentinel-2", "sentinel-3")


def _sentinels_agree(fleet: Fleet, name: str) -> bool:
    """All three sentinels name `name`'s Redis as the primary (by its service name, or by its address)."""
    service = name.removeprefix(f"{PROJECT}_").rsplit("_", 1)[0]  # ovq-chaos-PID_redis_1 -> redis
    address = podman("inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", name,
                     check=False).stdout.strip()
    for sentinel in SENTINELS:
        answer = podman("exec", fleet.container(sentinel), "redis-cli", "-p", "26379", "sentinel",
                        "get-master-addr-by-name", "ovq", check=False, timeout=30).stdout.split()
        if not answer or answer[0] not in (service, address):
            return False
    return True


def fail_over(fleet: Fleet, fault: Fault) -> None:
    """The old primary is started again only once the failover is over (all sentinels name the new one), as an
    orchestrator restarting a crashed pod would find it; it must then come back as the new primary's replica."""
    fault.target = primary(fleet)
    podman("kill", "-s", "KILL", fault.target)
    other = next(n for n in fleet.redis_ports if n != fault.target)
    wait_until("the sentinels promoting the replica", RECOVERY_S,
               lambda: role(fleet.redis_ports[other]) == "master" and _sentinels_agree(fleet, other), every_s=0.5)
    podman("start", fault.target, timeout=120)
    wait_until("the old primary a replica again", RECOVERY_S,
               lambda: role(fleet.redis_ports[fault.target]) == "slave" and _sentinels_agree(fleet, other),
               every_s=1)


def partition(fleet: Fleet, fault: Fault) -> None:
    podman("network", "disconnect", fleet.network, fault.target)
    time.sleep(PARTITION_S)
    podman("network", "connect", "--alias", "worker", fleet.network, fault.target)
    _start_ready(fault.target)


def _cgroup(name: str, file: str) -> int:
    out = podman("exec", name, "cat", f"/sys/fs/cgroup/memory/{file}").stdout
    if file == "memory.oom_control":
        return int(next(line.split()[1] for line in out.splitlines() if line.startswith("oom_kill ")))
    return int(out.strip())


def out_of_memory(fleet: Fleet, fault: Fault) -> None:
    """Over the limit until the kernel kills a process of the container; the limit is lifted as soon as it has (so
    the engine the worker starts again is not starved as well), and the allocating process ends by itself."""
    name = fault.target
    kills = _cgroup(name, "memory.oom_control")
    podman("update", "--memory", str(_cgroup(name, "memory.usage_in_bytes") + (32 << 20)), name)
    hog = subprocess.Popen(["podman", "exec", name, "python", "-c", HOG], env=env(), cwd=PODMAN_CWD,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(f"an OOM kill in {name}", OOM_WAIT_S,
                   lambda: not _running(name) or _cgroup(name, "memory.oom_control") > kills, every_s=0.2)
    finally:
        if _running(name):
            podman("update", "--memory", NO_LIMIT, name)
        hog.wait(timeout=120)
    fault.note = "the container exited" if not _running(name) else \
        f"OOM kills in its cgroup: {_cgroup(name, 'memory.oom_control') - kills}"
    if not _running(name):
        podman("start", name, timeout=120)
        podman("update", "--memory", NO_LIMIT, name)
    _start_ready(name)


INJECT: dict[str, Callable[[Fleet, Fault], None]] = {
    "worker kill": kill_worker, "api kill": kill_api, "redis failover": fail_over, "partition": partition,
    "oom": out_of_memory}


def _target(fleet: Fleet, kind: str, n: int) -> str:
    if kind == "api kill":
        return fleet.api_containers[n % 2]
    if kind == "redis failover":
        return ""  # the primary at the time
    return fleet.workers[n % 2]


def all_ready(fleet: Fleet) -> None:
    """Every SmolLM2 worker running and ready (after the run: a fault's restart may still be under way)."""
    for name in fleet.workers:
        _start_ready(name)


async def schedule(fleet: Fleet, until: float, period_s: float, faults: list[Fault],
                   kinds: tuple[str, ...] = KINDS, every_kind: asyncio.Event | None = None) -> None:
    """One fault every `period_s` (a calm gap of at least half of it after each recovery), `kinds` in turn, until
    `until` and at least once each (then `every_kind` is set: a short run goes on until every kind was injected)."""
    n = 0
    await asyncio.sleep(period_s / 2)
    while time.time() < until or n < len(kinds):
        kind = kinds[n % len(kinds)]
        target = _target(fleet, kind, n // len(kinds))
        if target in fleet.workers:  # a worker an earlier fault left stopped is started first
            with contextlib.suppress(Exception):  # if it cannot be, the fault says so below
                await asyncio.to_thread(_start_ready, target)
        fault = Fault(kind, target, time.time())
        faults.append(fault)
        try:
            await asyncio.to_thread(INJECT[kind], fleet, fault)
        except Exception as error:  # noqa: BLE001 - a fault that could not recover is in the table, not a crash
            fault.note = f"did not recover: {error}"
        fault.ended = time.time()
        n += 1
        if every_kind is not None and n >= len(kinds):
            every_kind.set()
        if time.time() < until or n < len(kinds):
            await asyncio.sleep(max(period_s / 2, fault.began + period_s - time.time()))
