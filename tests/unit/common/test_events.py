"""The events' two sides: what workers write (the models, `delta()`, `pack`) is what the API reads (the TypedDicts,
the type names, `read_batch`)."""
from __future__ import annotations

from typing import Any

import orjson
import pytest
from pydantic import BaseModel

from common.errors import ErrorBody
from common.events import (
    ACCEPTED,
    CANCELLED,
    DELTA,
    DONE,
    ERROR,
    PROGRESS,
    TERMINAL,
    VERSION,
    Accepted,
    AcceptedEvent,
    Cancelled,
    CancelledEvent,
    Delta,
    DeltaEvent,
    Done,
    DoneEvent,
    Error,
    ErrorDict,
    ErrorEvent,
    EventBatch,
    Progress,
    ProgressEvent,
    Segment,
    SegmentDict,
    Timings,
    TimingsDict,
    TokenLogprob,
    TokenLogprobDict,
    Transcript,
    TranscriptDict,
    Unreadable,
    Usage,
    UsageDict,
    batch_adapter,
    delta,
    pack,
    read_batch,
)

PAIRS: list[tuple[type[BaseModel], Any]] = [
    (Accepted, AcceptedEvent), (Delta, DeltaEvent), (Progress, ProgressEvent), (Done, DoneEvent),
    (Error, ErrorEvent), (Cancelled, CancelledEvent), (TokenLogprob, TokenLogprobDict), (Usage, UsageDict),
    (Timings, TimingsDict), (ErrorBody, ErrorDict), (Transcript, TranscriptDict), (Segment, SegmentDict)]


@pytest.mark.parametrize(("model", "typed"), PAIRS, ids=[m.__name__ for m, _ in PAIRS])
def test_the_reader_names_every_field_the_writer_sends(model: type[BaseModel], typed: Any) -> None:
    assert typed.__required_keys__ | typed.__optional_keys__ == set(model.model_fields)
    # What the reader takes as always there, the writer cannot leave out (`type` has a default, but is always sent).
    required = {name for name, field in model.model_fields.items() if field.is_required()}
    assert typed.__required_keys__ <= required | {"type"}


def test_type_names_are_the_models_types() -> None:
    types = {m.model_fields["type"].default for m in (Accepted, Delta, Progress, Done, Error, Cancelled)}
    assert {ACCEPTED, DELTA, PROGRESS, DONE, ERROR, CANCELLED} == types
    assert TERMINAL == {Done.model_fields["type"].default, Error.model_fields["type"].default,
                        Cancelled.model_fields["type"].default}
    assert EventBatch.model_fields["v"].default == VERSION


def test_a_packed_message_reads_back_as_the_worker_wrote_it() -> None:
    events = [Accepted(job="j", seq=0, worker="w", prompt_tokens=3, queue_ms=1.5).model_dump(mode="json"),
              delta("j", 1, 0, "hi", 1, finish_reason="stop")]
    data = pack(events)
    assert read_batch(data) == events
    batch_adapter.validate_json(data)  # the versioned model accepts it too


def test_a_message_of_another_version_answers_each_job_it_names_with_an_error() -> None:
    data = orjson.dumps({"v": VERSION + 1, "events": [{"job": "a", "type": "delta"}, {"job": "b"}, {"job": "a"},
                                                      {"no": "job"}]})
    with pytest.raises(Unreadable) as caught:
        read_batch(data)
    errors = caught.value.errors()
    assert [e["job"] for e in errors] == ["a", "b"]
    for event in errors:
        Error.model_validate(event)  # a well-formed `error` event: the API ends the job's response with it
        assert event["status"] == 500 and event["error"]["code"] == "event_version"


@pytest.mark.parametrize("message", [b"[]", b'{"events": []}', b"1"])
def test_a_message_that_is_no_batch_of_events_is_unreadable(message: bytes) -> None:
    with pytest.raises(Unreadable) as caught:
        read_batch(message)
    assert caught.value.errors() == []
