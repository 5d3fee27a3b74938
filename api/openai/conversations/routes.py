"""`/conversations` and `/conversations/{id}/items`: OpenAI's Conversations API over the conversation store.

Every route answers for the caller's own conversations only (common/owner.py): another tenant's is a 404 exactly
like a missing one. A response with `conversation` reads and extends them through `turns.ConversationTurns`.
"""
from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from api.http.auth import caller_of
from api.openai.conversations.protocol import (
    ConversationCreate,
    ConversationDeleted,
    ConversationUpdate,
    ItemList,
    ItemsCreate,
    listed,
    parse_include,
)
from api.openai.conversations.store import ConversationStore
from api.openai.responses.convert import identified
from api.openai.responses.events import new_id
from api.openai.responses.protocol import invalid_value
from api.openai.responses.serving import page_limit
from api.openai.serving import parse_body

router = APIRouter()


def _store(request: Request) -> ConversationStore:
    return request.app.state.conversations


def _json(value: Any) -> Response:
    body = value.model_dump(by_alias=True) if hasattr(value, "model_dump") else value
    return Response(orjson.dumps(body), media_type="application/json")


def _include(request: Request) -> frozenset[str]:
    query = request.query_params
    return parse_include(query.getlist("include") + query.getlist("include[]"))


@router.post("/conversations")
async def create(request: Request) -> Response:
    body = await parse_body(request, ConversationCreate)
    conversation = await _store(request).create(new_id("conv"), identified(body.items), body.metadata,
                                                caller_of(request).tenant)
    return _json(conversation)


@router.get("/conversations/{conversation_id}")
async def retrieve(request: Request, conversation_id: str) -> Response:
    return _json((await _store(request).get(conversation_id, caller_of(request))).conversation)


@router.post("/conversations/{conversation_id}")
async def update(request: Request, conversation_id: str) -> Response:
    body = await parse_body(request, ConversationUpdate)
    return _json(await _store(request).update(conversation_id, caller_of(request), body.metadata))


@router.delete("/conversations/{conversation_id}")
async def delete(request: Request, conversation_id: str) -> Response:
    await _store(request).delete(conversation_id, caller_of(request))
    return _json(ConversationDeleted(id=conversation_id))


@router.get("/conversations/{conversation_id}/items")
async def list_items(request: Request, conversation_id: str) -> Response:
    """A page of items, newest first unless `order` is `asc`; `after`: the last id of the previous page."""
    query = request.query_params
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid_value("order", order, ("asc", "desc"))
    limit, include = page_limit(query.get("limit")), _include(request)
    _, items, more = await _store(request).page(conversation_id, caller_of(request), limit, order,
                                                query.get("after"))
    return _json(ItemList.of([listed(item, include) for item in items], more))


@router.post("/conversations/{conversation_id}/items")
async def create_items(request: Request, conversation_id: str) -> Response:
    """Items appended in order (each given an id where it has none); the items as added."""
    include = _include(request)
    body = await parse_body(request, ItemsCreate)
    items = identified(body.items)
    await _store(request).add(conversation_id, caller_of(request), items)
    return _json(ItemList.of([listed(item, include) for item in items]))


@router.get("/conversations/{conversation_id}/items/{item_id}")
async def retrieve_item(request: Request, conversation_id: str, item_id: str) -> Response:
    include = _include(request)
    return _json(listed(await _store(request).item(conversation_id, caller_of(request), item_id), include))


@router.delete("/conversations/{conversation_id}/items/{item_id}")
async def delete_item(request: Request, conversation_id: str, item_id: str) -> Response:
    """OpenAI answers with the conversation the item was in."""
    return _json(await _store(request).delete_item(conversation_id, caller_of(request), item_id))
