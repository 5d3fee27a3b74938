"""Which of a model's streams a request's job waits in: batch traffic says so in a header.

The Batch API's workers send each line to an API with `X-Ovq-Priority: batch`; the job then waits in the model's
batch stream, which workers read only when no interactive job waits. Any client may lower its own priority this
way; nobody can raise another's.
"""
from __future__ import annotations

from starlette.requests import Request

from common.jobs import PRIORITY_HEADER, Priority


def priority_of(request: Request) -> Priority:
    return "batch" if request.headers.get(PRIORITY_HEADER, "").strip().lower() == "batch" else "interactive"
