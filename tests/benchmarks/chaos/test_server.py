"""benchmarks/chaos/server.py: the server's records are read back as the run goes, each once, before they expire."""
from __future__ import annotations

import time

import fakeredis

from benchmarks.chaos import server
from benchmarks.chaos.records import CHAT, Request
from common.jobs import JobHash


def test_records_are_read_back_once_each_when_settled() -> None:
    r = fakeredis.FakeRedis()
    now = time.time()
    old = Request(CHAT, "chat-1", now - 100, job="a", ended=now - 60)
    recent = Request(CHAT, "chat-2", now - 3, job="b", ended=now - 1)
    running = Request(CHAT, "chat-3", now - 3, job="c")
    for job in ("a", "b", "c"):
        r.hset(server.KEYS.job(job), JobHash.TEXT, f"text of {job}")
    assert server.read_back(r, [old, recent, running], settled_s=5) == 1
    assert (old.server_text, old.read_back is not None) == ("text of a", True)
    assert recent.read_back is None and running.read_back is None
    r.delete(server.KEYS.job("a"))  # its record expired (OVQ_JOB_TTL_S): what was read stays
    assert server.read_back(r, [old, recent, running]) == 1  # the run's end: all that ended, not read yet
    assert (old.server_text, recent.server_text, running.server_text) == ("text of a", "text of b", None)
