"""The event hub hands each event of a message to the inbox waiting for its job, if the message is one it reads."""
from __future__ import annotations

import orjson

from api.queue.hub import EventHub, Inbox
from common.events import VERSION, Error, delta, pack
from common.keys import Keys


def hub() -> EventHub:
    return EventHub(None, Keys("t"), "redis://unused")  # type: ignore[arg-type]  # never started: no connection


def test_each_event_goes_to_the_inbox_of_its_job() -> None:
    events, mine, other = hub(), Inbox(), Inbox()
    events.register("a", mine)
    events.register("b", other)
    events._dispatch(pack([delta("a", 1, 0, "x", 1), delta("b", 1, 0, "y", 1), delta("gone", 1, 0, "z", 1)]))
    assert [e["text"] for e in mine.events] == ["x"] and [e["text"] for e in other.events] == ["y"]


def test_a_message_of_another_version_ends_the_requests_it_names_with_an_error() -> None:
    """Not a silent drop: the response waiting for the job would hang until its queue timeout."""
    events, inbox = hub(), Inbox()
    events.register("a", inbox)
    events._dispatch(orjson.dumps({"v": VERSION + 1, "events": [{"type": "accepted", "job": "a", "seq": 0}]}))
    [event] = inbox.events
    error = Error.model_validate(event)
    assert (error.job, error.status, error.error.code) == ("a", 500, "event_version")
