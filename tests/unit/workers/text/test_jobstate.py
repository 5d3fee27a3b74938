"""A choice's text goes out at most once per stream interval; nothing is lost or reordered by holding it."""
from __future__ import annotations

from typing import Any

import pytest

from common.events import Delta
from common.jobs import Job, SamplingParams
from tests.unit.workers.text.test_logprobs import Pieces, entry
from workers.text import jobstate
from workers.text.jobstate import RunningJob
from workers.text.progress import Progress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(jobstate.time, "monotonic", clock)
    return clock


def job_state(interval: float, logprobs: bool = False) -> tuple[RunningJob, Pieces]:
    job = Job(model="m", device="CPU", kind="completion", prompt="p", reply_to="r",
              params=SamplingParams(logprobs=0 if logprobs else None))
    stream = Pieces()
    return RunningJob(job, b"0-0", [stream], interval=interval), stream


def feed(state: RunningJob, stream: Pieces, token: str) -> dict[str, Any] | None:
    stream.pieces = [len(token)]
    return state.delta(state.choices[0], [7], token, [entry(token)] if state.choices[0].logprobs else None)


def test_text_within_the_interval_waits_for_the_next_delta_due(clock: Clock) -> None:
    state, stream = job_state(0.010)
    assert feed(state, stream, "Hel")["text"] == "Hel"  # the first text never waits
    clock.now += 0.004
    assert feed(state, stream, "lo") is None
    clock.now += 0.004
    assert feed(state, stream, " wor") is None
    clock.now += 0.004  # 12 ms since the last delta
    sent = feed(state, stream, "ld")
    assert (sent["text"], sent["tokens"]) == ("lo world", 3)
    assert state.due(clock.now) == []


def test_held_text_goes_out_when_due_even_without_new_tokens(clock: Clock) -> None:
    state, stream = job_state(0.010)
    feed(state, stream, "a")
    clock.now += 0.002
    assert feed(state, stream, "b") is None
    assert state.due(clock.now) == []
    clock.now += 0.010
    (sent,) = state.due(clock.now)
    assert sent["text"] == "b"
    assert state.due(clock.now + 1) == []


def test_the_end_sends_everything_held_with_its_logprobs_in_order(clock: Clock) -> None:
    state, stream = job_state(60.0, logprobs=True)
    deltas = [feed(state, stream, t) for t in ["x", "y", "z"]]
    deltas.append(state.finish(state.choices[0], "length"))
    sent = [Delta.model_validate(d) for d in deltas if d]
    assert [d.text for d in sent] == ["x", "yz"]
    assert [e.token for d in sent for e in d.logprobs or []] == ["x", "y", "z"]
    assert sent[-1].finish_reason == "length" and [d.seq for d in sent] == [1, 2]
    assert "".join(state.choices[0].text) == "xyz"


def test_everything_held_goes_out_before_an_error(clock: Clock) -> None:
    state, stream = job_state(60.0)
    feed(state, stream, "a")
    feed(state, stream, "b")
    assert [d["text"] for d in state.due(clock.now, everything=True)] == ["b"]


def test_interval_zero_sends_every_step(clock: Clock) -> None:
    state, stream = job_state(0.0)
    assert [feed(state, stream, t)["text"] for t in ["a", "b", "c"]] == ["a", "b", "c"]


def test_more_takes_a_plain_jobs_tokens_as_delta_does(clock: Clock) -> None:
    """The worker's fast path (`more`) and the general one (`delta`) send the same deltas."""
    sent: dict[str, list[tuple[str, int, int] | None]] = {}
    for way in ("delta", "more"):
        state, stream = job_state(0.010)
        assert state.plain
        out = [feed(state, stream, "He")]
        for token in ["l", "lo", " w", "or", "ld"]:
            clock.now += 0.004
            if way == "delta":
                out.append(feed(state, stream, token))
            else:
                out.append(state.more(state.choices[0], [7], token, clock.now))
        out.append(state.finish(state.choices[0], "length"))
        sent[way] = [(d["text"], d["tokens"], d["seq"]) if d else None for d in out]
        assert (state.choices[0].tokens, state.choices[0].ids) == (6, [7] * 6)
    assert sent["more"] == sent["delta"]
    assert [s for s in sent["more"] if s] == [("He", 1, 1), ("llo w", 3, 2), ("orld", 2, 3)]


def test_an_end_of_sequence_is_no_text_but_a_token_of_the_last_delta_and_the_usage(clock: Clock) -> None:
    """As OpenAI and vLLM count it: an answer that is only its end of sequence has one completion token."""
    state, _ = job_state(60.0)
    last = state.finish(state.choices[0], "stop", ended=True)
    assert (last["text"], last["tokens"], last["finish_reason"]) == ("", 1, "stop")
    assert state.done().usage.completion_tokens == 1 and state.summary()["completion_tokens"] == 1
    state, stream = job_state(60.0)
    feed(state, stream, "a")
    assert feed(state, stream, "b") is None  # held: within the interval
    last = state.finish(state.choices[0], "stop", ended=True)
    assert (last["text"], last["tokens"]) == ("b", 2)
    assert state.done().usage.completion_tokens == 3
    state, stream = job_state(0.0)
    feed(state, stream, "a")
    assert state.finish(state.choices[0], "length")["tokens"] == 0 and state.done().usage.completion_tokens == 1


@pytest.mark.parametrize("params", [{"stop": ["x"]}, {"logprobs": 1}, {"n": 2}, {"skip_special_tokens": False}])
def test_a_job_needing_more_than_text_is_not_plain(params: dict[str, Any]) -> None:
    job = Job(model="m", device="CPU", kind="completion", prompt="p", reply_to="r", params=SamplingParams(**params))
    streams = [Pieces() for _ in range(job.params.n)]
    for stream in streams:
        stream.skip = job.params.skip_special_tokens
    assert not RunningJob(job, b"0-0", streams).plain  # type: ignore[arg-type]


def stopping_state(stop: str) -> tuple[RunningJob, Pieces]:
    job = Job(model="m", device="CPU", kind="completion", prompt="p", reply_to="r", params=SamplingParams(stop=[stop]))
    stream = Pieces()
    return RunningJob(job, b"0-0", [stream], record=True), stream


def test_a_replayed_record_goes_on_as_the_job_would_have_across_a_stop_string() -> None:
    """The record holds the ids of each delta sent; replayed on another worker, what the stop filter held of them
    (a tail that may be a stop string's start) is held again: the stop string that completes later is cut."""
    state, stream = stopping_state("END")
    sent = []
    for i, token in enumerate(["Hi", " E", "N"]):  # "EN" may become "END": held, not sent
        stream.pieces = [len(token)]
        event = state.delta(state.choices[0], [i], token, None)
        sent += [event["text"]] if event else []
    assert sent == ["Hi", " "]
    records, first = state.take_record()  # type: ignore[misc]
    progress = Progress.read(b"".join(records), logprobs=False)
    assert first and progress.choices[0].ids == [0, 1] and progress.seq == 2  # the ids of the deltas sent

    taken, stream = stopping_state("END")
    stream.pieces = [2, 2]
    taken.replay(taken.choices[0], [0, 1], "Hi E", None)
    taken.seq = progress.seq
    assert taken.take_record() is None  # nothing new to record: the record has these already
    for i, token in [(2, "N"), (3, "D!")]:
        stream.pieces = [len(token)]
        event = taken.delta(taken.choices[0], [i], token, None)
        sent += [event["text"]] if event else []
    assert "".join(sent) == "Hi " and taken.choices[0].stops.stopped
    assert taken.choices[0].tokens == 4 and taken.next_seq() == 3
