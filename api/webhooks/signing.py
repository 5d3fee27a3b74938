"""Standard Webhooks' headers: `webhook-id` (the event's id, the same on every retry, for receivers to deduplicate
by), `webhook-timestamp` (this attempt's, unix s: receivers refuse old ones, 5 minutes in OpenAI's SDK) and
`webhook-signature`: `v1,` and the base64 HMAC-SHA256 of `{id}.{timestamp}.{body}` under the endpoint's key."""
from __future__ import annotations

import base64
import hashlib
import hmac


def signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def headers(key: bytes, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": signature(key, msg_id, timestamp, body), "content-type": "application/json",
            "user-agent": "ovq-webhooks"}
