"""OpenAI Conversations wire formats: the requests `/conversations` takes and the objects it answers with.

Shapes follow OpenAI's API reference and the `openai` SDK's `openai.types.conversations` (tests read every object
with the SDK's own types). A conversation's items are Responses input items, checked by the Responses API's own
`parse_item` (the same 400s); they are listed as OpenAI lists them: with an id and a status, a message's text as
parts (`listed`).
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from api.openai.responses.protocol import INCLUDABLE, LOGPROBS, Item, check_metadata, invalid_value, parse_item
from common.errors import OvqError

MAX_NEW_ITEMS = 20  # OpenAI's: "You may add up to 20 items at a time"


def parse_items(value: Any, required: bool) -> list[Item]:
    """`items` as OpenAI takes it: an array of Responses input items, at most 20 (none: `[]`, unless required)."""
    if value is None:
        if required:
            raise OvqError("Missing required parameter: 'items'.", param="items", code="missing_required_parameter")
        return []
    if not isinstance(value, list):
        raise OvqError("Invalid type for 'items': expected an array of input items.", param="items",
                       code="invalid_type")
    if len(value) > MAX_NEW_ITEMS:
        raise OvqError(f"Invalid 'items': array too long. Expected an array with maximum length {MAX_NEW_ITEMS}, "
                       f"but got an array with length {len(value)} instead.", param="items",
                       code="array_above_max_length")
    if required and not value:
        raise OvqError("Invalid 'items': empty array. Expected an array with minimum length 1, but got an empty "
                       "array instead.", param="items", code="empty_array")
    return [parse_item(item, f"items[{i}]") for i, item in enumerate(value)]


class ConversationCreate(BaseModel):
    """`POST /conversations`."""

    model_config = ConfigDict(extra="allow")

    items: list[Item] = []
    metadata: dict[str, str] | None = None

    @field_validator("items", mode="before")
    @classmethod
    def _items(cls, value: Any) -> list[Item]:
        return parse_items(value, required=False)

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return check_metadata(value)


class ConversationUpdate(BaseModel):
    """`POST /conversations/{id}`: its metadata, replaced whole (required, as in the SDK; null empties it)."""

    model_config = ConfigDict(extra="allow")

    metadata: dict[str, str] | None

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return check_metadata(value)


class ItemsCreate(BaseModel):
    """`POST /conversations/{id}/items`: items appended in order, 1 to 20 of them."""

    model_config = ConfigDict(extra="allow")

    items: list[Item] = Field(None, validate_default=True)  # missing: OpenAI's "Missing required parameter"

    @field_validator("items", mode="before")
    @classmethod
    def _items(cls, value: Any) -> list[Item]:
        return parse_items(value, required=True)


class Conversation(BaseModel):
    id: str
    object: Literal["conversation"] = "conversation"
    created_at: int
    metadata: dict[str, str] = {}


class ConversationDeleted(BaseModel):
    id: str
    object: Literal["conversation.deleted"] = "conversation.deleted"
    deleted: bool = True


class ItemList(BaseModel):
    """A page of items (`first_id`, `last_id`: null when the page is empty), or the items `items.create` added."""

    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool

    @classmethod
    def of(cls, items: list[dict[str, Any]], has_more: bool = False) -> ItemList:
        return cls(data=items, first_id=items[0]["id"] if items else None,
                   last_id=items[-1]["id"] if items else None, has_more=has_more)


def parse_include(values: list[str]) -> frozenset[str]:
    """The `include` query parameter (repeated, or `include[]`), checked as the Responses API checks its own."""
    for i, name in enumerate(values):
        if name not in INCLUDABLE:
            raise invalid_value(f"include[{i}]", name, INCLUDABLE)
    return frozenset(values)


def listed(item: dict[str, Any], include: frozenset[str]) -> dict[str, Any]:
    """A stored item as OpenAI lists it: a message's text as one part (the SDK's item types take no string);
    log-probabilities only when `include` names them (they are stored whole). Input images' URLs are always listed:
    ovq has no file ids to list them by, and a client that sends the items back (the Agents SDK's session) needs
    them."""
    if item.get("type", "message") != "message":
        return item
    content = item.get("content")
    assistant = item.get("role") == "assistant"
    if isinstance(content, str):
        part = {"type": "output_text", "text": content, "annotations": [], "logprobs": []} if assistant else \
            {"type": "input_text", "text": content}
        return {**item, "type": "message", "content": [part]}
    return {**item, "type": "message", "content": [_part(p, include) for p in content or []]}


def _part(part: dict[str, Any], include: frozenset[str]) -> dict[str, Any]:
    kind = part.get("type")
    if kind == "output_text" and part.get("logprobs") and LOGPROBS not in include:
        return {**part, "logprobs": []}
    return part
