"""How many jobs a continuous-batching worker takes: what its engine can schedule now, never the whole backlog, and
no more than the knee of its learned throughput curve."""
from __future__ import annotations

import math
import random
import statistics

import pytest

from workers.queue.admission import PROBE_EVERY, Admission, Knee


def fresh(**kw: object) -> Admission:
    return Admission(max_seqs=64, step_tokens=256, fixed_cache=False, **kw)


def test_an_idle_engine_takes_one_steps_worth_of_prompts() -> None:
    a = fresh()
    a.average_prompt = 40
    assert a.room(0) == 7  # ceil(256 / 40): what one step can prefill, not max_num_seqs


def test_sent_jobs_count_until_a_step_reports_them() -> None:
    a = fresh()
    a.average_prompt = 40
    for job in "abcdef":
        a.sent(job, "x" * 160)  # 40 tokens each at 4 characters per token
    assert a.room(6) == 1
    a.sent("g", "x" * 160)
    assert a.room(7) == 0
    for job in "abcdefg":
        a.answered(job, "x" * 160, 40)
    a.stepped([7, 7, 100.0, 0])  # all prefilled and scheduled
    assert not a.uncounted and a.room(7) == 7


def test_nothing_is_taken_while_the_engine_has_requests_it_could_not_schedule() -> None:
    a = fresh()
    a.stepped([10, 8, 50.0, 0])
    assert a.room(10) == 0


def test_a_fixed_cache_nearly_full_stops_admission_a_growing_one_does_not() -> None:
    fixed = Admission(max_seqs=64, step_tokens=256, fixed_cache=True)
    fixed.stepped([4, 4, 97.0, 0])
    assert fixed.room(4) == 0
    growing = fresh()
    growing.stepped([4, 4, 100.0, 0])
    assert growing.room(4) > 0


def test_a_prompt_longer_than_a_step_is_taken_alone() -> None:
    a = fresh()
    assert a.room(0) >= 1
    a.sent("long", list(range(1000)))
    assert a.room(1) == 0


def test_max_num_seqs_caps_everything() -> None:
    a = Admission(max_seqs=2, step_tokens=4096, fixed_cache=False)
    assert a.room(0) == 2 and a.room(2) == 0


def test_characters_per_token_are_learned() -> None:
    a = fresh()
    a.sent("j", "y" * 300)
    a.answered("j", "y" * 300, 100)
    assert a.chars_per_token < 4.0


# ---- the knee ------------------------------------------------------------------------------------------------
# SmolLM2 on 2 cores, from the raw step loop (shared/bench README): t(n) = 11 ms + 1.34 ms per sequence.
A, B = 0.011, 0.00134


def knee_of(a: float, b: float, f: float = 0.01) -> float:
    return (math.sqrt(a * (a + b) / f) - a) / b


def run_burst(knee: Knee, waiting: int, steps: int, a: float = A, b: float = B,
              noise: random.Random | None = None) -> list[int]:
    """A worker with `waiting` jobs queued, running what its limit allows; returns the running count per step."""
    seen = []
    for _ in range(steps):
        n = min(knee.limit(), waiting)
        seconds = a + b * n
        if noise is not None:
            seconds *= noise.uniform(0.8, 1.25)
        knee.observe(n, seconds)
        seen.append(n)
    return seen


def test_a_burst_climbs_from_the_floor_to_the_knee_and_leaves_the_rest_waiting() -> None:
    k = Knee(ceiling=256)
    assert k.limit() == 16  # nothing measured: the floor
    seen = run_burst(k, waiting=120, steps=60)
    assert seen[:8] == [16] * 4 + [32] * 4  # twice what was measured (4 steps), no more
    assert abs(k.knee() - knee_of(A, B)) <= 2  # 79: the fitted line is the true one
    assert 70 <= seen[-1] <= 90 < 120


def test_the_knee_holds_under_noisy_step_times() -> None:
    knees = []
    for seed in range(7):  # one noisy run's knee is one draw of a wide spread (26-195 over 40 seeds): the median
        k = Knee(ceiling=256)
        run_burst(k, waiting=120, steps=400, noise=random.Random(seed))
        knees.append(k.knee())
    assert 40 <= statistics.median(knees) <= 115  # 79 without noise; greedy would be 120, the floor 16


