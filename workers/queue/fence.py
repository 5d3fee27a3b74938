"""Fencing: a worker cut off from Redis alone (a network partition) for longer than OVQ_WORKER_TTL_S looks dead to
the others, and one of them takes its jobs over (`workers/queue/reclaim.py`: XCLAIM moves each job's stream entry
to the new worker's consumer) and continues them. When the cut-off worker is back, the events it held for those
jobs must not go out: the client would get their text twice.

The stream's pending entries list says who holds a job: XCLAIM is the takeover, atomically. So after any moment in
which Redis may have been out of reach (a failed round trip of the publisher, a failed heartbeat), the publisher
asks, in one round trip before it sends anything more, which of the entries this worker took are still its own
(`HOLD`); those another worker took, or that nobody holds any more, are dropped from what it sends and stopped in
its engine. The entries still its own get their idle time reset in the same script, so no reclaim pass can take
them for another worker TTL, by which time its heartbeat is back. Nothing is added to the per-token path: one
flag read per round trip, and one dictionary entry per job taken.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

from redis.exceptions import ResponseError

from common.keys import GROUP
from common.redis.lane import Command

# KEYS[1]: a stream; ARGV[1]: the group, ARGV[2]: this worker's consumer, ARGV[3...]: the entries it took from it.
# Answers those it no longer holds (claimed by another worker, or acked); the others are claimed again by the same
# consumer (JUSTID: their delivery count stays), which starts their idle time again.
HOLD = """
local lost = {}
for i = 3, #ARGV do
  if #redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1, ARGV[2]) == 0 then
    lost[#lost + 1] = ARGV[i]
  else
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
  end
end
return lost
"""


class Fence:
    """The stream entries this worker took and has not acked yet, and whether Redis may have been out of reach
    since they were last checked (`due`)."""

    def __init__(self, consumer: str) -> None:
        self.consumer = consumer
        self.held: dict[bytes, tuple[str, str]] = {}  # entry id -> (its stream, its job)
        self.due = False

    def hold(self, entry_id: bytes, stream: str, job: str) -> None:
        self.held[entry_id] = (stream, job)

    def acked(self, acks: list[tuple[str | None, bytes]]) -> None:
        """A round trip with these acks went through: the entries are nobody's now."""
        for _, entry_id in acks:
            self.held.pop(entry_id, None)

    def commands(self) -> list[Command]:
        """The check, one script call per stream."""
        by_stream: dict[str, list[bytes]] = defaultdict(list)
        for entry_id, (stream, _) in self.held.items():
            by_stream[stream].append(entry_id)
        return [["EVAL", HOLD, 1, stream, GROUP, self.consumer, *entries] for stream, entries in by_stream.items()]

    def lost(self, replies: list[Any]) -> dict[bytes, str]:
        """From the check's replies: the entries no longer this worker's, with their jobs (forgotten here). A stream
        Redis refused (NOGROUP: it lost its data) loses nobody its jobs."""
        lost = {}
        for reply in replies:
            if isinstance(reply, ResponseError):
                continue
            for entry_id in reply:
                _, job = self.held.pop(entry_id, ("", ""))
                if job:
                    lost[entry_id] = job
        self.due = False
        return lost
