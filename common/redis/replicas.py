"""An enqueue acknowledged only once a replica has it: `WAIT` in the same round trip as the write, bounded.

With a replicated primary (Sentinel), a job Redis accepted but no replica received yet is lost when the primary
dies before replicating it; `WAIT n ms` after the write answers once `n` replicas have everything this connection
wrote, or after `ms` with how many did. It is only asked for the replicas the primary has: `ROLE`, added to the
round trip at most once a second, says how many are connected (none after a failover left the new primary
alone: then no WAIT, as with one Redis). A replica slower than the bound does not stop service: the job goes on,
as safe as on one Redis, and the shortfall is logged (at most once a minute).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

from common.redis.lane import Lane, Script

log = logging.getLogger("ovq.redis")
ROLE_EVERY_S = 1.0
WARN_EVERY_S = 60.0


class ReplicaWait:
    def __init__(self, wanted: int, timeout_ms: int) -> None:
        self.wanted, self.timeout_ms = wanted, timeout_ms
        self.connected = wanted  # until ROLE says otherwise: assume the replicas are there
        self._role_at = 0.0
        self._warned_at = -WARN_EVERY_S
        self.short = 0  # writes a replica had not acknowledged within the bound

    async def run(self, lane: Lane, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """`script`'s reply, once min(wanted, connected) replicas have it or the bound passed."""
        now = time.monotonic()
        asks_role = now - self._role_at >= ROLE_EVERY_S
        want = min(self.wanted, self.connected)
        commands = [script.command(keys, args)]
        if want:
            commands.append(["WAIT", want, self.timeout_ms])
        if asks_role:
            commands.append(["ROLE"])
            self._role_at = now
        replies = await lane.execute(commands, blocks_s=self.timeout_ms / 1000 if want else 0.0)
        if asks_role:
            self._learn(replies[-1])
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

    def _learn(self, role: Any) -> None:
        if isinstance(role, list) and len(role) >= 3 and role[0] == b"master":
            self.connected = len(role[2])

    def _short(self, acked: int, want: int) -> None:
        self.short += 1
        now = time.monotonic()
        if now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            log.warning("a job was acknowledged by %d of %d replicas within %d ms; queued anyway (%d so far)",
                        acked, want, self.timeout_ms, self.short)
