from __future__ import annotations

from typing import Any

from common.events import Delta
from common.jobs import Job, SamplingParams
from workers.text.jobstate import RunningJob


class Pieces:
    """A stream stand-in: the test says which characters each token made."""

    skip = True

    def __init__(self) -> None:
        self.pieces: list[int] = []


def entry(token: str) -> dict[str, Any]:
    return {"token": token, "logprob": -0.5, "bytes": list(token.encode())}


def run(tokens: list[str], stop: list[str], keep: bool = False) -> tuple[str, list[str]]:
    job = Job(model="m", device="CPU", kind="completion", prompt="p", reply_to="r",
              params=SamplingParams(stop=stop, logprobs=0, include_stop_str_in_output=keep))
    stream = Pieces()
    state = RunningJob(job, b"0-0", [stream])
    choice = state.choices[0]
    deltas = []
    for token in tokens:
        stream.pieces = [len(token)]
        deltas.append(state.delta(choice, [1], token, [entry(token)]))
        if choice.stops.stopped:
            break
    deltas.append(state.finish(choice, "stop"))
    deltas = [Delta.model_validate(d) for d in deltas if d]  # the hot path's dicts are the contract's Delta
    text = "".join(d.text for d in deltas)
    return text, [e.token for d in deltas if d.logprobs for e in d.logprobs]


def test_logprobs_follow_the_text_that_reaches_the_client() -> None:
    assert run(["Hello", " wor", "ld"], []) == ("Hello world", ["Hello", " wor", "ld"])


def test_tokens_cut_off_by_a_stop_string_lose_their_logprobs_too() -> None:
    text, tokens = run(["Hello", " ST", "OP", " more"], ["STOP"])
    assert text == "Hello " and tokens == ["Hello", " ST"]  # " ST" made the kept space


def test_held_back_text_releases_its_logprobs_when_it_turns_out_not_to_stop() -> None:
    text, tokens = run(["a ", "ST", "ART"], ["STOP"])
    assert text == "a START" and tokens == ["a ", "ST", "ART"]


def test_kept_stop_string_keeps_its_tokens() -> None:
    assert run(["x", "STOP", "y"], ["STOP"], keep=True) == ("xSTOP", ["x", "STOP"])
