"""An enqueue acknowledged only once a replica has it: `WAIT` in the same round trip as the write, bounded.

With a replicated primary (Sentinel), a job Redis accepted but no replica received yet is lost when the primary
dies before replicating it; `WAIT n ms` after the write answers once `n` replicas have everything this connection
wrote, or after `ms` with how many did. It is only asked for the replicas the primary has: `INFO replication`,
added to the round trip at most once a second, says how many are connected (none after a failover left the new
primary alone: then no WAIT, as with one Redis). Not ROLE: an admin command an ACL user should not need. A replica
slower than the bound does not stop service: the job goes on, as safe as on one Redis, and the shortfall is logged
(at most once a minute).
"""
from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

from common.redis.lane import Command, Lane, Script, refused

log = logging.getLogger("ovq.redis")
INFO_EVERY_S = 1.0
CONNECTED = re.compile(rb"^connected_slaves:(\d+)", re.MULTILINE)
WARN_EVERY_S = 60.0


class ReplicaWait:
    def __init__(self, wanted: int, timeout_ms: int) -> None:
        self.wanted, self.timeout_ms = wanted, timeout_ms
        self.connected = wanted  # until INFO says otherwise: assume the replicas are there
        self._info_at = 0.0
        self._warned_at = -WARN_EVERY_S
        self.short = 0  # writes a replica had not acknowledged within the bound

    async def run(self, lane: Lane, script: Script, keys: Sequence[Any], args: Sequence[Any],
                  before: Sequence[Command] = ()) -> Any:
        """`script`'s reply, once min(wanted, connected) replicas have it or the bound passed. `before`: commands
        run just ahead of the script, in the same round trip (as `Script`'s)."""
        now = time.monotonic()
        asks_info = now - self._info_at >= INFO_EVERY_S
        want = min(self.wanted, self.connected)
        commands = [*before, script.command(keys, args)]
        if want:
            commands.append(["WAIT", want, self.timeout_ms])
        if asks_info:
            commands.append(["INFO", "replication"])
            self._info_at = now
        replies = await lane.execute(commands, blocks_s=self.timeout_ms / 1000 if want else 0.0)
        if asks_info:
            self._learn(replies[-1])
        refused(replies[:len(before)])
        replies = replies[len(before):]
        reply = replies[0]
        if isinstance(reply, NoScriptError):  # Redis restarted or failed over: load it, then wait for it
            reply = await script(lane, keys, args)
            if want:
                [acked] = await lane.execute([["WAIT", want, self.timeout_ms]], blocks_s=self.timeout_ms / 1000)
                replies = [reply, acked]
        elif isinstance(reply, ResponseError):
            raise reply
        if want and isinstance(replies[1], int) and replies[1] < want:
            self._short(replies[1], want)
        return reply

    def _learn(self, info: Any) -> None:
        found = CONNECTED.search(info) if isinstance(info, bytes) else None
        if found is not None:
            self.connected = int(found[1])

    def _short(self, acked: int, want: int) -> None:
        self.short += 1
        now = time.monotonic()
        if now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            log.warning("a job was acknowledged by %d of %d replicas within %d ms; queued anyway (%d so far)",
                        acked, want, self.timeout_ms, self.short)
