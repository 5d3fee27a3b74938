"""A worker's probe port, built from what it reads (no worker): live, ready or why not, and its metrics."""
from __future__ import annotations

from dataclasses import replace

import httpx
import pytest

from common.modelcard import ModelCard
from common.servable import ServableType
from workers.ops.health import HealthServer, readiness
from workers.vitals import Member, Vitals

MEMBER = Member("w1", "m", "CPU", "s:jobs", "s:batch", started=1.0)
VITALS = Vitals(card=ModelCard(name="m", device="CPU", servable_type=ServableType.LM_CB, created=1),
                capacity=4, running=1, draining=False, engine_alive=True, engine=[3, 2, 25.0, 7], jobs_taken=7,
                reclaimed=2, tokens_generated=100, engine_restarts=0, listeners=frozenset(), port=0,
                redis_silent_s=0.5)


@pytest.mark.parametrize(("change", "why"), [
    ({}, "ready"),
    ({"draining": True}, "draining"),
    ({"engine_alive": False}, "engine not running"),
    ({"redis_silent_s": 4.5}, "Redis unreachable"),  # three missed beats of 1 s, and a second's slack
])
def test_readiness(change: dict, why: str) -> None:
    assert readiness(replace(VITALS, **change), heartbeat_s=1.0) == (why == "ready", why)


async def test_the_port_answers_probes_and_metrics() -> None:
    now = [VITALS]
    server = HealthServer(MEMBER, lambda: now[0], 1.0, "127.0.0.1", 0)
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
            assert (await client.get("/live")).json() == {"live": True, "worker": "w1"}
            assert (await client.get("/ready")).status_code == 200
            now[0] = replace(VITALS, draining=True)
            ready = await client.get("/ready")
            assert (ready.status_code, ready.json()) == (503, {"ready": False, "reason": "draining"})
            metrics = (await client.get("/metrics")).text
            assert 'ovq_worker_draining{device="CPU",model="m"} 1.0' in metrics
            assert 'ovq_worker_reclaimed_jobs_total{device="CPU",model="m"} 2.0' in metrics
            assert 'ovq_worker_prefill_waiting_tokens{device="CPU",model="m"} 7.0' in metrics
            assert (await client.get("/nope")).status_code == 404
    finally:
        await server.stop()
