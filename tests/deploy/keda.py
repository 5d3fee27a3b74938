"""What KEDA's redis-streams and redis (list) scalers and the HPA they drive compute for a ScaledObject, read from a
real Redis.

It mirrors kedacore/keda `pkg/scalers/redis_streams_scaler.go`: with `consumerGroup` and `lagCount` the metric is
the group's `lag` (XINFO GROUPS, Redis >= 7); with `consumerGroup` alone it is XPENDING's count (jobs already
delivered, `pendingEntriesCount` the target, and `streamLength` ignored); without `consumerGroup` it is XLEN,
with `streamLength` the target; in every mode the trigger is active while the metric is above
`activationLagCount` (default 0). `redis_scaler.go` (a list): LLEN, `listLength` the target, active above
`activationListLength`. The HPA (an AverageValue target, KEDA's default for these scalers) then asks for

    desired replicas = ceil(metric / target), within [minReplicaCount, maxReplicaCount]

and keeps the current count while metric / (target * current) is within its 10 % tolerance of 1. With several
triggers it takes the largest. With minReplicaCount 0, KEDA itself takes the workload to zero when no trigger is
active (after its cooldownPeriod), and from zero to max(1, the HPA's count) as soon as one is.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import redis
import yaml

HPA_TOLERANCE = 0.1
KEDA_DEFAULT_TARGET = 5  # defaultTargetEntries / defaultTargetLag in the scaler


def desired_replicas(metric: float, target: float, min_replicas: int, max_replicas: int,
                     current: int | None = None, tolerance: float = HPA_TOLERANCE) -> int:
    """The replica count the HPA asks for on one External metric with an AverageValue target."""
    if min_replicas == 0 and metric <= 0:
        return 0  # KEDA deactivates the workload (scale to zero) when the scaler is not active
    if current and abs(metric / (target * current) - 1) <= tolerance:
        wanted = current
    else:
        wanted = math.ceil(metric / target)
    return max(min_replicas, min(max_replicas, wanted))


@dataclass(frozen=True)
class StreamScaler:
    stream: str
    mode: Literal["lag", "pending", "length", "list"]
    target: int
    group: str | None
    min_replicas: int
    max_replicas: int
    activation: int = 0  # active while the metric is above this

    @classmethod
    def from_trigger(cls, trigger: dict[str, Any], spec: dict[str, Any]) -> StreamScaler:
        meta = trigger["metadata"]
        group = meta.get("consumerGroup")
        activation = meta.get("activationLagCount", 0)
        if trigger["type"] == "redis":
            mode, target, activation = "list", meta.get("listLength", KEDA_DEFAULT_TARGET), \
                meta.get("activationListLength", 0)
        elif group and "lagCount" in meta:
            mode, target = "lag", meta["lagCount"]
        elif group:
            mode, target = "pending", meta.get("pendingEntriesCount", KEDA_DEFAULT_TARGET)
        else:
            mode, target = "length", meta.get("streamLength", KEDA_DEFAULT_TARGET)
        # KEDA's defaults when the ScaledObject leaves them out.
        return cls(stream=meta["listName"] if mode == "list" else meta["stream"], mode=mode, target=int(target),
                   group=group, min_replicas=int(spec.get("minReplicaCount", 0)),
                   max_replicas=int(spec.get("maxReplicaCount", 100)), activation=int(activation))

    @classmethod
    def from_scaled_object(cls, doc: dict[str, Any]) -> StreamScaler:
        """The ScaledObject's trigger on the first stream it lists (the interactive one)."""
        spec = doc["spec"]
        trigger = next(t for t in spec["triggers"] if t["type"] == "redis-streams")
        return cls.from_trigger(trigger, spec)

    @classmethod
    def from_file(cls, path: Path) -> StreamScaler:
        return cls.from_scaled_object(scaled_object(path))

    def metric(self, client: redis.Redis) -> int:
        """What the scaler reads from Redis, as KEDA would see it."""
        if self.mode == "list":
            return int(client.llen(self.stream))
        if self.mode == "length":
            return int(client.xlen(self.stream))
        if self.mode == "pending":
            return int(client.xpending(self.stream, self.group)["pending"])
        group = next(g for g in client.xinfo_groups(self.stream) if g["name"].decode() == self.group)
        # Redis 6.2 has no `lag`; Redis 7 reports nil when it cannot tell. go-redis hands KEDA 0 for nil (-1 in
        # its newest releases): no scale-up either way.
        return int(group.get("lag") or 0)

    def active(self, metric: float) -> bool:
        return metric > self.activation

    def desired_replicas(self, metric: float, current: int | None = None) -> int:
        return desired_replicas(metric, self.target, self.min_replicas, self.max_replicas, current)


def scaled_object(path: Path) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == "ScaledObject"]
    return doc


@dataclass(frozen=True)
class Workload:
    """Every trigger of one ScaledObject: KEDA's activation (to and from zero) and the HPA's count over them."""
    scalers: tuple[StreamScaler, ...]
    min_replicas: int
    max_replicas: int

    @classmethod
    def from_file(cls, path: Path) -> Workload:
        spec = scaled_object(path)["spec"]
        scalers = tuple(StreamScaler.from_trigger(t, spec) for t in spec["triggers"] if t["type"].startswith("redis"))
        return cls(scalers, int(spec.get("minReplicaCount", 0)), int(spec.get("maxReplicaCount", 100)))

    def metrics(self, client: redis.Redis) -> list[int]:
        return [scaler.metric(client) for scaler in self.scalers]

    def desired_replicas(self, client: redis.Redis, current: int | None = None) -> int:
        """Zero when no trigger is active and zero is allowed (KEDA deactivates the workload); else the HPA's
        largest count over the triggers, at least one (the HPA KEDA makes never goes below one)."""
        metrics = self.metrics(client)
        active = any(s.active(m) for s, m in zip(self.scalers, metrics, strict=True))
        if not active and self.min_replicas == 0:
            return 0
        wanted = max(desired_replicas(m, s.target, 1, self.max_replicas, current or None)
                     for s, m in zip(self.scalers, metrics, strict=True))
        return max(self.min_replicas, 1, wanted)
