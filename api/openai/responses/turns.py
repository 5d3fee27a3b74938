"""What a response with `conversation` needs of the Conversations API (api/openai/conversations/turns.py implements
it; app.py hands it in, so that this package does not import that one, which builds on it)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from api.openai.responses.protocol import Response, ResponsesRequest
from common.owner import Caller


class Turns(Protocol):
    async def history(self, body: ResponsesRequest, caller: Caller) -> list[dict[str, Any]]:
        """The conversation's items, oldest first (`convert.to_chat`'s history); the request refused (404, 400)
        when the caller has no such conversation or the input cannot join it."""
        ...

    async def append(self, body: ResponsesRequest, response: Response, new_id: Callable[[str], str],
                     items: list[dict[str, Any]] | None = None) -> None:
        """The response's input and output items (`items`, else made with `new_id` for ids) appended to its
        conversation, when it ended so that they count."""
        ...
