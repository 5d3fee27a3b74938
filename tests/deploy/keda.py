"""What KEDA's redis-streams scaler and the HPA it drives compute for a ScaledObject, read from a real Redis.

It mirrors kedacore/keda `pkg/scalers/redis_streams_scaler.go`: with `consumerGroup` and `lagCount` the metric is
the group's `lag` (XINFO GROUPS, Redis >= 7); with `consumerGroup` alone it is XPENDING's count (jobs already
delivered, `pendingEntriesCount` the target, and `streamLength` ignored); without `consumerGroup` it is XLEN,
with `streamLength` the target. The HPA (an AverageValue target, KEDA's default for this scaler) then asks for

    desired replicas = ceil(metric / target), within [minReplicaCount, maxReplicaCount]

and keeps the current count while metric / (target * current) is within its 10 % tolerance of 1.
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
    mode: Literal["lag", "pending", "length"]
    target: int
    group: str | None
    min_replicas: int
    max_replicas: int

    @classmethod
    def from_scaled_object(cls, doc: dict[str, Any]) -> StreamScaler:
        spec = doc["spec"]
        (trigger,) = [t for t in spec["triggers"] if t["type"] == "redis-streams"]
        meta = trigger["metadata"]
        group = meta.get("consumerGroup")
        if group and "lagCount" in meta:
            mode, target = "lag", meta["lagCount"]
        elif group:
            mode, target = "pending", meta.get("pendingEntriesCount", KEDA_DEFAULT_TARGET)
        else:
            mode, target = "length", meta.get("streamLength", KEDA_DEFAULT_TARGET)
        # KEDA's defaults when the ScaledObject leaves them out.
        return cls(stream=meta["stream"], mode=mode, target=int(target), group=group,
                   min_replicas=int(spec.get("minReplicaCount", 0)), max_replicas=int(spec.get("maxReplicaCount", 100)))

    @classmethod
    def from_file(cls, path: Path) -> StreamScaler:
        (doc,) = [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == "ScaledObject"]
        return cls.from_scaled_object(doc)

    def metric(self, client: redis.Redis) -> int:
        """What the scaler reads from Redis, as KEDA would see it."""
        if self.mode == "length":
            return int(client.xlen(self.stream))
        if self.mode == "pending":
            return int(client.xpending(self.stream, self.group)["pending"])
        group = next(g for g in client.xinfo_groups(self.stream) if g["name"].decode() == self.group)
        # Redis 6.2 has no `lag`; Redis 7 reports nil when it cannot tell. go-redis hands KEDA 0 for nil (-1 in
        # its newest releases): no scale-up either way.
        return int(group.get("lag") or 0)

    def desired_replicas(self, metric: float, current: int | None = None) -> int:
        return desired_replicas(metric, self.target, self.min_replicas, self.max_replicas, current)
