"""API keys: `Authorization: Bearer KEY` checked before a request's body is read (a pure ASGI middleware).

- Every route but the health probes and the operator routes (so `/v1/*`, `/v3/*`, and any path that does not
  exist) needs an API key (`OVQ_API_KEYS`, `OVQ_API_KEY_FILE`) when any is configured.
- Operator routes (`/metrics`, `/docs`, `/openapi.json`, `/ops`) need an admin key (`OVQ_ADMIN_KEYS`,
  `OVQ_ADMIN_KEY_FILE`), as a Bearer token or as the password of HTTP Basic auth (so a browser can open them).
  With no admin key they are open only while no API key is configured either: a server with API keys never
  shows its operator routes to anyone without an admin key (fail closed).
- Health probes (`/health`, `/v1/health`, `/v3/health`, `/v2/health/*`, `/v2/models/*/ready`) are always open:
  load balancers and orchestrators carry no keys.

Protected mode (as Redis has): an API bound to an address other than loopback with no API key configured refuses
to start (`exposure_refusal`), unless OVQ_ALLOW_UNAUTHENTICATED says an open API is meant; on 127.0.0.1 it is
open as before.

Keys are compared as SHA-256 digests with `hmac.compare_digest`, against every configured key, so the time taken
says nothing about how much of a key matched or which key it was. Keys are never logged, put in metrics or
written to Redis: nothing here keeps the header past the comparison.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import re
from collections.abc import Iterable
from pathlib import Path

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from common.settings import Settings

OPEN = re.compile(r"(/v1|/v3)?/health|/v2/health/(live|ready)|/v2/models/.+/ready")
ADMIN_PREFIXES = ("/metrics", "/docs", "/openapi.json", "/ops")


class KeyFileError(Exception):
    pass


def read_key_file(path: Path) -> list[str]:
    """OVMS's --api_key_file format: one key per line; blank lines and surrounding spaces ignored."""
    try:
        keys = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"cannot read the key file {path}: {exc.__class__.__name__}") from None
    if not keys:
        raise KeyFileError(f"the key file {path} holds no key")
    return keys


def _digest(key: str | bytes) -> bytes:
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).digest()


class KeySet:
    """Configured keys as digests; `matches` takes the same time whichever key, if any, is given."""

    def __init__(self, keys: Iterable[str]) -> None:
        self.digests = [_digest(key) for key in keys]

    def __bool__(self) -> bool:
        return bool(self.digests)

    def matches(self, key: bytes | None) -> bool:
        given = _digest(key or b"")
        found = False
        for digest in self.digests:  # no early exit
            found |= hmac.compare_digest(given, digest)
        return found and key is not None


def load_keys(settings: Settings) -> tuple[KeySet, KeySet]:
    """(API keys, admin keys) from the settings and key files; a key file that cannot be read is fatal."""
    api = [k.get_secret_value() for k in settings.api_keys]
    admin = [k.get_secret_value() for k in settings.admin_keys]
    if settings.api_key_file:
        api += read_key_file(settings.api_key_file)
    if settings.admin_key_file:
        admin += read_key_file(settings.admin_key_file)
    return KeySet(k for k in api if k), KeySet(k for k in admin if k)


def is_loopback(host: str) -> bool:
    """Only this machine can connect: `localhost` or a loopback address (a name that needs DNS does not count)."""
    name = host.strip().strip("[]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def exposure_refusal(settings: Settings, keys: tuple[KeySet, KeySet]) -> str | None:
    """Why this API must not start (one line that says what to do), or None."""
    if keys[0] or settings.allow_unauthenticated or is_loopback(settings.host):
        return None
    return (f"refusing to serve on {settings.host}:{settings.port} with no API key: anyone who reaches it could use "
            "the models. Set a key (--api-key KEY, OVQ_API_KEYS or OVQ_API_KEY_FILE), bind to 127.0.0.1, or pass "
            "--allow-unauthenticated (OVQ_ALLOW_UNAUTHENTICATED=1) if an open API is meant")


def presented_key(scope: Scope) -> bytes | None:
    """The Bearer token, or the password of HTTP Basic auth; None when neither is there."""
    for name, value in scope["headers"]:
        if name != b"authorization":
            continue
        scheme, _, credentials = value.strip().partition(b" ")
        if scheme.lower() == b"bearer":
            return credentials.strip() or None
        if scheme.lower() == b"basic":
            try:
                return base64.b64decode(credentials.strip(), validate=True).partition(b":")[2] or None
            except (binascii.Error, ValueError):
                return None
        return None
    return None


def _error(message: str) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                   "code": "invalid_api_key"}})


async def refuse(send: Send, message: str, challenge: bytes) -> None:
    body = _error(message)
    await send({"type": "http.response.start", "status": 401, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"www-authenticate", challenge)]})
    await send({"type": "http.response.body", "body": body})


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, keys: tuple[KeySet, KeySet]) -> None:
        self.app = app
        self.api_keys, self.admin_keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            if OPEN.fullmatch(path):
                pass
            elif path.startswith(ADMIN_PREFIXES):
                if not self._admin_allowed(scope):
                    return await refuse(send, "This operator route needs an admin key (OVQ_ADMIN_KEYS)",
                                        b'Basic realm="ovq admin", charset="UTF-8"')
            elif self.api_keys and not self.api_keys.matches(key := presented_key(scope)):
                message = ("You didn't provide an API key: send it as `Authorization: Bearer KEY`" if key is None
                           else "Incorrect API key provided")
                return await refuse(send, message, b'Bearer realm="ovq"')
        await self.app(scope, receive, send)

    def _admin_allowed(self, scope: Scope) -> bool:
        if self.admin_keys:
            return self.admin_keys.matches(presented_key(scope))
        return not self.api_keys
