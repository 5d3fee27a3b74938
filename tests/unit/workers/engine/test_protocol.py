"""The engine pipe protocol: its bytes, its readers, and `apply` driving the real CB engine (the default model)."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import orjson
import pytest

from workers.engine import protocol
from workers.engine.continuous import Engine
from workers.engine.protocol import EngineSpec

PROMPT = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
GREEDY = {"max_tokens": 8, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Engine:
    return Engine(EngineSpec(str(model_dir), "CPU", {"cache_size": 0}, {}, 8192))


def wire(value: Any) -> bytes:
    return orjson.dumps(value)


def test_commands_are_the_documented_lists() -> None:
    resume = protocol.resume({0: [5, 6]}, [1])
    add = protocol.add_command("j", "p", True, {"n": 2}, ["aW1n"], resume, "completion")
    assert wire([add, protocol.cancel_command("j"), protocol.cancel_command("j", 1), protocol.stop_command()]) == (
        b'[["add","j","p",true,{"n":2},["aW1n"],{"generated":{"0":[5,6]},"done":[1]},"completion"],'
        b'["cancel","j"],["cancel","j",1],["stop"]]')


def test_a_resume_reads_back_after_the_pipe() -> None:
    sent = orjson.loads(wire(protocol.resume({0: [1, 2], 2: []}, [1])))
    assert protocol.resumed(sent) == ({0: [1, 2], 2: []}, {1})
    assert protocol.resumed({}) == ({}, set())


def test_updates_are_the_documented_lists() -> None:
    assert wire([
        protocol.running("j", [1, 2]),
        protocol.accepted("j", 7),
        protocol.cancelled("j", [3]),
        protocol.error("j", {"status": 400, "message": "no"}),
        protocol.ended("j", [4], protocol.LENGTH),
        protocol.update("j", [5], protocol.PROMPT, None, 1, [-0.5]),
    ]) == (b'[["j",[1,2],null,null],["j",[],"accepted",7],["j",[3],"cancelled",null],'
           b'["j",[],"error",{"status":400,"message":"no"}],["j",[4],"length",null],["j",[5],"prompt",null,1,[-0.5]]]')


@pytest.mark.parametrize(("update", "read"), [
    (protocol.running("j", [1]), ["j", [1], None, None, 0, None]),
    (protocol.ended("j", [2], protocol.STOP), ["j", [2], "stop", None, 0, None]),
    (protocol.update("j", [3], None, None, 1, [-1.0]), ["j", [3], None, None, 1, [-1.0]]),
])
def test_either_form_reads_as_the_full_one(update: list[Any], read: list[Any]) -> None:
    assert protocol.full(orjson.loads(wire(update))) == read
    job, ids, state, extra, index, logprobs = protocol.full(update)
    assert (job, ids, state, extra, index, logprobs) == tuple(read)
    assert update[protocol.JOB] == job and update[protocol.IDS] == ids and update[protocol.STATE] == state


def test_only_more_tokens_of_choice_0_are_the_running_form() -> None:
    assert protocol.is_running(protocol.running("j", [1]))
    assert not protocol.is_running(protocol.ended("j", [1], protocol.STOP))
    assert not protocol.is_running(protocol.update("j", [1], None, None, 1, None))
    assert not protocol.is_running(protocol.accepted("j", 3))


def test_messages_are_the_documented_objects() -> None:
    assert wire(protocol.report([protocol.running("j", [1])], [1, 1, 0.5, 0])) == b'{"u":[["j",[1],null,null]],' \
                                                                                  b'"s":[1,1,0.5,0]}'
    assert wire(protocol.report([])) == b'{"u":[],"s":null}'
    assert wire(protocol.broken("bad", ["a", "b"])) == b'{"broken":"bad","suspects":["a","b"]}'
    assert wire(protocol.ready()) == b'{"ready":true}'
    assert wire(protocol.ready("no device")) == b'{"ready":false,"error":"no device"}'


def test_apply_adds_with_the_trailing_fields_left_off_or_given(engine: Engine) -> None:
    """resume and kind default to none and "chat"; given, they reach the engine (a refusal names the field)."""
    out: list[list[Any]] = []
    too_long = list(range(9000))  # over the 8192-token context
    message = [
        ["add", "short", PROMPT, False, GREEDY, []],
        protocol.add_command("chat", too_long, False, GREEDY, [], None, "chat"),
        protocol.add_command("completion", too_long, False, GREEDY, [], None, "completion"),
        protocol.add_command("resumed", PROMPT, False, GREEDY, [], protocol.resume({}, [0]), "chat"),
    ]
    assert protocol.apply(engine, message, out) and protocol.added(message) == 4
    assert out[0] == protocol.accepted("short", engine.requests["short"].prompt_len)
    assert [u[protocol.EXTRA]["param"] for u in out[1:3]] == ["messages", "prompt"]
    assert len(out) == 3 and "resumed" not in engine.requests  # its only choice was done: nothing to run
    protocol.apply(engine, [protocol.cancel_command("short")], out)


def test_apply_cancels_a_choice_silently_and_a_job_with_an_answer(engine: Engine) -> None:
    out: list[list[Any]] = []
    protocol.apply(engine, [protocol.add_command("two", PROMPT, False, {**GREEDY, "n": 2}, [], None, "chat")], out)
    out.clear()
    assert protocol.apply(engine, [protocol.cancel_command("two", 1)], out)
    assert out == [] and list(engine.requests["two"].handles) == [0]
    assert protocol.apply(engine, [protocol.cancel_command("two")], out)
    assert out == [protocol.cancelled("two", [])] and "two" not in engine.requests


def test_apply_stops_at_stop_after_cancelling_every_job(engine: Engine) -> None:
    out: list[list[Any]] = []
    protocol.apply(engine, [protocol.add_command("running", PROMPT, False, GREEDY, [], None, "chat")], out)
    engine.step(out)
    out.clear()
    later = protocol.add_command("later", PROMPT, False, GREEDY, [], None, "chat")
    assert not protocol.apply(engine, [protocol.stop_command(), later], out)
    assert [(u[protocol.JOB], u[protocol.STATE]) for u in out] == [("running", "cancelled")]
    assert not engine.requests  # and "later" was never added


def test_an_unknown_command_is_logged_and_the_rest_still_applied(
        engine: Engine, caplog: pytest.LogCaptureFixture) -> None:
    out: list[list[Any]] = []
    with caplog.at_level(logging.ERROR, logger="ovq.engine"):
        assert protocol.apply(engine, [["pause", "x"], protocol.add_command("after", PROMPT, False, GREEDY, [], None,
                                                                            "chat")], out)
    assert "unknown engine command 'pause'" in caplog.text
    assert [u[protocol.STATE] for u in out] == ["accepted"]
    protocol.apply(engine, [protocol.cancel_command("after")], out)
