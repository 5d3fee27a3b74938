"""API keys: `Authorization: Bearer KEY` checked before a request's body is read (a pure ASGI middleware).

- Every route but the health probes and the operator routes (so `/v1/*`, `/v3/*`, and any path that does not
  exist) needs an API key (`OVQ_API_KEYS`, `OVQ_API_KEY_FILE`) when any is configured.
- Operator routes (`/metrics`, `/docs`, `/openapi.json`, `/ops`, `/v1/config`, and `/v1/load_lora_adapter`,
  `/v1/unload_lora_adapter` under either API prefix) need an admin key (`OVQ_ADMIN_KEYS`,
  `OVQ_ADMIN_KEY_FILE`), as a Bearer token or as the password of HTTP Basic auth (so a browser can open them).
  With no admin key they are open only while no API key is configured either: a server with API keys never
  shows its operator routes to anyone without an admin key (fail closed).
- The admin key is also accepted where an API key is: its caller is an operator, who sees every tenant's stored
  objects (common/owner.py); an API key's caller sees only its tenant's.
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
import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from common.jobs import Priority
from common.owner import NOBODY, OPERATOR, Caller
from common.settings import Settings
from common.webhooks.endpoints import WebhookEndpoint

OPEN = re.compile(r"(/v1|/v3)?/health|/v2/health/(live|ready)|/v2/models/.+/ready")
ADMIN_PREFIXES = ("/metrics", "/docs", "/openapi.json", "/ops", "/v1/config", "/v3/config")
# Operator routes under the API prefixes: loading and unloading LoRA adapters (api/openai/lora.py).
ADMIN_PATHS = frozenset(f"{prefix}{path}" for prefix in ("/v1", "/v3")
                        for path in ("/load_lora_adapter", "/unload_lora_adapter"))
KEY_STATE = "api_key"  # request.state's attribute holding the presented key's `KeyAttributes`
CALLER_STATE = "caller"  # request.state's attribute holding the `Caller`: whose objects it sees (common/owner.py)


class KeyFileError(Exception):
    pass


class KeyAttributes(BaseModel):
    """What a key may do, from a structured key file (YAML or JSON); a plain key has the defaults. `tenant` names
    whose work it is (fair shares, quotas); `max_priority` the highest level it may ask for (`common.jobs.LEVELS`);
    `weight` its tenant's fair share; `tokens_per_min` its tenant's token-rate quota (None: none); `webhooks` the
    endpoints its tenant's webhook events are delivered to (common/webhooks/endpoints.py)."""

    model_config = ConfigDict(extra="forbid")

    key: SecretStr
    name: str | None = None
    tenant: str | None = None
    max_priority: Priority = "interactive"
    weight: float = Field(1.0, gt=0)
    tokens_per_min: int | None = Field(None, gt=0)
    webhooks: list[WebhookEndpoint] = Field(default_factory=list)  # where its tenant's events go (api/webhooks/)

    @property
    def who(self) -> str:
        """The tenant: as given, else the key's name, else a short digest of the key (never the key itself)."""
        return self.tenant or self.name or "key-" + hashlib.sha256(self.key.get_secret_value().encode()).hexdigest()[:8]


class KeyFile(BaseModel):
    keys: list[KeyAttributes]


def read_key_file(path: Path) -> list[str]:
    """OVMS's --api_key_file format: one key per line; blank lines and surrounding spaces ignored."""
    return [k.key.get_secret_value() for k in read_keys(path)]


