"""Resumable streams: each SSE frame carries the id of the worker event it came from; Last-Event-ID is read back."""
from __future__ import annotations

import pytest
from starlette.requests import Request

from api.openai.resume import resume_point, tagged
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