def test_fewer_streams_than_the_knee_run_at_once() -> None:
    k = Knee(ceiling=256)
    seen = run_burst(k, waiting=16, steps=50)
    assert seen[-1] == 16 and k.limit() >= 16  # no fit yet (one n): the limit stays open above the floor


def test_a_low_estimate_rises_when_each_sequence_gets_cheaper() -> None:
    k = Knee(ceiling=256)
    run_burst(k, waiting=200, steps=80, b=4 * B)
    low = k.knee()
    assert low < 30
    # Once the old averages fade (below half a weight after 4 HALF_LIFEs), and probes measured the new.
    run_burst(k, waiting=200, steps=2500)
    assert k.knee() > low + 15 and k.limit() > low + 15


def test_probing_measures_above_a_limit_held_long() -> None:
    k = Knee(ceiling=256)
    run_burst(k, waiting=200, steps=40)
    held = k.limit()
    seen = run_burst(k, waiting=200, steps=3 * PROBE_EVERY)
    assert max(seen) > held  # went above once to measure there
    assert seen[-1] <= held + max(4, held // 4)


def test_a_target_itl_caps_the_sequences() -> None:
    k = Knee(ceiling=256, target_itl_s=0.040)
    run_burst(k, waiting=120, steps=60)
    assert k.limit() == int((0.040 - A) / B)  # 21: t(21) = 39 ms
    assert k.knee() > k.limit()


def test_a_target_itl_no_step_can_meet_leaves_the_floor() -> None:
    k = Knee(ceiling=256, target_itl_s=0.005)
    run_burst(k, waiting=120, steps=60)
    assert k.limit() == 16


def test_a_flat_curve_opens_up_to_max_num_seqs() -> None:
    k = Knee(ceiling=100)
    seen = run_burst(k, waiting=300, steps=40, b=0.0)
    assert seen[-1] == 100


def test_little_shared_cost_means_little_gain_from_batching_the_floor_stays() -> None:
    k = Knee(ceiling=256)
    run_burst(k, waiting=300, steps=40, a=0.0005, b=0.002)
    assert k.knee() == 16


def test_the_floor_is_never_above_max_num_seqs() -> None:
    assert Knee(ceiling=4).limit() == 4


def decode(a: Admission, n: int, seconds: float, clock: list[float]) -> None:
    clock[0] += seconds
    a.stepped([n, n, 10.0, 0], n, clock[0])


def test_admission_learns_from_decode_only_steps() -> None:
    a = Admission(max_seqs=256, step_tokens=256, fixed_cache=False, knee=Knee(ceiling=256))
    clock = [100.0]
    a.sent("j", "x" * 64)
    a.stepped([16, 16, 10.0, 0], 16, clock[0])  # a job was sent before it
    decode(a, 16, 0.030, clock)  # calm once: still not a sample (something may have been added before it)
    assert not a.knee.curve
    decode(a, 16, 0.030, clock)
    assert a.knee.curve[16].seconds == pytest.approx(0.030)
    a.forget("ended")  # a job ended: the engine may wait for arrivals before its next step
    decode(a, 15, 0.500, clock)
    decode(a, 15, 0.500, clock)
    assert 15 not in a.knee.curve
    clock[0] += 0.2
    a.stepped([15, 15, 10.0, 40], 15, clock[0])  # a prompt waits for prefill
    decode(a, 16, 0.2, clock)
    assert a.knee.curve[16].steps == 1
    decode(a, 16, 0.030, clock)
    assert a.knee.curve[16].steps == 2


def test_room_stops_at_the_knee_limit() -> None:
    knee = Knee(ceiling=256)
    run_burst(knee, waiting=120, steps=60)
    a = Admission(max_seqs=256, step_tokens=4096, fixed_cache=False, knee=knee)
    limit = knee.limit()
    assert a.room(limit - 2) == 2 and a.room(limit) == 0
    greedy = Admission(max_seqs=256, step_tokens=4096, fixed_cache=False)
    assert greedy.room(limit) > 0
