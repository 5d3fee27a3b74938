"""The LoRA adapters loaded onto a model at run time, as its workers read them, and the lock that makes the model's
workers rebuild their engines one at a time.

The admin API records each adapter in the model's hash (`Keys.lora`, api/openai/lora.py). GenAI registers adapters
when the pipeline is built, so a worker that sees the set change rebuilds its engine with it (`TextWorker`), one
worker of the model at a time: the others keep serving meanwhile (a rolling restart). The lock is a plain key with
a TTL, so a worker that dies holding it blocks the others for OVQ_LORA_REBUILD_LOCK_S at most.
"""
from __future__ import annotations

import json
import logging
import struct
from typing import Any

from common.keys import Keys
from workers.engine import lora

log = logging.getLogger("ovq.worker")


class RuntimeAdapters:
    def __init__(self, redis: Any, keys: Keys, model: str, worker_id: str, lock_s: float) -> None:
        self.redis, self.worker_id, self.lock_s = redis, worker_id, lock_s
        self.key, self.lock_key = keys.lora(model), keys.lora_rebuild(model)
        self._checked: dict[tuple[str, str], bool] = {}  # (name, path) -> readable: each file is read once

    async def read(self) -> dict[str, dict[str, Any]]:
        """name -> {"path", "alpha"} of every adapter recorded whose file this worker can read (one it cannot is
        left out, logged once: its jobs end with a 404 here rather than break the engine's start)."""
        out: dict[str, dict[str, Any]] = {}
        for raw_name, raw in (await self.redis.hgetall(self.key)).items():
            name = raw_name.decode() if isinstance(raw_name, bytes) else raw_name
            try:
                record = json.loads(raw)
                path, alpha = str(record["path"]), float(record.get("alpha", 1.0))
            except (ValueError, KeyError, TypeError) as exc:
                log.error("LoRA adapter %r: unreadable record %r (%s)", name, raw, exc)
                continue
            if self._readable(name, path):
                out[name] = {"path": path, "alpha": alpha}
        return out

    def _readable(self, name: str, path: str) -> bool:
        known = self._checked.get((name, path))
        if known is None:
            try:
                lora.read(path)
                known = True
            except (OSError, ValueError, KeyError, struct.error) as exc:
                log.error("LoRA adapter %r is not loaded on this worker: %s: %s", name, path, exc)
                known = False
            self._checked[(name, path)] = known
        return known

    async def lock(self) -> bool:
        """Take the model's rebuild turn (False: another worker has it)."""
        return bool(await self.redis.set(self.lock_key, self.worker_id, nx=True, px=int(self.lock_s * 1000)))

    async def unlock(self) -> None:
        # Read, then delete: a turn that expired meanwhile and went to another worker is left to it (the window
        # between the two commands is a round trip; the TTL bounds the rest).
        holder = await self.redis.get(self.lock_key)
        if holder is not None and (holder.decode() if isinstance(holder, bytes) else holder) == self.worker_id:
            await self.redis.delete(self.lock_key)
