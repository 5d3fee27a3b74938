"""Video jobs in Redis: the record written at creation, its state folded from the job's journal, and the state it
ended in written back to the record (by whoever sees the end first: the creating API process's keeper, `GET`,
`GET /videos`), so any API process answers for any video and one that dies loses nothing.

`progress` is the highest step any worker reported: a job whose worker died runs again from its start on another
(GenAI's pipeline takes no saved latents), and its progress holds where it was until the new run passes it.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from api.openai.videos.protocol import Video
from api.queue.journal import Journal, JournalBroken
from common.errors import ErrorBody, OvqError
from common.events import ACCEPTED, CANCELLED, DONE, ERROR, PROGRESS, EventDict
from common.jobs import VideoParams
from common.keys import Keys
from common.owner import OWNER_FIELD, Caller
from common.settings import Settings
from common.webhooks.events import VIDEO_EVENTS, Emitter

log = logging.getLogger("ovq.api.videos")
ENDED = ("completed", "failed")


def video_not_found(video_id: str) -> OvqError:
    return OvqError(f"Video with id '{video_id}' not found.", 404, param="video_id", code="not_found")


@dataclass
class VideoRecord:
    """A video job as created (`Keys.video`), with the state it ended in once it has."""

    id: str
    job: str
    model: str
    prompt: str
    seconds: int
    params: VideoParams
    created_at: int
    owner: str
    remixed_from: str | None = None
    ended: dict[str, bytes] = field(default_factory=dict)  # status, progress, completed_at, error, video, thumbnail

    def fields(self) -> dict[str, str | int]:
        return {"job": self.job, "model": self.model, "prompt": self.prompt, "seconds": self.seconds,
                "params": self.params.model_dump_json(), "created_at": self.created_at, OWNER_FIELD: self.owner,
                "remixed_from": self.remixed_from or ""}

    @classmethod
    def of(cls, video_id: str, fields: dict[bytes, bytes]) -> VideoRecord:
        ended = {k.decode(): fields[k] for k in (b"status", b"progress", b"completed_at", b"error", b"video",
                                                 b"thumbnail") if k in fields}
        return cls(video_id, fields[b"job"].decode(), fields[b"model"].decode(), fields[b"prompt"].decode(),
                   int(fields[b"seconds"]), VideoParams.model_validate_json(fields[b"params"]),
                   int(fields[b"created_at"]), fields[OWNER_FIELD.encode()].decode(),
                   fields.get(b"remixed_from", b"").decode() or None, ended)


class Fold:
    """A video's state from its job's events, in order from the first."""

    def __init__(self, record: VideoRecord, ttl_s: int) -> None:
        self.record = record
        params = record.params
        self.video = Video(id=record.id, model=record.model, status="queued", created_at=record.created_at,
                           expires_at=record.created_at + ttl_s, prompt=record.prompt, seconds=str(record.seconds),
                           size=f"{params.width}x{params.height}", remixed_from_video_id=record.remixed_from)
        self.content: dict[str, str] = {}
        if record.ended:
            self._ended(record.ended)

    @property
    def ended(self) -> bool:
        return self.video.status in ENDED

    def _ended(self, fields: dict[str, bytes]) -> None:
        video = self.video
        video.status = fields["status"].decode()  # type: ignore[assignment]
        video.progress = int(fields.get("progress", b"0"))
        video.completed_at = int(fields["completed_at"]) if fields.get("completed_at") else None
        video.error = ErrorBody.model_validate_json(fields["error"]) if fields.get("error") else None
        self.content = {k: fields[k].decode() for k in ("video", "thumbnail") if fields.get(k)}

    def feed(self, events: list[EventDict], now: float) -> None:
        video = self.video
        for event in events:
            kind = event["type"]
            if kind == ACCEPTED and video.status == "queued":
                video.status = "in_progress"
            elif kind == PROGRESS:  # the highest step reached: a rerun holds it until it passes it
                video.status = "in_progress"
                video.progress = max(video.progress, min(99, event["step"] * 100 // max(event["total"], 1)))
            elif kind == DONE:
                video.status, video.progress, video.completed_at = "completed", 100, int(now)
                self.content = {k: event[k] for k in ("video", "thumbnail") if event.get(k)}  # type: ignore[literal-required]
            elif kind == ERROR:
                self.fail(ErrorBody.model_validate(event["error"]), now)
            elif kind == CANCELLED:
                self.fail(ErrorBody(message="The video job was cancelled.", type="invalid_request_error",
                                    code="cancelled"), now)

    def fail(self, error: ErrorBody, now: float) -> None:
        video = self.video
        video.status, video.completed_at = "failed", int(now)
        video.error = error if error.code is not None else error.model_copy(update={"code": "video_generation_failed"})

    def ended_fields(self) -> dict[str, str | int]:
        video = self.video
        fields: dict[str, str | int] = {"status": video.status, "progress": video.progress,
                                        "completed_at": video.completed_at or 0, **self.content}
        if video.error is not None:
            fields["error"] = video.error.model_dump_json()
        return fields


class VideoStore:
    def __init__(self, redis: aioredis.Redis, keys: Keys, settings: Settings) -> None:
        self.redis, self.keys, self.settings = redis, keys, settings
        self.journal = Journal(redis, keys)
        self.webhooks = Emitter(redis, keys, settings)

    async def create(self, record: VideoRecord) -> None:
        ttl, now = self.settings.video_ttl_s, time.time()
        index = self.keys.videos_of(record.owner)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.keys.video(record.id), mapping=record.fields())
        pipe.expire(self.keys.video(record.id), ttl)
        pipe.zadd(index, {record.id: now})
        pipe.zremrangebyscore(index, "-inf", now - ttl)
        pipe.expire(index, ttl)
        await pipe.execute()

    async def record(self, video_id: str, caller: Caller) -> VideoRecord:
        """The video's record, if the caller may see it (another tenant's is not found, like a missing one)."""
        fields = await self.redis.hgetall(self.keys.video(video_id))
        if not fields or not caller.sees(fields.get(OWNER_FIELD.encode())):
            raise video_not_found(video_id)
        return VideoRecord.of(video_id, fields)

    async def current(self, record: VideoRecord) -> Fold:
        """The video as it stands: its ended state, or folded from its journal (then written back if it ended)."""
        fold = Fold(record, self.settings.video_ttl_s)
        if fold.ended:
            return fold
        seconds, _ = await self.redis.time()
        try:
            events, last = await self.journal.read(record.job, record.model)
            fold.feed(events, seconds)
            quiet = seconds - (last if last is not None else record.created_at)
            if not fold.ended and quiet > self.settings.video_stall_s:
                raise JournalBroken(f"No progress for {quiet:.0f}s (video_stall_s): the job was not taken by any "
                                    "worker, or its events were lost", "stalled")
        except JournalBroken as exc:
            log.warning("video %s failed: %s", record.id, exc)
            fold.fail(exc.body, seconds)
        if fold.ended:
            await self.settle(fold)
        return fold

    async def settle(self, fold: Fold) -> None:
        """Write the state it ended in to its record (idempotent: every settler writes the same), then its
        webhook event, once whoever settles it (stored first: a receiver that retrieves it on the event finds it)."""
        key = self.keys.video(fold.record.id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.exists(key)
        pipe.hset(key, mapping=fold.ended_fields())
        exists, _ = await pipe.execute()
        if not exists:  # deleted meanwhile: the HSET made a record without its creation's fields
            await self.redis.delete(key)
            return
        await self.webhooks.once(VIDEO_EVENTS[fold.video.status], fold.record.id, fold.record.owner)

    async def page(self, caller: Caller, limit: int, order: str, after: str | None) -> tuple[list[str], bool]:
        """Ids of the caller's videos, newest first (`desc`) or oldest first, after `after`."""
        index = self.keys.videos_of(caller.tenant)
        start = 0
        if after is not None:
            rank = await (self.redis.zrevrank(index, after) if order == "desc" else self.redis.zrank(index, after))
            if rank is None:
                raise OvqError(f"No video with id '{after}' to list after.", param="after", code="invalid_value")
            start = rank + 1
        read = self.redis.zrevrange if order == "desc" else self.redis.zrange
        ids = [i.decode() for i in await read(index, start, start + limit)]
        return ids[:limit], len(ids) > limit

    async def delete(self, fold: Fold) -> None:
        record = fold.record
        pipe = self.redis.pipeline(transaction=False)
        pipe.delete(self.keys.video(record.id))
        pipe.zrem(self.keys.videos_of(record.owner), record.id)
        for variant in ("video", "thumbnail"):
            pipe.delete(self.keys.video_content(record.job, variant, record.model))
        await pipe.execute()

    async def content(self, fold: Fold, variant: str) -> bytes:
        key = fold.content.get(variant)
        data = await self.redis.get(key) if key else None
        if data is None:
            raise OvqError(f"The {variant} of video '{fold.record.id}' has expired.", 404, param="video_id",
                           code="not_found")
        return data

