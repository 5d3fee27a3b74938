"""The request body guard (a pure ASGI middleware): a size cap, and a client that leaves mid-body is a 499.

The cap (`OVQ_MAX_BODY_BYTES`; for /images/edits at least two uploads' worth, for /files one file of
OVQ_FILES_MAX_BYTES, for audio uploads one of OVQ_MAX_AUDIO_BYTES) is checked against Content-Length before anything
is read, and counted while a chunked body streams in, so an oversized body is refused (413, `request_too_large`)
without being read whole; the connection is closed after the refusal (`api/http/timeouts.py` closes any connection
answered before its body was all in).
"""
from __future__ import annotations

import logging

import orjson
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.http.status import CLIENT_CLOSED
from common.errors import OvqError
from common.settings import Settings

log = logging.getLogger("ovq.api")
EDITS_SLACK = 1024 * 1024  # form fields and multipart framing beside the two uploads


def too_large_error(limit: int) -> OvqError:
    return OvqError(f"the request body is over {limit} bytes (OVQ_MAX_BODY_BYTES)", 413,
                    code="request_too_large")


def content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def too_large(send: Send, limit: int) -> None:
    body = orjson.dumps({"error": too_large_error(limit).body.model_dump()})
    await send({"type": "http.response.start", "status": 413, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class BodyGuard:
    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.limit = settings.max_body_bytes
        self.edits_limit = max(self.limit, 2 * settings.max_upload_bytes + EDITS_SLACK)
        self.files_limit = max(self.limit, settings.files_max_bytes + EDITS_SLACK)
        self.audio_limit = max(self.limit, settings.max_audio_bytes + EDITS_SLACK)

    def _limit(self, path: str) -> int:
        if path.endswith("/images/edits"):
            return self.edits_limit
        if path.endswith(("/audio/transcriptions", "/audio/translations")):
            return self.audio_limit
        return self.files_limit if path.endswith("/files") else self.limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            return await self.app(scope, receive, send)
        limit = self._limit(scope["path"])
        length = content_length(scope)
        if length is not None and length > limit:
            return await too_large(send, limit)
        received = 0

        async def counted() -> Message:
            """The body as it streams in; over the cap it raises, and the app answers that error (413)."""
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise too_large_error(limit)
            return message

        try:
            await self.app(scope, counted, send)
        except ClientDisconnect:
            log.info("%s %s %d: the connection closed before the request body was all received", scope["method"],
                     scope["path"], CLIENT_CLOSED)
