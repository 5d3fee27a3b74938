"""What an operator lists of the Batch API's objects: every tenant's, each with whose it is."""
from __future__ import annotations

import time

import redis.asyncio as aioredis

from common.batch.files import FileStore, from_bytes
from common.batch.store import Batches, BatchState
from common.keys import Keys
from common.ops import owned
from common.settings import Settings


async def test_every_tenants_batches_and_files_with_their_owners(redis_url: str) -> None:
    redis, keys, settings = aioredis.Redis.from_url(redis_url), Keys(f"owned{time.time_ns()}"), Settings()
    now = int(time.time())
    for n, owner in enumerate(("alpha", "beta", None)):
        await Batches(redis, keys, settings).create(BatchState(
            id=f"batch_{n}", endpoint="/v1/chat/completions", input_file_id="file-x", completion_window="24h",
            created_at=now + n, expires_at=now + 3600, owner=owner))
        await FileStore(redis, keys, settings).create(f"f{n}.jsonl", "batch", from_bytes([b"{}"]), owner)
    batches = await owned.batches(redis, keys, settings)
    assert [(b.id, b.owner) for b in batches] == [("batch_2", "(before owners)"), ("batch_1", "beta"),
                                                  ("batch_0", "alpha")]
    files = await owned.files(redis, keys, settings)
    assert [(f.filename, f.owner) for f in files] == [("f2.jsonl", "(before owners)"), ("f1.jsonl", "beta"),
                                                      ("f0.jsonl", "alpha")]
    await redis.aclose()
