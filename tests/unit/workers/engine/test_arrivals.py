"""The engine's wait for the jobs that replace those a step ended: rationed by the steps' own time."""
from __future__ import annotations

from workers.engine.arrivals import SHARE, ArrivalWindow


def test_no_wait_unless_a_step_ended_jobs_and_enough_is_earned() -> None:
    window = ArrivalWindow(0.010)
    assert window.wait(3) == 0.0  # nothing earned yet
    window.earn(0.010 / SHARE)
    assert window.wait(0) == 0.0 and window.wait(3) == 0.010
    assert ArrivalWindow(0.0, allowance=1.0).wait(3) == 0.0  # arrival_window_ms 0: never


def test_waiting_spends_what_steps_earned_and_no_more_than_their_share() -> None:
    window = ArrivalWindow(0.010)
    steps = 0
    while window.wait(1) == 0.0:
        window.earn(0.024)
        steps += 1
    assert steps * 0.024 * SHARE >= 0.010  # a full window's wait takes that much stepping first
    window.spend(0.004)  # the replacements came after 4 ms
    assert window.wait(1) == 0.0  # the rest of the window is not there to spend


def test_the_allowance_is_capped() -> None:
    window = ArrivalWindow(0.010)
    window.earn(1000.0)  # a long idle stretch of steps does not buy a long wait later
    assert window.allowance == 0.020
