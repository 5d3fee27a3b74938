"""How many jobs a continuous-batching worker takes: what its engine can schedule now, never the whole backlog."""
from __future__ import annotations

from workers.queue.admission import Admission


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
