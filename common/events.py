"""Events a worker sends back for a job. One pub/sub message carries a batch of them (one engine step)."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, TypeAdapter

from common.errors import ErrorBody


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Timings(BaseModel):
    queue_ms: float
    ttft_ms: float | None = None
    total_ms: float


class _Event(BaseModel):
    job: str
    seq: int


class Accepted(_Event):
    type: Literal["accepted"] = "accepted"
    worker: str
    prompt_tokens: int
    queue_ms: float


class TokenLogprob(BaseModel):
    token: str
    logprob: float | None  # None: the first prompt token of an echo, which nothing predicts
    bytes: list[int]


class Delta(_Event):
    """New text of choice `index`; `finish_reason` set on the choice's last delta (text may then be empty)."""

    type: Literal["delta"] = "delta"
    index: int = 0
    text: str
    tokens: int
    logprobs: list[TokenLogprob] | None = None
    finish_reason: Literal["stop", "length"] | None = None
    echo: bool = False  # the prompt, sent back first when the request asked for echo


def delta(job: str, seq: int, index: int, text: str, tokens: int, logprobs: list[dict] | None = None,
          finish_reason: str | None = None, echo: bool = False) -> dict:
    """A `Delta` as the hot path sends it: a plain dict, fields at their default left out (a worker makes one per
    job per engine step; building and dumping the model would cost more than the rest of the step's work)."""
    event = {"type": "delta", "job": job, "seq": seq, "index": index, "text": text, "tokens": tokens}
    if logprobs:
        event["logprobs"] = logprobs
    if finish_reason:
        event["finish_reason"] = finish_reason
    if echo:
        event["echo"] = True
    return event


class Progress(_Event):
    """Image jobs: one denoising step done (of `total` for image `index`), with an optional small preview."""

    type: Literal["progress"] = "progress"
    index: int = 0
    step: int
    total: int
    preview: str | None = None  # base64 PNG, at most 128 px a side: small enough to travel in the event


class Done(_Event):
    type: Literal["done"] = "done"
    index: int = 0
    finish_reason: Literal["stop", "length"] = "stop"
    finish_reasons: list[Literal["stop", "length"]] = []  # by choice index, for every choice
    usage: Usage | None = None
    timings: Timings
    # Image jobs: Redis keys of the PNGs (short-lived; the API reads and deletes them).
    images: list[str] = []
    size: str | None = None


class Error(_Event):
    type: Literal["error"] = "error"
    status: int
    error: ErrorBody


class Cancelled(_Event):
    type: Literal["cancelled"] = "cancelled"


Event = Annotated[Accepted | Delta | Progress | Done | Error | Cancelled, Field(discriminator="type")]
TERMINAL = ("done", "error", "cancelled")


class EventBatch(BaseModel):
    v: int = 1
    events: list[Event]


batch_adapter: TypeAdapter[EventBatch] = TypeAdapter(EventBatch)
