"""Uploaded and generated files (/v1/files): metadata in Redis, bytes in Redis or in a shared directory.

Every API process and batch worker, on any host, reaches the same files: the metadata is one Redis hash
(`Keys.files`), the bytes are either a Redis list of chunks (`Keys.file_data`, the default, capped in total) or a
file in `files_dir`, a volume every tier mounts. A file expires `files_ttl_s` after it was made (OpenAI's 30
days for batch files) unless deleted first; expired entries are trimmed by every listing and upload.

Each file's metadata records its owner (common/owner.py): the uploader's tenant, or a batch's owner for its output
and error files. A caller is shown, and may read or delete, only the files it sees; another's is a missing id.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Literal, Protocol

import redis.asyncio as aioredis

from common.batch.models import FileObject
from common.errors import OvqError
from common.keys import Keys
from common.owner import Caller
from common.settings import Settings

CHUNK = 1024 * 1024
# A directory file nobody indexes (an upload cut short) is removed once it is this old.
ORPHAN_S = 3600


class StoredFile(FileObject):
    """A file as OpenAI describes it, plus where its bytes are."""

    backend: Literal["redis", "directory"] = "redis"
    created: float = 0.0  # created_at to the microsecond: listings keep the upload order within a second
    owner: str | None = None  # whose it is (common/owner.py); None: stored before owners were


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex}"


class Blobs(Protocol):
    """Where a file's bytes live."""

    async def write(self, file_id: str, chunks: AsyncIterator[bytes], ttl_s: int) -> None: ...

    def read(self, file_id: str) -> AsyncIterator[bytes]: ...

    async def delete(self, file_id: str) -> None: ...


class RedisBlobs:
    """A list of chunks with the file's TTL: no Redis command handles more than a chunk."""

    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self.redis, self.keys = redis, keys

    async def write(self, file_id: str, chunks: AsyncIterator[bytes], ttl_s: int) -> None:
        key = self.keys.file_data(file_id)
        await self.redis.delete(key)
        async for chunk in chunks:
            pipe = self.redis.pipeline(transaction=False)
            pipe.rpush(key, chunk)
            pipe.expire(key, ttl_s)
            await pipe.execute()

    async def read(self, file_id: str) -> AsyncIterator[bytes]:
        key = self.keys.file_data(file_id)
        for index in range(await self.redis.llen(key)):
            chunk = await self.redis.lindex(key, index)
            if chunk is None:  # deleted or expired while read
                return
            yield chunk

    async def delete(self, file_id: str) -> None:
        await self.redis.delete(self.keys.file_data(file_id))


