"""A response in a conversation (`conversation` on `POST /responses`): its history is the conversation's items,
and its input and output items are appended to it once it ends `completed` or `incomplete` (as OpenAI adds them
"after this response completes"; a failed or cancelled response adds nothing, so that retrying it does not repeat
its input).

The input is checked before anything runs: against the conversation's caps (with the items it holds) and for ids
already in it. The append, at the end, is not checked against the caps: the turn ran, and is not lost.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orjson

from api.openai.conversations.store import ConversationStore, too_large
from api.openai.responses.convert import random_id, stored_items
from api.openai.responses.protocol import Response, ResponsesRequest
from common.errors import OvqError
from common.owner import Caller

log = logging.getLogger("ovq.api.conversations")
APPENDED = ("completed", "incomplete")


class ConversationTurns:
    """`responses.turns.Turns` over the conversation store."""

    def __init__(self, store: ConversationStore) -> None:
        self.store = store

    async def history(self, body: ResponsesRequest, caller: Caller) -> list[dict[str, Any]]:
        """The conversation's items, oldest first (`convert.to_chat`'s history); a 404 naming `conversation` when
        the caller has none by that id, a 400 when this turn's input would take it over its caps or repeats an id."""
        conversation_id = body.conversation_id
        assert conversation_id is not None
        store, settings = self.store, self.store.settings
        stored, items, _ = await store.page(conversation_id, caller, None, "asc", param="conversation")
        incoming = body.items()
        size = stored.size + sum(len(orjson.dumps(item.model_dump(exclude_none=True))) for item in incoming)
        if stored.count + len(incoming) > settings.conversation_max_items or size > settings.conversation_max_bytes:
            raise too_large(conversation_id, stored.count + len(incoming), size, settings, "conversation")
        known = {item.get("id") for item in items}
        for i, item in enumerate(incoming):
            if item.id is not None and item.id in known:
                raise OvqError(f"Item with id '{item.id}' is already in conversation '{conversation_id}': send only "
                               "the new items (the conversation supplies the others).", param=f"input[{i}].id",
                               code="duplicate_item_id")
        return items

    async def append(self, body: ResponsesRequest, response: Response, new_id: Callable[[str], str] = random_id,
                     items: list[dict[str, Any]] | None = None) -> None:
        """The response's input and output items appended to its conversation, when it ended so that they count.
        `items`: those already made for the stored response (the same ids in both); `new_id` names input items that
        came without an id (a background response's are counted from its id: a second append is the first)."""
        conversation_id = body.conversation_id
        if conversation_id is None or response.status not in APPENDED:
            return
        if not await self.store.append_turn(conversation_id,
                                            items if items is not None else stored_items(body, response, new_id)):
            log.warning("response %s ended after its conversation %s was deleted (or expired): its turn is not "
                        "added", response.id, conversation_id)
