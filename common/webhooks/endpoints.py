"""Where a tenant's webhook events go: the `webhooks` of its keys in the key file (docs/how-to/webhooks.md).

    keys:
      - key: sk-alpha
        tenant: alpha
        webhooks:
          - {url: "https://hooks.example.com/ovq", secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}
          - {url: "https://audit.example.com/in", secret: "whsec_...", events: [batch.completed, batch.failed]}

A secret is Standard Webhooks': `whsec_` and the base64 of 24 to 64 random bytes (`ovq webhooks secret` makes one).
Secrets stay in the API processes' memory: never in Redis, logs or metrics.
"""
from __future__ import annotations

import base64
import binascii
import secrets
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, SecretStr, field_validator

from common.webhooks.events import EventType

SECRET_PREFIX = "whsec_"


class WebhookEndpoint(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str
    secret: SecretStr
    events: list[EventType] | None = None  # None: every event type

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("a webhook URL is http:// or https:// with a host")
        return url

    @field_validator("secret")
    @classmethod
    def _standard_secret(cls, secret: SecretStr) -> SecretStr:
        secret_key(secret.get_secret_value())  # raises on a malformed one (never echoing it)
        return secret

    @property
    def key(self) -> bytes:
        return secret_key(self.secret.get_secret_value())

    def wants(self, kind: str) -> bool:
        return self.events is None or kind in self.events


def secret_key(secret: str) -> bytes:
    """The HMAC key a `whsec_` secret stands for."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError(f"a webhook secret starts with {SECRET_PREFIX} (Standard Webhooks)")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX):], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("a webhook secret is whsec_ and base64") from None
    if not 24 <= len(key) <= 64:
        raise ValueError("a webhook secret's key is 24 to 64 bytes (Standard Webhooks)")
    return key


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()
