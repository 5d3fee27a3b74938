"""A worker's own metrics, read from its vitals at scrape time."""
from __future__ import annotations

from dataclasses import replace

from prometheus_client.parser import text_string_to_metric_families

from common.modelcard import ModelCard
from common.servable import ServableType
from workers.ops.metrics import render
from workers.vitals import Member, Vitals

MEMBER = Member("w1", "m", "CPU", "s:jobs", "s:batch", started=1.0)
VITALS = Vitals(card=ModelCard(name="m", device="CPU", servable_type=ServableType.LM_CB, created=1),
                capacity=256, running=30, draining=False, engine_alive=True, engine=[30, 30, 25.0, 0], jobs_taken=7,
                reclaimed=0, tokens_generated=100, engine_restarts=0, listeners=frozenset(), port=0, redis_silent_s=0.0)


def samples(vitals: Vitals) -> dict[str, float]:
    text = render(MEMBER, vitals).decode()
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}


def test_the_learned_knee_and_the_limit_are_gauges() -> None:
    got = samples(replace(VITALS, admission_knee=53, admission_limit=21))
    assert got["ovq_worker_admission_knee_sequences"] == 53 and got["ovq_worker_admission_limit_sequences"] == 21


def test_a_worker_without_a_knee_shows_none() -> None:
    assert "ovq_worker_admission_knee_sequences" not in samples(VITALS)
