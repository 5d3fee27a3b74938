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


def test_on_a_cluster_each_model_has_its_channel_and_a_lost_one_touches_only_its_jobs() -> None:
    """A master's failover ends the streams of its models only, and those whose events came on the process's own
    channel when that one's master fails."""
    events = EventHub(None, Keys("t", cluster=True), "redis://unused")  # type: ignore[arg-type]
    assert events.channel("a") == Keys("t", cluster=True).events(events.reply_to, "a") != events.channel("b")
    on_a, on_b = Inbox(events.channel("a")), Inbox(events.channel("b"))
    events.register("1", on_a)
    events.register("2", on_b)
    events._lost(events.channel("a"))
    assert on_a.lost and not on_b.lost
    events._lost(events._main.channel)  # the process's own channel: no event of b's came there
    assert not on_b.lost
    events._dispatch_legacy(pack([delta("2", 1, 0, "y", 1)]))  # a worker of before per-model channels: it did
    events._lost(events._main.channel)
    assert on_b.lost and [e["text"] for e in on_b.events] == ["y"]


def test_on_one_redis_every_model_shares_the_processs_channel() -> None:
    events = hub()
    assert events.channel("a") == events.channel("b") == events._main.channel
    assert not events.listening("t:ev:elsewhere")


async def test_on_one_redis_a_models_channel_is_heard_with_no_new_subscription() -> None:
    events = hub()
    assert await events.listen("a") and list(events._listeners) == [events._main.channel]
