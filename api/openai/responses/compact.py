"""`POST /responses/compact`: a conversation made short by the model's own summary, as OpenAI's is.

OpenAI's answer (`response.compaction`) is the conversation's user messages, as they were, then one `compaction`
item that stands for everything else (assistant messages, tool calls and their outputs); a client sends that
output back as the next request's input instead of the whole conversation. OpenAI's item holds a summary its
model wrote, encrypted. ovq's holds the same, as text: the model is asked, after the conversation, for a summary of
it (INSTRUCTION), through the queue like any response (a job, a worker, the tenant's share and quota).

Why the model's summary and not a rule: the rule, dropping the oldest turns, is what `truncation: auto` already
does (truncation.py), and it forgets what those turns said; a summary keeps what the model takes to matter in a few
hundred tokens, and it is what OpenAI's clients (the Agents SDK's compaction sessions) expect the item to carry.

The conversation is the `previous_response_id` chain's, as a response continuing it reads it (its window:
chain.py), then `input`. The summary's prompt is fitted as `truncation: auto` fits any: of a conversation longer
than the context, the newest turns that fit are summarized. The summary is greedy (the model's likeliest account,
the same for the same conversation) and takes at most SUMMARY_TOKENS (a quarter of the context on a smaller
model). Nothing is stored: the answer is the client's.
"""
from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from api.http.auth import caller_of
from api.openai.responses.events import new_id
from api.openai.responses.protocol import Message, ResponsesRequest, missing
from api.openai.responses.serving import ResponsesServing, renamed
from api.openai.serving import parse_body
from common.errors import OvqError

INSTRUCTION = ("Summarize our conversation so far for your own later use, in place of it: every fact, name, number "
               "and decision the user gave or you answered, what was asked and what is left to do. Write only the "
               "summary.")
SUMMARY_TOKENS = 512


async def compact(responses: ResponsesServing, request: Request) -> JSONResponse:
    """The compacted conversation of a request (`model`, `input`, `instructions`, `previous_response_id`)."""
    body = await parse_body(request, ResponsesRequest)
    own = [item.model_dump(by_alias=True, exclude_none=True) for item in body.items()]
    if not own and not body.previous_response_id:
        raise missing("input")
    context = await responses.context(body.model)
    summary = body.model_copy(update={
        "input": [*body.items(), Message(role="user", content=INSTRUCTION)], "truncation": "auto", "store": False,
        "stream": False, "background": False, "tools": [], "tool_choice": "none", "temperature": 0.0,
        "max_output_tokens": min(SUMMARY_TOKENS, context // 4)})
    try:
        history, chat, _ = await responses.history(summary, caller_of(request))
        response = await responses.generate(request, summary, chat)
    except OvqError as exc:
        raise renamed(exc) from None
    users = [_user(item) for item in history.items + own if _is_user(item)]
    item = {"id": new_id("cmp"), "type": "compaction", "encrypted_content": response.output_text,
            "created_by": body.model}
    usage = response.usage.model_dump() if response.usage is not None else None
    return JSONResponse({"id": new_id("resp"), "object": "response.compaction", "created_at": int(time.time()),
                         "output": [*users, item], "usage": usage})


def _is_user(item: dict[str, Any]) -> bool:
    return item.get("type", "message") == "message" and item.get("role") == "user"


def _user(item: dict[str, Any]) -> dict[str, Any]:
    """A user message as an output item: an id, a status and a list of parts."""
    content = item.get("content")
    parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else content
    return {"type": "message", "role": "user", "id": item.get("id") or new_id("msg"), "status": "completed",
            "content": parts}