class DirectoryBlobs:
    """One file per id in a directory every tier mounts; written under a temporary name, then renamed."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, file_id: str) -> Path:
        return self.root / file_id

    async def write(self, file_id: str, chunks: AsyncIterator[bytes], ttl_s: int) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        part = self.root / f"{file_id}.{uuid.uuid4().hex[:8]}.part"
        handle = await asyncio.to_thread(part.open, "wb")
        try:
            async for chunk in chunks:
                await asyncio.to_thread(handle.write, chunk)
        except BaseException:
            handle.close()
            part.unlink(missing_ok=True)
            raise
        handle.close()
        await asyncio.to_thread(part.replace, self.path(file_id))

    async def read(self, file_id: str) -> AsyncIterator[bytes]:
        try:
            handle = await asyncio.to_thread(self.path(file_id).open, "rb")
        except FileNotFoundError:
            return
        with handle:
            while chunk := await asyncio.to_thread(handle.read, CHUNK):
                yield chunk

    async def delete(self, file_id: str) -> None:
        self.path(file_id).unlink(missing_ok=True)

    def orphans(self, known: set[str]) -> list[Path]:
        """Files nobody indexes (uploads cut short, entries trimmed on another host) older than ORPHAN_S."""
        if not self.root.is_dir():
            return []
        old = time.time() - ORPHAN_S
        return [p for p in self.root.iterdir()
                if p.name.split(".")[0] not in known and p.stat().st_mtime < old]


async def _limited(chunks: AsyncIterator[bytes], limit: int, too_large: OvqError) -> AsyncIterator[bytes]:
    """The chunks, refused with `too_large` as soon as they pass `limit` bytes (nothing past it is written)."""
    total = 0
    async for chunk in chunks:
        total += len(chunk)
        if total > limit:
            raise too_large
        yield chunk


async def from_bytes(parts: Iterable[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


class FileStore:
    def __init__(self, redis: aioredis.Redis, keys: Keys, settings: Settings) -> None:
        self.redis, self.keys, self.settings = redis, keys, settings
        self.backend = settings.files_backend
        if self.backend == "directory" and settings.files_dir is None:
            raise ValueError("OVQ_FILES_BACKEND=directory needs OVQ_FILES_DIR (a volume every tier mounts)")
        self._blobs: dict[str, Blobs] = {"redis": RedisBlobs(redis, keys)}
        if settings.files_dir is not None:
            self._blobs["directory"] = DirectoryBlobs(Path(settings.files_dir))

    def blobs(self, stored: StoredFile) -> Blobs:
        return self._blobs[stored.backend]

    async def create(self, filename: str, purpose: str, chunks: AsyncIterator[bytes], owner: str | None,
                     file_id: str | None = None, ttl_s: int | None = None) -> StoredFile:
        """Store a new file (or replace `file_id`'s bytes) owned by `owner`; 413 past files_max_bytes or the Redis
        total."""
        live = await self.trim()
        file_id = file_id or new_file_id()
        ttl_s = ttl_s or self.settings.files_ttl_s
        limit = self.settings.files_max_bytes
        too_large = OvqError(f"The file is larger than the {limit} bytes a file may have", 413, param="file",
                             code="file_too_large")
        if self.backend == "redis":
            used = sum(f.bytes for f in live if f.backend == "redis" and f.id != file_id)
            room = self.settings.files_redis_max_total_bytes - used
            if room < limit:
                limit = max(room, 0)
                too_large = OvqError("File storage is full: delete files you no longer need, or ask the operator for "
                                     "a larger files_redis_max_total_bytes", 413, param="file", code="storage_full")
        size = 0

        async def counted() -> AsyncIterator[bytes]:
            nonlocal size
            async for chunk in _limited(chunks, limit, too_large):
                size += len(chunk)
                yield chunk

        blobs = self._blobs[self.backend]
        now = time.time()
        try:
            await blobs.write(file_id, counted(), ttl_s)
        except BaseException:
            await blobs.delete(file_id)
            raise
        stored = StoredFile(id=file_id, bytes=size, created_at=int(now), expires_at=int(now) + ttl_s,
                            filename=filename, purpose=purpose, backend=self.backend, created=now, owner=owner)
        await self.redis.hset(self.keys.files, file_id, stored.model_dump_json())
        return stored

    async def get(self, file_id: str, caller: Caller) -> StoredFile | None:
        """The live file, when the caller sees it (else None, as for a missing one)."""
        raw = await self.redis.hget(self.keys.files, file_id)
        if raw is None:
            return None
        stored = StoredFile.model_validate_json(raw)
        if stored.expires_at is not None and stored.expires_at <= time.time():
            await self._forget(stored)
            return None
        return stored if caller.sees(stored.owner) else None

    async def list(self, caller: Caller, purpose: str | None = None) -> list[StoredFile]:
        """Every live file the caller sees (of `purpose`), oldest first."""
        files = [f for f in await self.trim() if (purpose is None or f.purpose == purpose) and caller.sees(f.owner)]
        return sorted(files, key=lambda f: (f.created, f.id))

    async def read(self, stored: StoredFile) -> AsyncIterator[bytes]:
        async for chunk in self.blobs(stored).read(stored.id):
            yield chunk

    async def read_all(self, stored: StoredFile) -> bytes:
        return b"".join([chunk async for chunk in self.read(stored)])

    async def delete(self, file_id: str, caller: Caller) -> bool:
        stored = await self.get(file_id, caller)
        if stored is None:
            return False
        await self._forget(stored)
        return True

    async def _forget(self, stored: StoredFile) -> None:
        await self.redis.hdel(self.keys.files, stored.id)
        await self.blobs(stored).delete(stored.id)

    async def trim(self) -> list[StoredFile]:
        """Forget expired files (their bytes too); returns the live ones."""
        now = time.time()
        live, expired = [], []
        for raw in (await self.redis.hgetall(self.keys.files)).values():
            stored = StoredFile.model_validate_json(raw)
            (expired if stored.expires_at is not None and stored.expires_at <= now else live).append(stored)
        for stored in expired:
            await self._forget(stored)
        directory = self._blobs.get("directory")
        if isinstance(directory, DirectoryBlobs):
            for orphan in directory.orphans({f.id for f in live}):
                orphan.unlink(missing_ok=True)
        return live
