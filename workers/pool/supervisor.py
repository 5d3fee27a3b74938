"""A pool worker (`ovq worker --pool --device CPU`): serves any model of the models file on its device, loading
what the fleet's waiting work asks for and unloading what has been idle for its `keep_alive`.

Each resident model is an ordinary worker of its kind (workers/kinds.py), hosted in this process on its loop: its
I/O half here, its engine in a process of its own, its heartbeat and card announcing it as any dedicated worker's
do, so the API, the reclaimer and the ops page see nothing new. Unloading one is a drain (`BaseWorker.stop`): it
takes no new job, its running jobs finish (or are handed back after the grace period), its engine stops. What to
load and unload is decided each tick by `workers/pool/policy.py` from `workers/pool/demand.py`'s counts.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from common.models.config import ModelConfig
from common.models.prepare import prepare
from common.redis.client import UNAVAILABLE, connect, keys_for
from common.settings import Settings
from workers.base import BaseWorker
from workers.kinds import worker_class
from workers.pool import demand
from workers.pool.footprint import footprint
from workers.pool.policy import Limits, Plan, Resident, decide

log = logging.getLogger("ovq.pool")

TICK_S = 0.5
CLAIM_TTL_S = 60  # a load's claim (Keys.pool_claim), renewed each tick while it loads
FAILED_BACKOFF_S = 60.0  # a model whose load failed is not tried again for this long


@dataclass
class Hosted:
    """A model this pool hosts: its worker and where it is in its life."""

    model: ModelConfig
    footprint: int
    worker: BaseWorker | None = None
    task: asyncio.Task[None] | None = None
    state: str = "loading"  # loading, serving, unloading
    began: float = field(default_factory=time.monotonic)  # when its load began
    idle_since: float | None = None
    load_s: float | None = None


@dataclass
class Counters:
    loads: int = 0
    unloads: int = 0
    load_s: float = 0.0  # summed over the loads
    unload_s: float = 0.0  # summed over the unloads: drain, engine stop
    failed: int = 0


class Pool:
    def __init__(self, settings: Settings, models: list[ModelConfig], device: str) -> None:
        self.settings, self.device = settings, device
        self.id = f"pool-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.keys = keys_for(settings)
        self.models = {m.name: m for m in models if device in [d.upper() for d in m.devices]}
        self.first_devices = {m.name: m.devices[0].upper() for m in models if m.devices}
        self.footprints = {name: footprint(m) for name, m in self.models.items()}
        self.limits = Limits(budget=settings.pool_memory_mb << 20, min_residency_s=settings.pool_min_residency_s,
                             starve_s=min(settings.pool_max_wait_s, settings.queue_timeout_s / 2))
        # Hosted workers need no probe port of their own (they would share one), nor a pool's signals.
        self.hosted_settings = settings.model_copy(update={"worker_port": None})
        self.hosted: dict[str, Hosted] = {}
        self.counters = Counters()
        self.failed_at: dict[str, float] = {}
        self.redis = connect(settings, max_connections=4)
        self._stopping = asyncio.Event()
        for name, size in self.footprints.items():
            if size > self.limits.budget:
                log.warning("pool %s: %s needs about %d MiB, over the budget of %d MiB (OVQ_POOL_MEMORY_MB): it is "
                            "never loaded here", self.id, name, size >> 20, settings.pool_memory_mb)

    # ---- the loop --------------------------------------------------------------------------------------
    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop, sig.name)
        log.info("pool %s on %s: %d models, %d MiB", self.id, self.device, len(self.models),
                 self.settings.pool_memory_mb)
        while not self._stopping.is_set():
            try:
                await self.tick()
            except UNAVAILABLE as exc:  # hosted workers ride the outage out on their own; decide again later
                log.warning("pool %s: Redis unavailable (%s)", self.id, exc)
            except Exception:  # a tick that fails must not take the hosted workers down with the pool
                log.exception("pool %s: a tick failed; trying again", self.id)
            try:
                await asyncio.wait_for(self._stopping.wait(), TICK_S)
            except asyncio.TimeoutError:
                pass
        await self._shutdown()

    def stop(self, why: str) -> None:
        log.warning("pool %s stopping (%s): its workers drain", self.id, why)
        self._stopping.set()

    async def tick(self) -> None:
        self._reap()
        now = time.monotonic()
        for h in self.hosted.values():
            if h.state == "serving" and h.worker is not None:
                busy = bool(h.worker.running)
                h.idle_since = None if busy else (h.idle_since or now)
        wanted = [m for m in self.models if now - self.failed_at.get(m, -FAILED_BACKOFF_S) >= FAILED_BACKOFF_S]
        found = await demand.read(self.redis, self.keys, wanted, self.device, self.settings.worker_ttl_s,
                                  self.first_devices, self.id)
        plan = decide(self.residents(), found, {m: self.footprints[m] for m in wanted}, self._limits(), now,
                      loading=any(h.state != "serving" for h in self.hosted.values()))
        await self.act(plan)
        await self.announce()

    def residents(self) -> list[Resident]:
        """What the policy may keep or unload: the models serving or loading (one unloading counts in `_limits`)."""
        default = self.settings.model_keep_alive_s
        out = []
        for name, h in self.hosted.items():
            if h.state == "unloading":
                continue
            keep = h.worker.keep_alive_s if h.worker is not None and h.worker.keep_alive_s is not None else default
            running = len(h.worker.running) if h.worker is not None else 0
            out.append(Resident(name, h.footprint, h.began, h.idle_since if h.state == "serving" else None, keep,
                                running))
        return out

    def _limits(self) -> Limits:
        """The budget less what models still unloading hold."""
        held = sum(h.footprint for h in self.hosted.values() if h.state == "unloading")
        return replace(self.limits, budget=self.limits.budget - held)

    async def act(self, plan: Plan) -> None:
        """Unloads at once; a load only once nothing is unloading: the memory it needs is free only then (a swap's
        load follows its victims' ends, a tick or so later, when the policy still wants it). A load claims its model
        first (`Keys.pool_claim`): two pools that see the same waiting work load different models."""
        for name in plan.unload:
            self.unload(name, plan.why)
        if plan.load is not None and not any(h.state == "unloading" for h in self.hosted.values()):
            claim = self.keys.pool_claim(plan.load, self.device)
            if await self.redis.set(claim, self.id, nx=True, ex=CLAIM_TTL_S):
                self.load(plan.load, plan.why)
        loading = [self.keys.pool_claim(n, self.device) for n, h in self.hosted.items() if h.state == "loading"]
        if loading:
            pipe = self.redis.pipeline(transaction=False)
            for claim in loading:
                pipe.expire(claim, CLAIM_TTL_S)
            await pipe.execute()

    async def _release(self, name: str) -> None:
        """Its load ended (serving, or failed): other pools may load the model too, as its demand says."""
        try:
            await self.redis.delete(self.keys.pool_claim(name, self.device))
        except UNAVAILABLE:
            pass  # its TTL ends it

    # ---- loading and unloading -------------------------------------------------------------------------
    def load(self, name: str, why: str) -> None:
        model = self.models[name]
        hosted = self.hosted[name] = Hosted(model, self.footprints[name])
        log.info("pool %s: loading %s (%s; about %d MiB)", self.id, name, why, hosted.footprint >> 20)
        hosted.task = asyncio.create_task(self._host(hosted), name=f"pool-{name}")

    async def _host(self, hosted: Hosted) -> None:
        """Prepare the model and build its worker (off the loop), start it, run it until it stops."""
        model = hosted.model
        try:
            # Off the loop, which runs the other resident models' I/O: a GGUF's conversion, the tokenizer's load.
            worker = await asyncio.get_running_loop().run_in_executor(None, self._build, model)
        except BaseException:
            await asyncio.shield(self._release(model.name))
            raise
        worker.pool = self.id
        hosted.worker = worker
        serving = asyncio.create_task(worker.serving.wait())
        running = asyncio.create_task(worker.run(signals=False))
        await asyncio.wait([serving, running], return_when=asyncio.FIRST_COMPLETED)
        await self._release(model.name)
        if serving.done() and hosted.state == "loading":
            hosted.state, hosted.load_s = "serving", time.monotonic() - hosted.began
            hosted.idle_since = time.monotonic()
            self.counters.loads += 1
            self.counters.load_s += hosted.load_s
            log.info("pool %s: %s serving after %.2fs", self.id, model.name, hosted.load_s)
        serving.cancel()
        await running

    def _build(self, model: ModelConfig) -> BaseWorker:
        prepare(model)
        worker: BaseWorker = worker_class(model, self.device)(self.hosted_settings, model, self.device)
        return worker

    def unload(self, name: str, why: str) -> None:
        hosted = self.hosted.get(name)
        if hosted is None or hosted.state == "unloading":
            return
        log.info("pool %s: unloading %s (%s)", self.id, name, why)
        hosted.state, hosted.began = "unloading", time.monotonic()
        if hosted.worker is not None:
            hosted.worker.stop(f"pool {self.id}: {why}")
        elif hosted.task is not None:  # still preparing: nothing to drain
            hosted.task.cancel()

    def _reap(self) -> None:
        """Forget the hosted workers whose run ended: unloaded as asked, or failed (then not tried for a while)."""
        for name, h in list(self.hosted.items()):
            if h.task is None or not h.task.done():
                continue
            del self.hosted[name]
            error = None if h.task.cancelled() else h.task.exception()
            if h.state == "unloading" and error is None:
                self.counters.unloads += 1
                self.counters.unload_s += time.monotonic() - h.began
                continue
            self.counters.failed += 1
            self.failed_at[name] = time.monotonic()
            log.error("pool %s: %s stopped unasked (%s); not loaded again for %.0fs", self.id, name,
                      error or "its worker exited", FAILED_BACKOFF_S, exc_info=error)

    async def _shutdown(self) -> None:
        for name in list(self.hosted):
            self.unload(name, "the pool stops")
        tasks = [h.task for h in self.hosted.values() if h.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=self.settings.shutdown_grace_s + 30)
        self._reap()
        try:
            await self.redis.delete(self.keys.pool(self.id))
            await self.redis.zrem(self.keys.pools, self.id)
        except UNAVAILABLE:
            pass
        await self.redis.aclose()

    # ---- what operators see ----------------------------------------------------------------------------
    def record(self) -> dict[str, Any]:
        now = time.monotonic()
        c = self.counters
        hosted = [{"model": name, "state": h.state, "footprint": h.footprint, "for_s": round(now - h.began, 2),
                   "idle_s": round(now - h.idle_since, 2) if h.idle_since is not None else None,
                   "load_s": h.load_s, "worker": h.worker.id if h.worker is not None else ""}
                  for name, h in sorted(self.hosted.items())]
        return {"device": self.device, "host": socket.gethostname(), "pid": os.getpid(), "heartbeat": time.time(),
                "budget": self.limits.budget, "used": sum(h.footprint for h in self.hosted.values()),
                "models": json.dumps(hosted), "known": len(self.models), "loads": c.loads, "unloads": c.unloads,
                "load_s": round(c.load_s, 3), "unload_s": round(c.unload_s, 3), "failed": c.failed}

    async def announce(self) -> None:
        now = time.time()
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.keys.pool(self.id), mapping=self.record())
        pipe.pexpire(self.keys.pool(self.id), int(self.settings.worker_ttl_s * 1000))
        pipe.zadd(self.keys.pools, {self.id: now})
        pipe.zremrangebyscore(self.keys.pools, "-inf", now - 10 * self.settings.worker_ttl_s)
        pipe.expire(self.keys.pools, 3600)
        await pipe.execute()
