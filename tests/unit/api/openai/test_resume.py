"""Resumable streams: each SSE frame carries the id of the worker event it came from; Last-Event-ID is read back."""
from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.requests import Request

from api.openai.choices import ChoiceState
from api.openai.formats import ChatFormat
from api.openai.resume import Frames, Resumable, resume_point, tagged
from api.queue.client import Generation
from common.errors import OvqError


def request(**headers: str) -> Request:
    return Request({"type": "http", "headers": [(k.lower().replace("_", "-").encode(), v.encode())
                                                for k, v in headers.items()]})


def test_every_frame_of_an_event_carries_its_id() -> None:
    out = tagged(b"data: {}\n\ndata: [DONE]\n\n", "job-1", 7)
    assert out == b"id: job-1:7\ndata: {}\n\nid: job-1:7\ndata: [DONE]\n\n"
    assert tagged(b"", "job-1", 7) == b""


def test_last_event_id_names_the_job_and_the_event() -> None:
    assert resume_point(request(last_event_id="abc-1:12")) == ("abc-1", 12)
    assert resume_point(request()) is None
    with pytest.raises(OvqError):
        resume_point(request(last_event_id="12"))


def test_the_express_lane_writes_the_frame_the_loop_would_and_leaves_the_lease_to_the_loop() -> None:
    """A plain delta from the hub's callback is the same tagged frame `Frames.of` makes; a finish, a delta once the
    reader lease is due, or one behind queued events takes the loop (which renews the lease)."""
    jobs: Any = SimpleNamespace(hub=SimpleNamespace(register=lambda *_: None, unregister=lambda *_: None))
    running = Generation(jobs, [SimpleNamespace(id="job-1")], None, None)  # type: ignore[list-item]
    frames = Frames(ChatFormat("chatcmpl-1", "m"), {("job-1", 0): ChoiceState(0)})
    due = [time.monotonic() + 60]
    written: list[bytes] = []
    express = Resumable._express(lambda data: written.append(data) is None, running, frames, due)
    assert express is not None
    delta: Any = {"type": "delta", "job": "job-1", "seq": 3, "index": 0, "text": "hi", "tokens": 1}
    assert express(delta)
    assert written == [frames.of(delta)] and written[0].startswith(b"id: job-1:3\ndata: ")
    assert not express({**delta, "seq": 4, "finish_reason": "stop"})
    due[0] = time.monotonic()
    assert not express({**delta, "seq": 5})
    usage_each = Frames(ChatFormat("chatcmpl-1", "m", include_usage=True, continuous_usage=True), frames.choices)
    assert Resumable._express(lambda data: True, running, usage_each, due) is None
