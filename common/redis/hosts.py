"""The host list of a multi-node Redis URL (Sentinel's sentinels, a Cluster's seed nodes)."""
from __future__ import annotations


def host_list(hosts: str, default_port: int) -> list[tuple[str, int]]:
    """`h1:p1,h2,[::1]:p3` as (host, port) pairs, `default_port` where none is given; ValueError on a bad port."""
    return [(host.rpartition(":")[0].strip("[]") or "localhost", int(host.rpartition(":")[2] or default_port))
            if ":" in host else (host, default_port) for host in hosts.split(",") if host]
