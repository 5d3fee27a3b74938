"""The pool's decisions: what loads, what is swapped out, what stays, and what is unloaded after keep_alive."""
from __future__ import annotations

from workers.pool.policy import Demand, Limits, Plan, Resident, decide, rank

MB = 1 << 20
LIMITS = Limits(budget=100 * MB, min_residency_s=10, age_doubling_s=10, starve_s=150, served_grace_s=2)
SIZES = {"a": 40 * MB, "b": 40 * MB, "c": 40 * MB, "huge": 200 * MB}


def resident(model: str, loaded_at: float = 0.0, idle_since: float | None = None, keep_alive_s: float = 300.0,
             footprint: int | None = None, running: int = 0) -> Resident:
    return Resident(model, SIZES[model] if footprint is None else footprint, loaded_at, idle_since, keep_alive_s,
                    running)


def test_nothing_waits_nothing_loads() -> None:
    assert decide([], {}, SIZES, LIMITS, now=100) == Plan()


def test_the_model_with_the_most_waiting_tokens_loads_first() -> None:
    demand = {"a": Demand(waiting=1, tokens=100, oldest_s=1), "b": Demand(waiting=3, tokens=900, oldest_s=1)}
    assert decide([], demand, SIZES, LIMITS, now=100).load == "b"


def test_age_weighs_in_against_tokens() -> None:
    """Fewer tokens that waited longer outrank more that just came: each age_doubling_s doubles a score."""
    demand = {"a": Demand(waiting=1, tokens=300, oldest_s=30), "b": Demand(waiting=1, tokens=1000, oldest_s=0)}
    assert rank(demand, LIMITS) == ["a", "b"]


def test_a_starving_model_comes_first_whatever_its_tokens() -> None:
    demand = {"a": Demand(waiting=1, tokens=1, oldest_s=151), "b": Demand(waiting=50, tokens=10**6, oldest_s=100)}
    assert rank(demand, LIMITS)[0] == "a"


def test_several_small_models_stay_resident_within_the_budget() -> None:
    """Room for a second: it loads beside the first, nothing is unloaded."""
    plan = decide([resident("a", idle_since=90)], {"b": Demand(1, 10, 1)}, SIZES, LIMITS, now=100)
    assert plan == Plan(unload=[], load="b", why=plan.why)


def test_one_load_at_a_time() -> None:
    plan = decide([resident("a")], {"b": Demand(1, 10, 1)}, SIZES, LIMITS, now=100, loading=True)
    assert plan.load is None and plan.unload == []


def test_no_room_an_idle_resident_makes_way() -> None:
    residents = [resident("a", idle_since=95), resident("b", idle_since=None)]
    plan = decide(residents, {"c": Demand(2, 50, 3)}, SIZES, LIMITS, now=100)
    assert plan.load == "c" and plan.unload == ["a"]


def test_min_residency_keeps_a_fresh_load_from_being_swapped_out() -> None:
    """`b` was loaded 5 s ago: however much waits for `c`, `b` stays until min_residency_s has passed."""
    residents = [resident("a", loaded_at=0, idle_since=None), resident("b", loaded_at=95, idle_since=96)]
    demand = {"a": Demand(5, 500, 20), "c": Demand(3, 300, 5)}
    assert decide(residents, demand, SIZES, LIMITS, now=100).load is None
    later = decide(residents, demand, SIZES, LIMITS, now=106)
    assert later.load == "c" and later.unload == ["b"]


def test_a_resident_with_more_waiting_work_is_not_evicted_for_less() -> None:
    residents = [resident("a", idle_since=None), resident("b", idle_since=None)]
    demand = {"a": Demand(9, 900, 5), "b": Demand(9, 900, 5), "c": Demand(1, 10, 1)}
    assert decide(residents, demand, SIZES, LIMITS, now=100).load is None


def test_a_model_larger_than_the_budget_never_loads() -> None:
    demand = {"huge": Demand(10, 10**5, 100), "a": Demand(1, 1, 0)}
    assert decide([], demand, SIZES, LIMITS, now=100).load == "a"


def test_an_idle_model_is_unloaded_after_keep_alive_and_not_before() -> None:
    residents = [resident("a", idle_since=100, keep_alive_s=30)]
    assert decide(residents, {}, SIZES, LIMITS, now=129).unload == []
    assert decide(residents, {}, SIZES, LIMITS, now=130).unload == ["a"]


def test_keep_alive_negative_keeps_zero_unloads_at_once() -> None:
    assert decide([resident("a", idle_since=0, keep_alive_s=-1)], {}, SIZES, LIMITS, now=10**6).unload == []
    assert decide([resident("a", idle_since=100, keep_alive_s=0)], {}, SIZES, LIMITS, now=100).unload == ["a"]


def test_waiting_work_keeps_an_idle_model_past_keep_alive() -> None:
    """Idle (its worker drains nothing) yet jobs of it wait: it is not unloaded under them."""
    residents = [resident("a", idle_since=0, keep_alive_s=5)]
    assert decide(residents, {"a": Demand(1, 10, 1)}, SIZES, LIMITS, now=100).unload == []


def test_work_other_workers_serve_counts_only_past_the_grace() -> None:
    fresh = {"a": Demand(1, 10, 1.0, served=True)}
    assert decide([], fresh, SIZES, LIMITS, now=100).load is None
    stale = {"a": Demand(1, 10, 2.5, served=True)}
    assert decide([], stale, SIZES, LIMITS, now=100).load == "a"


def test_models_the_pool_does_not_know_are_never_loaded() -> None:
    assert decide([], {"elsewhere": Demand(5, 500, 50)}, SIZES, LIMITS, now=100).load is None


def test_a_model_another_pool_is_loading_is_left_to_it() -> None:
    demand = {"a": Demand(9, 900, 30, claimed=True), "b": Demand(1, 10, 1)}
    assert decide([], demand, SIZES, LIMITS, now=100).load == "b"


def test_a_model_at_work_is_swapped_out_only_for_a_starving_one() -> None:
    """Both residents run jobs (none waits: they keep up); a third model's job waits. It waits until it starves."""
    residents = [resident("a", running=2), resident("b", running=1)]
    assert decide(residents, {"c": Demand(1, 50, 100)}, SIZES, LIMITS, now=1000).load is None
    plan = decide(residents, {"c": Demand(1, 50, 151)}, SIZES, LIMITS, now=1000)
    assert plan.load == "c" and len(plan.unload) == 1
