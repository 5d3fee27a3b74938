"""Replicated Redis for the failover tests, from Debian's binaries on loopback ports: a primary with one replica
watched by three sentinels (timings shortened), and a 3 x 2 cluster. Each node can be SIGKILLed."""
from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis

from tests.conftest import free_port

DEBIAN_REDIS = Path("/usr/bin/redis-server")
DEBIAN_SENTINEL = Path("/usr/bin/redis-sentinel")
SERVICE = "ovqmain"
DOWN_AFTER_MS = 1000  # sentinel's default is 30 s
FAILOVER_TIMEOUT_MS = 3000


def missing_for_sentinel() -> str | None:
    """Why the Sentinel tests (`SentinelSet`: redis-server and redis-sentinel) cannot run here, or None."""
    for binary in (DEBIAN_REDIS, DEBIAN_SENTINEL):
        if not binary.exists():
            return f"{binary} is missing (Debian's redis-server and redis-sentinel packages, Redis >= 7)"
    return None


def missing_for_cluster() -> str | None:
    """Why the Cluster tests (`ClusterSet`: redis-server, and redis-cli to create the cluster) cannot run here, or
    None. They need no redis-sentinel."""
    if not DEBIAN_REDIS.exists():
        return f"{DEBIAN_REDIS} is missing (Debian's redis-server package, Redis >= 7)"
    if shutil.which("redis-cli") is None:
        return "redis-cli is not on PATH (Debian's redis-tools package)"
    return None


class Node:
    def __init__(self, work: Path, binary: Path, *args: str, port: int | None = None) -> None:
        self.port = port or free_port()
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        self.log = work / "log"
        self.args = [str(binary), *args]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, auth: dict[str, str] | None = None) -> Node:
        self.process = subprocess.Popen(self.args, cwd=self.work, stdout=self.log.open("ab"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(self.log.read_text()[-2000:])
            try:
                redis.Redis(port=self.port, socket_connect_timeout=0.5, **(auth or {})).ping()
                return self
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError(f"no answer on port {self.port}: {self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def data_node(work: Path, *args: str) -> Node:
    port = free_port()
    return Node(work, DEBIAN_REDIS, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(work), "--save", "",
                "--appendonly", "yes", "--appendfsync", "everysec", "--loglevel", "warning",
                "--repl-diskless-sync-delay", "0", *args, port=port)


class SentinelSet:
    """A primary, one replica and three sentinels that fail over one second after the primary stops answering."""

    def __init__(self, work: Path, acl: Path | None = None) -> None:
        """With `acl`: the data nodes take that ACL file, link up as `ovq-replica` and are watched as
        `ovq-sentinel` (deploy/redis/users.acl's users), and the set's own checks log in as `admin`."""
        secured = ("--aclfile", str(acl), "--masteruser", "ovq-replica", "--masterauth", "change-me-replica") \
            if acl else ()
        self.auth = {"username": "admin", "password": "admin-pw"} if acl else {}
        self.primary = data_node(work / "primary", *secured).start(self.auth)
        self.replica = data_node(work / "replica", *secured, "--replicaof", "127.0.0.1",
                                 str(self.primary.port)).start(self.auth)
        self.sentinels: list[Node] = []
        for i in range(3):
            port = free_port()
            conf = work / f"sentinel{i}" / "sentinel.conf"
            conf.parent.mkdir(parents=True, exist_ok=True)
            conf.write_text(f"port {port}\nbind 127.0.0.1\nsentinel resolve-hostnames no\n"
                            f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary.port} 2\n"
                            f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                            f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
                            f"sentinel parallel-syncs {SERVICE} 1\n"
                            + (f"sentinel auth-user {SERVICE} ovq-sentinel\n"
                               f"sentinel auth-pass {SERVICE} change-me-sentinel\n" if acl else ""))
            self.sentinels.append(Node(conf.parent, DEBIAN_SENTINEL, str(conf), port=port).start())
        self._wait_replicated()

    @property
    def url(self) -> str:
        return self.url_for()

    def url_for(self, user: str = "", password: str = "") -> str:
        login = f"{user}:{password}@" if password else ""
        return f"redis+sentinel://{login}{','.join(f'127.0.0.1:{s.port}' for s in self.sentinels)}/{SERVICE}/0"

    def master_port(self) -> int | None:
        for node in self.sentinels:
            try:
                _, port = redis.Redis(port=node.port, socket_timeout=1).sentinel_get_master_addr_by_name(SERVICE)
                return int(port)
            except (redis.ConnectionError, redis.TimeoutError, TypeError):
                continue
        return None

    def _wait_replicated(self) -> None:
        deadline = time.monotonic() + 20
        replica = redis.Redis(port=self.replica.port, **self.auth)
        while time.monotonic() < deadline:
            info = replica.info("replication")
            known = [redis.Redis(port=s.port).sentinel_master(SERVICE) for s in self.sentinels]
            if info.get("master_link_status") == "up" and all(int(m.get("num-other-sentinels", 0)) == 2 for m in known):
                return
            time.sleep(0.1)
        raise RuntimeError("the replica or the sentinels did not come up")

    def stop(self) -> None:
        for node in [*self.sentinels, self.replica, self.primary]:
            node.stop()
        shutil.rmtree(self.primary.work.parent, ignore_errors=True)


CLUSTER_NODE_TIMEOUT_MS = 1000  # Redis's default is 15 s
CLUSTER_BUS_OFFSET = 10000  # a cluster node also listens on its port + 10000 (the cluster bus)


def cluster_port() -> int:
    """A free port whose cluster-bus port (+ 10000) is free too and below 65536."""
    while True:
        port = free_port()
        if port + CLUSTER_BUS_OFFSET < 65536:
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port + CLUSTER_BUS_OFFSET))
                    return port
                except OSError:
                    continue