def read_keys(path: Path) -> list[KeyAttributes]:
    """A key file: OVMS's plain format (one key per line), or, named *.yaml, *.yml or *.json, `{keys: [{key, name,
    tenant, max_priority, weight, tokens_per_min, webhooks}, ...]}`."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"cannot read the key file {path}: {exc.__class__.__name__}") from None
    if path.suffix.lower() in (".yaml", ".yml", ".json"):
        try:
            keys = KeyFile.model_validate(yaml.safe_load(text)).keys
        except (yaml.YAMLError, ValidationError) as exc:
            raise KeyFileError(f"the key file {path} is not a valid keys file: "
                               f"{exc.__class__.__name__}") from None  # never echo a line: it may hold a key
    else:
        keys = [KeyAttributes(key=line.strip()) for line in text.splitlines() if line.strip()]
    if not keys:
        raise KeyFileError(f"the key file {path} holds no key")
    return keys


def caller_of(request: Request) -> Caller:
    """Whose stored objects this request sees (set by `ApiKeyMiddleware`; a request it did not see sees none)."""
    return getattr(request.state, CALLER_STATE, NOBODY)


def _digest(key: str | bytes) -> bytes:
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).digest()


class KeySet:
    """Configured keys as digests; `matches` and `find` take the same time whichever key, if any, is given."""

    def __init__(self, keys: Iterable[str | KeyAttributes]) -> None:
        self.attributes = [k if isinstance(k, KeyAttributes) else KeyAttributes(key=k) for k in keys]
        self.digests = [_digest(k.key.get_secret_value()) for k in self.attributes]

    def __bool__(self) -> bool:
        return bool(self.digests)

    def matches(self, key: bytes | None) -> bool:
        return self.find(key) is not None

    def find(self, key: bytes | None) -> KeyAttributes | None:
        """The attributes of the given key, if it is one of the set."""
        given = _digest(key or b"")
        found = None
        for digest, attributes in zip(self.digests, self.attributes, strict=True):  # no early exit
            if hmac.compare_digest(given, digest):
                found = attributes
        return found if key is not None else None

    def of_tenant(self, tenant: str) -> KeyAttributes | None:
        """The first key of a tenant (its attributes: weight, quota, max_priority), for work run on its behalf."""
        return next((k for k in self.attributes if k.who == tenant), None)


def load_keys(settings: Settings) -> tuple[KeySet, KeySet]:
    """(API keys, admin keys) from the settings and key files; a key file that cannot be read is fatal."""
    api: list[str | KeyAttributes] = [k.get_secret_value() for k in settings.api_keys]
    admin = [k.get_secret_value() for k in settings.admin_keys]
    if settings.api_key_file:
        api += read_keys(settings.api_key_file)
    if settings.admin_key_file:
        admin += read_key_file(settings.admin_key_file)
    return KeySet(k for k in api if k and (isinstance(k, str) or k.key.get_secret_value())), \
        KeySet(k for k in admin if k)


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
        self._callers: dict[int, Caller] = {}  # by id() of the key's attributes, which live as long as the key set

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            if OPEN.fullmatch(path):
                pass
            elif path.startswith(ADMIN_PREFIXES) or path in ADMIN_PATHS:
                if not self._admin_allowed(scope):
                    return await refuse(send, "This operator route needs an admin key (OVQ_ADMIN_KEYS)",
                                        b'Basic realm="ovq admin", charset="UTF-8"')
                scope.setdefault("state", {})[CALLER_STATE] = OPERATOR
            elif self.api_keys:
                key = presented_key(scope)
                attributes, admin = self.api_keys.find(key), self.admin_keys.find(key)
                if attributes is None and admin is None:
                    message = ("You didn't provide an API key: send it as `Authorization: Bearer KEY`" if key is None
                               else "Incorrect API key provided")
                    return await refuse(send, message, b'Bearer realm="ovq"')
                state = scope.setdefault("state", {})
                found = attributes or admin
                state[KEY_STATE] = found  # request.state.api_key: its attributes
                state[CALLER_STATE] = self._caller(found, admin=attributes is None)  # type: ignore[arg-type]
            else:  # keys off: one tenant, which is its own operator
                scope.setdefault("state", {})[CALLER_STATE] = OPERATOR
        await self.app(scope, receive, send)

    def _caller(self, key: KeyAttributes, admin: bool) -> Caller:
        """The key's caller (made once per key: `who` hashes a plain key)."""
        caller = self._callers.get(id(key))
        if caller is None:
            caller = self._callers[id(key)] = Caller(key.who, admin=admin)
        return caller

    def _admin_allowed(self, scope: Scope) -> bool:
        if self.admin_keys:
            return self.admin_keys.matches(presented_key(scope))
        return not self.api_keys
