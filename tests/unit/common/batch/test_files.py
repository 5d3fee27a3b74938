"""The file store on the real redis-server: Redis chunks or a shared directory, limits, expiry, delete."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from common.batch.files import CHUNK, FileStore, from_bytes
from common.errors import OvqError
from common.keys import Keys
from common.owner import Caller
from common.settings import Settings

A = Caller("a")


@pytest.fixture(params=["redis", "directory"])
async def store(request, redis_url: str, tmp_path: Path):
    redis = aioredis.Redis.from_url(redis_url)
    settings = Settings(files_backend=request.param, files_dir=tmp_path / "files", files_max_bytes=3 * CHUNK,
                        files_redis_max_total_bytes=5 * CHUNK)
    yield FileStore(redis, Keys(f"files{time.time_ns()}"), settings)
    await redis.aclose()


async def test_round_trip_list_and_delete(store: FileStore) -> None:
    data = os.urandom(2 * CHUNK + 7)
    stored = await store.create("in.jsonl", "batch", from_bytes([data[:100], data[100:]]), "a")
    assert (stored.bytes, stored.purpose, stored.filename) == (len(data), "batch", "in.jsonl")
    assert stored.expires_at == stored.created_at + store.settings.files_ttl_s
    assert await store.get(stored.id, A) == stored
    assert await store.read_all(stored) == data
    other = await store.create("out.jsonl", "batch_output", from_bytes([b"x"]), "a")
    assert [f.id for f in await store.list(A)] == [stored.id, other.id]
    assert [f.id for f in await store.list(A, "batch_output")] == [other.id]
    assert await store.delete(stored.id, A)
    assert await store.get(stored.id, A) is None and not await store.delete(stored.id, A)
    assert await store.read_all(stored) == b""  # the bytes are gone too


async def test_a_file_over_the_limit_is_refused_and_leaves_nothing(store: FileStore) -> None:
    with pytest.raises(OvqError) as caught:
        await store.create("big", "batch", from_bytes([os.urandom(CHUNK)] * 4), "a")
    assert (caught.value.status, caught.value.body.code) == (413, "file_too_large")
    assert await store.list(A) == []
    if store.backend == "directory":
        assert list(Path(store.settings.files_dir).iterdir()) == []


async def test_expired_files_are_forgotten(store: FileStore) -> None:
    stored = await store.create("soon", "batch", from_bytes([b"abc"]), "a", ttl_s=1)
    assert await store.get(stored.id, A) is not None
    await store.redis.hset(store.keys.files, stored.id,
                           stored.model_copy(update={"expires_at": int(time.time()) - 1}).model_dump_json())
    assert await store.list(A) == []
    assert await store.read_all(stored) == b""


async def test_redis_storage_is_capped_in_total(redis_url: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    store = FileStore(redis, Keys(f"cap{time.time_ns()}"),
                      Settings(files_max_bytes=3 * CHUNK, files_redis_max_total_bytes=4 * CHUNK))
    first = await store.create("a", "batch", from_bytes([os.urandom(CHUNK)] * 3), "a")
    with pytest.raises(OvqError) as caught:
        await store.create("b", "batch", from_bytes([os.urandom(CHUNK)] * 2), "a")
    assert (caught.value.status, caught.value.body.code) == (413, "storage_full")
    assert await redis.ttl(store.keys.file_data(first.id)) > 0
    await store.delete(first.id, A)
    await store.create("b", "batch", from_bytes([os.urandom(CHUNK)] * 2), "a")
    await redis.aclose()


async def test_another_tenants_file_is_a_missing_one(store: FileStore) -> None:
    mine = await store.create("a.jsonl", "batch", from_bytes([b"a"]), "a")
    theirs = await store.create("b.jsonl", "batch", from_bytes([b"b"]), "b")
    old = await store.create("old.jsonl", "batch", from_bytes([b"o"]), None)  # stored before owners were
    assert [f.id for f in await store.list(A)] == [mine.id]
    assert await store.get(theirs.id, A) is None and await store.get(old.id, A) is None
    assert not await store.delete(theirs.id, A)
    assert await store.get(theirs.id, Caller("b")) == theirs  # still there for its owner
    admin = Caller("ops", admin=True)
    assert [f.id for f in await store.list(admin)] == [mine.id, theirs.id, old.id]
    assert await store.delete(old.id, admin)
