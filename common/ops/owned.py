"""The Batch API's stored objects as an operator sees them: every tenant's, each with whose it is (common/owner.py).
Shared by `ovq jobs batches` / `ovq jobs files` and the ops page."""
from __future__ import annotations

import redis.asyncio as aioredis
from pydantic import BaseModel

from common.batch.files import FileStore
from common.batch.store import Batches
from common.keys import Keys
from common.owner import OPERATOR, shown
from common.settings import Settings


class OwnedBatch(BaseModel):
    id: str
    owner: str
    status: str
    model: str | None
    created: int
    total: int
    completed: int
    failed: int


class OwnedFile(BaseModel):
    id: str
    owner: str
    filename: str
    purpose: str
    bytes: int
    created: int


async def batches(redis: aioredis.Redis, keys: Keys, settings: Settings, limit: int = 50) -> list[OwnedBatch]:
    """The newest batches still kept, whoever's."""
    found, _ = await Batches(redis, keys, settings).page(None, limit, OPERATOR)
    return [OwnedBatch(id=b.id, owner=shown(b.owner), status=b.status, model=b.model, created=b.created_at,
                       total=b.total, completed=b.completed, failed=b.failed) for b in found]


async def files(redis: aioredis.Redis, keys: Keys, settings: Settings, limit: int = 50) -> list[OwnedFile]:
    """The newest files still kept, whoever's."""
    listed = await FileStore(redis, keys, settings).list(OPERATOR)
    return [OwnedFile(id=f.id, owner=shown(f.owner), filename=f.filename, purpose=f.purpose, bytes=f.bytes,
                      created=f.created_at) for f in reversed(listed[-limit:])]
