"""Which priority level a request's job waits at (`common.jobs.LEVELS`: high, interactive, low, batch).

Three ways to say it: vLLM's `priority` request field (an integer, lower runs first: below 0 is `high`, 0 the
default `interactive`, above 0 `low`), OpenAI's `service_tier` (`flex` is `low`, `priority` is `high`, `auto` and
`default` say nothing), and the `X-Ovq-Priority` header for clients that cannot add fields (a level's name or such
an integer; the Batch API's workers send `batch`). Given several, the lowest holds. Any client may lower its own
priority; asking for a level above `interactive` takes an API key whose `max_priority` allows it (a
structured key file, api/http/auth.py), else the request is refused (403): a silent downgrade would hide from the
client that it is not served as it asked.
"""
from __future__ import annotations

from typing import Any

from starlette.requests import Request

from api.http.auth import KEY_STATE, KeyAttributes
from common.errors import OvqError
from common.jobs import LEVELS, PRIORITY_HEADER, Priority

DEFAULT: Priority = "interactive"
PRIORITY_FIELD = "priority_field"  # request.state's attribute: the body's `priority`, as parse_body found it
TIER_FIELD = "tier_field"  # request.state's attribute: the body's `service_tier`, as parse_body found it
LEVEL_STATE = "priority_level"  # request.state's attribute: the level priority_of found (read once a request)
SERVICE_TIERS = ("auto", "default", "flex", "priority")
TIER_LEVELS: dict[str, Priority] = {"flex": "low", "priority": "high"}
# The tier a level is served at, as a response echoes it: OpenAI has no tier below `flex` for the batch level.
LEVEL_TIERS: dict[Priority, str] = {"high": "priority", "interactive": "default", "low": "flex", "batch": "flex"}


def level_of_int(value: int) -> Priority:
    return "high" if value < 0 else DEFAULT if value == 0 else "low"


def _header(value: str) -> Priority:
    name = value.strip().lower()
    if name in LEVELS:
        return name  # type: ignore[return-value]
    try:
        return level_of_int(int(name))
    except ValueError:
        raise OvqError(f"{PRIORITY_HEADER} must be one of {', '.join(LEVELS)} or an integer (lower runs first)",
                       param=PRIORITY_HEADER) from None


def _field(value: Any) -> Priority:
    if isinstance(value, bool) or not isinstance(value, int):
        raise OvqError("`priority` must be an integer (lower runs first)", param="priority")
    return level_of_int(value)


def _tier(value: Any) -> Priority | None:
    if value not in SERVICE_TIERS:
        quoted = ", ".join(f"'{tier}'" for tier in SERVICE_TIERS)
        raise OvqError(f"Invalid value: '{value}'. Supported values are: {quoted}.", param="service_tier",
                       code="invalid_value")
    return TIER_LEVELS.get(value)


def priority_of(request: Request) -> Priority:
    """The request's level (found once: the chat path reads it to echo the tier, the queue client to queue)."""
    found: Priority | None = getattr(request.state, LEVEL_STATE, None)
    if found is not None:
        return found
    asked: list[tuple[Priority, str]] = []  # each level asked for, and the field that asked
    header = request.headers.get(PRIORITY_HEADER)
    if header is not None and header.strip():
        asked.append((_header(header), PRIORITY_HEADER))
    field = getattr(request.state, PRIORITY_FIELD, None)
    if field is not None:
        asked.append((_field(field), "priority"))
    tier = getattr(request.state, TIER_FIELD, None)
    level_of_tier = _tier(tier) if tier is not None else None
    if level_of_tier is not None:
        asked.append((level_of_tier, "service_tier"))
    level, param = max(asked, key=lambda a: LEVELS.index(a[0])) if asked else (DEFAULT, "")  # the lowest holds
    if LEVELS.index(level) < LEVELS.index(DEFAULT):
        key: KeyAttributes | None = getattr(request.state, KEY_STATE, None)
        if key is None or LEVELS.index(key.max_priority) > LEVELS.index(level):
            raise OvqError(f"This API key may not ask for priority `{level}` (above `{DEFAULT}`): its key file "
                           "entry's max_priority does not allow it", 403, "permission_error", param=param,
                           code="priority_not_allowed")
    setattr(request.state, LEVEL_STATE, level)
    return level


def service_tier(request: Request) -> str:
    """The tier the request is served at, as chat completions and responses echo it."""
    return LEVEL_TIERS[priority_of(request)]