class ClusterSet:
    """Three masters with one replica each (`redis-cli --cluster create`), failing a master over one second after it
    stops answering."""

    def __init__(self, work: Path, acl: Path | None = None) -> None:
        """With `acl`: every node takes that ACL file, replicas link up as `ovq-replica` (deploy/redis/
        users-cluster.acl's users), and the set's own checks log in as `admin`."""
        secured = ("--aclfile", str(acl), "--masteruser", "ovq-replica", "--masterauth", "change-me-replica") \
            if acl else ()
        self.auth = {"username": "admin", "password": "admin-pw"} if acl else {}
        login = ["--user", "admin", "--pass", "admin-pw", "--no-auth-warning"] if acl else []
        self.nodes: list[Node] = []
        try:
            for i in range(6):
                port = cluster_port()
                self.nodes.append(Node(work / f"node{i}", DEBIAN_REDIS, "--port", str(port), "--bind", "127.0.0.1",
                                       "--dir", str(work / f"node{i}"), "--save", "", "--appendonly", "yes",
                                       "--loglevel", "warning", "--cluster-enabled", "yes",
                                       "--cluster-config-file", "nodes.conf",
                                       "--cluster-node-timeout", str(CLUSTER_NODE_TIMEOUT_MS), *secured,
                                       port=port).start(self.auth))
            subprocess.run(["redis-cli", *login, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes),
                            "--cluster-replicas", "1", "--cluster-yes"], check=True, capture_output=True, timeout=60)
            self._wait_ok()
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return self.url_for()

    def url_for(self, user: str = "", password: str = "") -> str:
        login = f"{user}:{password}@" if password else ""
        return f"redis+cluster://{login}{','.join(f'127.0.0.1:{n.port}' for n in self.nodes[:3])}"

    def client(self) -> redis.RedisCluster:
        return redis.RedisCluster(host="127.0.0.1", port=self.nodes[0].port, **self.auth)

    def node(self, port: int) -> Node:
        return next(n for n in self.nodes if n.port == port)

    def move_slot(self, slot: int, to_port: int, batch: int = 5, pause_s: float = 0.02) -> int:
        """Reshard one slot to the master on `to_port` as `redis-cli --cluster reshard` does: the target IMPORTING,
        the owner MIGRATING, its keys MIGRATEd a few at a time (slowly: clients meanwhile meet ASK and TRYAGAIN),
        then every master told the slot's new owner. Returns how many keys moved."""
        source = self._owner(slot)
        target = redis.Redis(port=to_port, **self.auth)
        source_id, target_id = source.cluster("myid"), target.cluster("myid")
        target.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
        source.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)
        login = ["AUTH2", self.auth["username"], self.auth["password"]] if self.auth else []
        moved = 0
        while keys := source.execute_command("CLUSTER GETKEYSINSLOT", slot, batch):
            source.execute_command("MIGRATE", "127.0.0.1", to_port, "", 0, 5000, *login, "KEYS", *keys)
            moved += len(keys)
            time.sleep(pause_s)
        for node in (target, source, *self._masters()):
            node.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
        return moved

    def _masters(self) -> list[redis.Redis]:
        nodes = [redis.Redis(port=n.port, **self.auth) for n in self.nodes if n.process and n.process.poll() is None]
        return [n for n in nodes if n.info("replication")["role"] == "master"]

    def _owner(self, slot: int) -> redis.Redis:
        client = self.client()
        try:
            return redis.Redis(port=int(client.nodes_manager.get_node_from_slot(slot).port), **self.auth)
        finally:
            client.close()

    def _wait_ok(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            infos = [redis.Redis(port=n.port, **self.auth).cluster("info") for n in self.nodes]
            links = [redis.Redis(port=n.port, **self.auth).info("replication") for n in self.nodes]
            replicas = [r for r in links if r.get("role") == "slave"]
            if all(i.get("cluster_state") == "ok" and int(i.get("cluster_known_nodes", 0)) == 6 for i in infos) \
                    and len(replicas) == 3 and all(r.get("master_link_status") == "up" for r in replicas):
                return
            time.sleep(0.1)
        raise RuntimeError("the cluster did not come up")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        if self.nodes:
            shutil.rmtree(self.nodes[0].work.parent, ignore_errors=True)
