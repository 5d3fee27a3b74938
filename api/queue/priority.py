"""Which priority level a request's job waits at (`common.jobs.LEVELS`: high, interactive, low, batch).

Two ways to say it: vLLM's `priority` request field (an integer, lower runs first: below 0 is `high`, 0 the default
`interactive`, above 0 `low`), and the `X-Ovq-Priority` header for clients that cannot add fields (a level's name
or such an integer; the Batch API's workers send `batch`). Given both, the lower one holds. Any client may lower
its own priority; asking for a level above `interactive` takes an API key whose `max_priority` allows it (a
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


def priority_of(request: Request) -> Priority:
    asked = []
    header = request.headers.get(PRIORITY_HEADER)
    if header is not None and header.strip():
        asked.append(_header(header))
    field = getattr(request.state, PRIORITY_FIELD, None)
    if field is not None:
        asked.append(_field(field))
    level = max(asked, key=LEVELS.index) if asked else DEFAULT  # the lowest asked for
    if LEVELS.index(level) < LEVELS.index(DEFAULT):
        key: KeyAttributes | None = getattr(request.state, KEY_STATE, None)
        if key is None or LEVELS.index(key.max_priority) > LEVELS.index(level):
            raise OvqError(f"This API key may not ask for priority `{level}` (above `{DEFAULT}`): its key file "
                           "entry's max_priority does not allow it", 403, "permission_error", param="priority",
                           code="priority_not_allowed")
    return level
