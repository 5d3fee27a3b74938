"""A webhook event as OpenAI sends it (`openai.types.webhooks`), and its emission into Redis (`Keys.webhooks`).

An event is emitted where what it tells of ends, by whichever tier ends it: a batch's end script (common/batch/
store.py, in the same Lua call that makes the batch terminal, so a batch that ended has its event), the API saving
a background response (api/openai/responses/background.py) or a video's end (api/openai/videos/store.py); several
API processes may see one end, so a marker, `Keys.webhook_sent`, lets only the first emit. The event carries its
tenant; which endpoints it goes to is read by the deliverers from the key file when they take it (workers never
hold the keys).
"""
from __future__ import annotations

import time
import uuid
from typing import Literal

import redis.asyncio as aioredis
from pydantic import BaseModel

from common.keys import Keys
from common.settings import Settings

EventType = Literal["response.completed", "response.failed", "response.cancelled", "response.incomplete",
                    "batch.completed", "batch.failed", "batch.expired", "batch.cancelled", "video.completed",
                    "video.failed"]
EVENT_TYPES: tuple[str, ...] = EventType.__args__  # type: ignore[attr-defined]
# A response's status at its end -> its event (`queued` and `in_progress` have none).
RESPONSE_EVENTS = {"completed": "response.completed", "failed": "response.failed",
                   "cancelled": "response.cancelled", "incomplete": "response.incomplete"}
# A video's status at its end -> its event (OpenAI's Videos API names these two).
VIDEO_EVENTS = {"completed": "video.completed", "failed": "video.failed"}

# Lua, put before a script that emits: adds an event to the stream and renews the stream's TTL.
# emit(stream, payload JSON, tenant, MAXLEN, TTL s)
EMIT_FUNCTION = """
local function emit_webhook(stream, payload, tenant, maxlen, ttl)
  redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*', 'e', payload, 't', tenant)
  redis.call('EXPIRE', stream, ttl)
end
"""
# KEYS: marker, stream. ARGV: payload, tenant, MAXLEN, stream TTL, marker TTL. 1 when emitted, 0 when it was.
EMIT_ONCE = EMIT_FUNCTION + """
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[5]) then return 0 end
emit_webhook(KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
return 1
"""


class EventData(BaseModel):
    id: str  # the response's, the batch's or the video's id


class WebhookEvent(BaseModel):
    """OpenAI's webhook event object (`openai.types.webhooks.*WebhookEvent`)."""

    id: str
    object: Literal["event"] = "event"
    type: EventType
    created_at: int
    data: EventData


def new_event(kind: str, object_id: str) -> WebhookEvent:
    """An event with a new id: the `webhook-id` every delivery of it carries, retries too."""
    return WebhookEvent(id="evt_" + uuid.uuid4().hex, type=kind, created_at=int(time.time()),  # type: ignore[arg-type]
                        data=EventData(id=object_id))


def stream_ttl_s(settings: Settings) -> int:
    """The events stream's (and retry set's, log's) TTL: no delivery is kept past webhook_retry_for_s anyway."""
    return int(2 * settings.webhook_retry_for_s) + 1


def emit_args(event: WebhookEvent, tenant: str | None, settings: Settings) -> list[str | int]:
    """The Lua arguments that go with `EMIT_FUNCTION`: payload, tenant, MAXLEN, TTL."""
    return [event.model_dump_json(), tenant or "", settings.webhook_max_events, stream_ttl_s(settings)]


class Emitter:
    """Emits events once per source (a background response's id), from any number of API processes."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, settings: Settings) -> None:
        self.keys, self.settings = keys, settings
        self._emit = redis.register_script(EMIT_ONCE)

    async def once(self, kind: str, object_id: str, tenant: str | None) -> bool:
        """Emit `kind` for `object_id` unless it was; True when this call emitted it."""
        args = [*emit_args(new_event(kind, object_id), tenant, self.settings), 2 * self.settings.journal_ttl_s]
        return bool(await self._emit(keys=[self.keys.webhook_sent(object_id), self.keys.webhooks], args=args))
