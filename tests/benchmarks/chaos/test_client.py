"""benchmarks/chaos/client.py: a stream goes on reconnecting for as long as a failover may last, not a fixed count."""
from __future__ import annotations

import asyncio

import pytest

from benchmarks.chaos import client


async def test_patience_lasts_its_bound_since_the_stream_last_heard_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pauses double up to the cap; the bound counts from the last event heard, so a stream that keeps receiving
    is never given up (12 tries a second apart once gave up on a stream inside one 85 s failover)."""
    monkeypatch.setattr(client, "RESUME_BOUND_S", 0.35)
    monkeypatch.setattr(client, "BACKOFF_S", 0.02)
    monkeypatch.setattr(client, "BACKOFF_CAP_S", 0.08)
    patience = client.Patience()
    pauses = []
    while True:
        pause = patience.pause
        if not await patience.wait():
            break
        pauses.append(pause)
    assert pauses[:3] == [0.02, 0.04, 0.08] and set(pauses[3:]) <= {0.08}
    assert 0.25 <= sum(pauses) <= 0.35  # as long as the bound allows, and no longer
    patience.heard()  # an event arrived: the bound starts over, the pauses too
    assert patience.pause == 0.02 and await patience.wait()
    await asyncio.sleep(0)
