"""Events a worker sends back for a job. One pub/sub message carries a batch of them (one engine step).

Workers write the pydantic models below (or `delta()`'s plain dict, on their hot path). The API reads every message
as plain dicts (orjson, no validation: its hot path), by the names defined here: the `type` values (`ACCEPTED`,
`DELTA`, ...), the `...Event` TypedDicts (each the wire form of its model; tests keep them equal) and
`read_batch`, which checks the message's version.
"""
from __future__ import annotations

from typing import Annotated, Any, Final, Literal, TypedDict

import orjson
from pydantic import BaseModel, Field, TypeAdapter

from common.errors import ErrorBody

VERSION: Final = 1  # of the message (`EventBatch.v`): a reader refuses a message of another version

# The event types, by their `type`.
ACCEPTED: Final = "accepted"
DELTA: Final = "delta"
PROGRESS: Final = "progress"
DONE: Final = "done"
ERROR: Final = "error"
CANCELLED: Final = "cancelled"
TERMINAL: Final = frozenset((DONE, ERROR, CANCELLED))  # every accepted job ends in exactly one of these


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
          finish_reason: str | None = None, echo: bool = False) -> DeltaEvent:
    """A `Delta` as the hot path sends it: a plain dict, fields at their default left out (a worker makes one per
    job per engine step; building and dumping the model would cost more than the rest of the step's work)."""
    event: DeltaEvent = {"type": DELTA, "job": job, "seq": seq, "index": index, "text": text, "tokens": tokens}
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


class Segment(BaseModel):
    start: float
    end: float
    text: str


class Transcript(BaseModel):
    """A speech-to-text job's result: the text, and its timed segments (and words) when asked for."""

    text: str
    language: str | None = None
    duration: float
    segments: list[Segment] = []
    words: list[Segment] = []


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
    # Video jobs: the Redis keys of the MP4 and its thumbnail (Keys.video_content; they live the job's ttl_s).
    video: str | None = None
    thumbnail: str | None = None
    # Speech jobs: the transcript (S2T), or the Redis key of the speech file (T2S, read once like the images).
    transcript: Transcript | None = None
    audio: str | None = None
    # Embeddings jobs: each input's vector, base64 of little-endian float32 (OpenAI's `base64` encoding).
    embeddings: list[str] = []
    # Rerank jobs: each document's relevance score, in the order of the job's documents.
    scores: list[float] = []


class Error(_Event):
    type: Literal["error"] = "error"
    status: int
    error: ErrorBody


class Cancelled(_Event):
    type: Literal["cancelled"] = "cancelled"


Event = Annotated[Accepted | Delta | Progress | Done | Error | Cancelled, Field(discriminator="type")]


class EventBatch(BaseModel):
    v: int = VERSION
    events: list[Event]


batch_adapter: TypeAdapter[EventBatch] = TypeAdapter(EventBatch)


def pack(events: list[dict[str, Any]]) -> bytes:
    """One message of events (each a model's `model_dump(mode="json")` or a `delta()`), as `EventBatch`."""
    return orjson.dumps({"v": VERSION, "events": events})


# ---- the reader's side: the events as the API reads them (plain dicts from orjson) ---------------------------

class _EventDict(TypedDict):
    type: str
    job: str
    seq: int


class AcceptedEvent(_EventDict):
    worker: str
    prompt_tokens: int
    queue_ms: float


class TokenLogprobDict(TypedDict):
    token: str
    logprob: float | None
    bytes: list[int]


class _DeltaFields(_EventDict):
    text: str
    tokens: int


class DeltaEvent(_DeltaFields, total=False):
    """Fields at their default may be missing (`delta()` leaves them out): read them with `.get()`."""

    index: int
    logprobs: list[TokenLogprobDict] | None
    finish_reason: str | None
    echo: bool


class _ProgressFields(_EventDict):
    step: int
    total: int


class ProgressEvent(_ProgressFields, total=False):
    index: int
    preview: str | None


class UsageDict(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TimingsDict(TypedDict, total=False):
    queue_ms: float
    ttft_ms: float | None
    total_ms: float


class SegmentDict(TypedDict):
    start: float
    end: float
    text: str


class _TranscriptFields(TypedDict):
    text: str
    duration: float


class TranscriptDict(_TranscriptFields, total=False):
    language: str | None
    segments: list[SegmentDict]
    words: list[SegmentDict]


class _DoneFields(_EventDict):
    timings: TimingsDict


class DoneEvent(_DoneFields, total=False):
    index: int
    finish_reason: str
    finish_reasons: list[str]
    usage: UsageDict | None
    images: list[str]
    size: str | None
    transcript: TranscriptDict | None
    audio: str | None
    video: str | None
    thumbnail: str | None
    embeddings: list[str]
    scores: list[float]


class ErrorDict(TypedDict, total=False):
    message: str
    type: str
    param: str | None
    code: str | int | None


class ErrorEvent(_EventDict):
    status: int
    error: ErrorDict


class CancelledEvent(_EventDict):
    pass


EventDict = AcceptedEvent | DeltaEvent | ProgressEvent | DoneEvent | ErrorEvent | CancelledEvent


class Unreadable(ValueError):
    """A message of another version (or no message of events at all): its events cannot be read."""

    def __init__(self, message: Any) -> None:
        self.version = message.get("v") if isinstance(message, dict) else None
        super().__init__(f"a worker sent events of version {self.version}; this process reads version {VERSION}")
        self.jobs = _jobs_named(message)

    def errors(self) -> list[ErrorEvent]:
        """An `error` event for each job the message names, so that whoever waits for them is answered."""
        body: ErrorDict = {"message": f"{self} (the API and the workers run different versions)",
                           "type": "server_error", "param": None, "code": "event_version"}
        return [{"type": ERROR, "job": job, "seq": 0, "status": 500, "error": body} for job in self.jobs]


def _jobs_named(message: Any) -> list[str]:
    events = message.get("events") if isinstance(message, dict) else None
    if not isinstance(events, list):
        return []
    return list(dict.fromkeys(e["job"] for e in events if isinstance(e, dict) and isinstance(e.get("job"), str)))


def read_batch(data: bytes) -> list[EventDict]:
    """The events of one message, as plain dicts; raises `Unreadable` for a message of another version."""
    message = orjson.loads(data)
    if type(message) is not dict or message.get("v") != VERSION:
        raise Unreadable(message)
    return message["events"]
