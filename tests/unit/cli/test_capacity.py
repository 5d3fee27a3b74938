"""The capacity model: each tier's CPU is the sum of its unit costs times the load, steps follow from streams per
busy worker, and a plan adds API processes and Redis masters until each stays under its headroom."""
from __future__ import annotations

import pytest

from cli.capacity import Costs, Load, TierCosts, plan, predict


def tier(idle_w: float = 0, idle_a: float = 0, request: float = 0, token: float = 0, step: float = 0,
         tenant: float = 0) -> TierCosts:
    return TierCosts(idle_per_worker_us=idle_w, idle_per_api_us=idle_a, per_request_us=request, per_token_us=token,
                     per_step_us=step, per_tenant_request_us=tenant)


COSTS = Costs(measured="by hand", api=tier(idle_a=1_000, request=400, token=20, step=5, tenant=50),
              workers=tier(idle_w=200, request=300, token=10, step=50), redis=tier(idle_w=40, request=100, step=8))


@pytest.mark.parametrize(("streams", "workers", "steps"), [(64, 2, 20.0), (64, 64, 640.0), (8, 100, 640.0),
                                                            (32, 8, 160.0)])
def test_steps_are_tokens_over_streams_per_busy_worker(streams: int, workers: int, steps: float) -> None:
    load = Load(requests_per_s=10, tokens_per_s=640, streams=streams, workers=workers, apis=1)
    assert load.steps_per_s == pytest.approx(steps)


def test_each_tier_is_its_unit_costs_times_the_load() -> None:
    load = Load(requests_per_s=100, tokens_per_s=6_400, streams=64, workers=4, apis=2)  # 400 steps/s
    cores = predict(load, COSTS)
    assert cores["api"] == pytest.approx((2 * 1_000 + 100 * 400 + 6_400 * 20 + 400 * 5) / 1e6)
    assert cores["workers"] == pytest.approx((4 * 200 + 100 * 300 + 6_400 * 10 + 400 * 50) / 1e6)
    assert cores["redis"] == pytest.approx((4 * 40 + 100 * 100 + 400 * 8) / 1e6)


def test_tenants_cost_each_request_their_share_of_the_fair_order() -> None:
    plain = Load(requests_per_s=100, tokens_per_s=6_400, streams=64, workers=4, apis=2)
    shared = plain.model_copy(update={"tenants": 3})
    assert predict(shared, COSTS)["api"] - predict(plain, COSTS)["api"] == pytest.approx(100 * 50 / 1e6)
    assert predict(shared, COSTS)["redis"] == predict(plain, COSTS)["redis"]
    assert plan(shared, COSTS).api_jobs_per_s_limit < plan(plain, COSTS).api_jobs_per_s_limit


def test_the_same_tokens_cost_more_steps_spread_over_more_workers() -> None:
    few = predict(Load(requests_per_s=10, tokens_per_s=1_000, streams=64, workers=2, apis=1), COSTS)
    many = predict(Load(requests_per_s=10, tokens_per_s=1_000, streams=64, workers=64, apis=1), COSTS)
    assert many["redis"] - few["redis"] == pytest.approx((64 * 40 + 1_000 * 8 - 2 * 40 - 1_000 / 32 * 8) / 1e6)


def test_a_plan_keeps_every_api_process_and_master_under_its_headroom() -> None:
    load = Load(requests_per_s=3_000, tokens_per_s=30_000, streams=3_000, workers=300, apis=1)
    result = plan(load, COSTS, headroom=0.5)
    api = predict(result.load, COSTS)["api"]
    assert api <= 0.5 * result.api_processes
    assert predict(result.load.model_copy(update={"apis": result.api_processes - 1}), COSTS)["api"] > \
        0.5 * (result.api_processes - 1)
    assert result.redis_masters == -(-result.cores["redis"] // 0.5)
    # One master at half a core: 0.5 s of CPU a second over what a request costs it at this shape.
    per_request = 100 + 8 * load.steps_per_s / 3_000
    assert result.redis_jobs_per_s_limit == pytest.approx(0.5e6 / per_request)


def test_an_idle_cost_above_the_headroom_does_not_grow_the_plan_forever() -> None:
    costs = COSTS.model_copy(update={"api": tier(idle_a=900_000)})
    result = plan(Load(requests_per_s=1, tokens_per_s=1, streams=1, workers=1, apis=1), costs, headroom=0.5)
    assert result.api_processes == 4096
    assert result.api_jobs_per_s_limit is None  # requests cost the API nothing here


def test_the_shipped_costs_say_where_they_were_measured() -> None:
    shipped = Costs.load()
    assert "benchmarks/capacity.py" in shipped.measured
    assert all(getattr(shipped, t).per_request_us > 0 for t in ("api", "workers", "redis"))
