"""One client request of each kind, written down as it happens (records.Request): a resumable greedy stream that
resumes on the other API with `Last-Event-ID`, a unary chat, a background response resumed with `starting_after`,
an embeddings request, and the Batch API's round trip. Every wait is bounded: the client's timeouts, a harness call's
tries, a stream's `Patience`."""
from __future__ import annotations

import asyncio
import io
import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from .records import Request
from .sse import events

TRIES = 12  # tries of one harness call (files, batches, stored responses)
BACKOFF_S = 1.0
BACKOFF_CAP_S = 5.0
# A stream reconnects for this long after it last received anything: longer than any failover seen (85 s in a
# 60-minute run, when 12 reconnections a second apart were not enough), as long as a job may wait for a worker.
RESUME_BOUND_S = 300.0
BACKGROUND_END = ("response.completed", "response.incomplete", "response.failed", "response.cancelled")


@dataclass
class Client:
    apis: tuple[str, str]
    key: str
    http: httpx.AsyncClient

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def other(self, api: str) -> str:
        return self.apis[1] if api == self.apis[0] else self.apis[0]


class Patience:
    """How long a client goes on reconnecting a stream: `RESUME_BOUND_S` since it last received anything, with
    pauses that double up to `BACKOFF_CAP_S`."""

    def __init__(self) -> None:
        self.heard()

    def heard(self) -> None:
        self.deadline, self.pause = time.monotonic() + RESUME_BOUND_S, BACKOFF_S

    async def wait(self) -> bool:
        """Pause before the next try; False once the bound would pass (the stream then counts as hung)."""
        if time.monotonic() + self.pause > self.deadline:
            return False
        await asyncio.sleep(self.pause)
        self.pause = min(self.pause * 2, BACKOFF_CAP_S)
        return True


def _error_of(response: httpx.Response) -> str:
    """`http:STATUS:CODE` of a refused request (its OpenAI error's code, or `-` without one)."""
    try:
        code = response.json()["error"].get("code") or response.json()["error"].get("type")
    except (ValueError, KeyError, TypeError, AttributeError):
        code = None
    return f"http:{response.status_code}:{code or '-'}"


def _lost(request: Request, error: Exception) -> None:
    request.transport_errors.append(f"{time.time():.3f} {type(error).__name__}")


def _chat_chunk(request: Request, chunk: dict[str, Any]) -> None:
    if "error" in chunk:
        request.terminals.append(f"error:{chunk['error'].get('code') or chunk['error'].get('type')}")
        return
    for choice in chunk.get("choices", []):
        if content := choice.get("delta", {}).get("content"):
            request.add_text(content, time.time())
        if choice.get("finish_reason"):
            request.terminals.append(f"done:{choice['finish_reason']}")


async def stream(c: Client, request: Request, body: dict[str, Any], drop_after: int | None = None) -> None:
    """A resumable stream (`X-Ovq-Resumable`); on a lost connection, or deliberately after `drop_after` events, it
    sends the same request with `Last-Event-ID` to the other API."""
    api, last, patience = request.api, None, Patience()
    while True:
        headers = {**c.headers, "X-Ovq-Resumable": "true", **({"Last-Event-ID": last} if last else {})}
        try:
            async with c.http.stream("POST", f"{api}/v3/chat/completions", json=body, headers=headers) as response:
                request.statuses.append(response.status_code)
                if response.status_code != 200:
                    await response.aread()
                    if last is None or response.status_code != 503:  # a refused resume during a failover: again
                        request.terminals.append(_error_of(response))
                        request.ended = time.time()
                        return
                else:
                    shown = None  # one worker event may come as several frames, each with its id: counted once
                    async for event in events(response):
                        if event.id and event.id != shown:
                            request.job, _, number = event.id.rpartition(":")
                            request.events.append(int(number))
                            last = shown = event.id
                            patience.heard()
                        if event.data == "[DONE]":
                            request.ended = time.time()
                            return
                        _chat_chunk(request, json.loads(event.data))
                        if drop_after is not None and len(request.events) == drop_after:
                            drop_after = None
                            break
        except httpx.TransportError as error:
            _lost(request, error)
        if last is None:  # nothing came: no id to resume from (the request died with its API)
            return
        if not await patience.wait():
            return
        request.resumes += 1
        api = c.other(api)


async def chat(c: Client, request: Request, body: dict[str, Any]) -> None:
    try:
        response = await c.http.post(f"{request.api}/v3/chat/completions", json=body, headers=c.headers)
    except httpx.TransportError as error:
        _lost(request, error)
        return
    request.statuses.append(response.status_code)
    request.ended = time.time()
    if response.status_code != 200:
        request.terminals.append(_error_of(response))
        return
    answer = response.json()
    request.job = answer["id"].removeprefix("chatcmpl-")
    request.text = answer["choices"][0]["message"]["content"] or ""
    request.first = request.ended
    request.terminals.append(f"done:{answer['choices'][0]['finish_reason']}")


def _background_event(request: Request, data: dict[str, Any]) -> None:
    request.events.append(int(data["sequence_number"]))
    kind = data.get("type", "")
    if kind == "response.created":
        request.job = data["response"]["id"]
    elif kind == "response.output_text.delta":
        request.add_text(data["delta"], time.time())
    elif kind in BACKGROUND_END:
        request.terminals.append(kind.removeprefix("response."))
    elif kind == "error":
        request.terminals.append(f"error:{data.get('code') or data.get('error', {}).get('code')}")


async def background(c: Client, request: Request, body: dict[str, Any], drop_after: int | None = None) -> None:
    """A background response streamed as it is made; on a lost connection (or deliberately after `drop_after`
    events) it streams the rest from the other API with `starting_after`."""
    api, patience = request.api, Patience()
    while True:
        after = request.events[-1] if request.events else None
        if request.job and after is not None:
            opened = c.http.stream("GET", f"{api}/v3/responses/{request.job}", headers=c.headers,
                                   params={"stream": "true", "starting_after": str(after)})
        else:
            opened = c.http.stream("POST", f"{api}/v3/responses", json=body, headers=c.headers)
        try:
            async with opened as response:
                request.statuses.append(response.status_code)
                if response.status_code != 200:
                    await response.aread()
                    if not request.job or response.status_code != 503:
                        request.terminals.append(_error_of(response))
                        request.ended = time.time()
                        return
                else:
                    async for event in events(response):
                        if event.data == "[DONE]":
                            request.ended = time.time()
                            return
                        _background_event(request, json.loads(event.data))
                        patience.heard()
                        if drop_after is not None and len(request.events) == drop_after:
                            drop_after = None
                            break
        except httpx.TransportError as error:
            _lost(request, error)
        if not request.job or not await patience.wait():
            return
        request.resumes += 1
        api = c.other(api)


async def embedding(c: Client, request: Request, model: str) -> None:
    try:
        response = await c.http.post(f"{request.api}/v3/embeddings", headers=c.headers,
                                     json={"model": model, "input": request.prompt})
    except httpx.TransportError as error:
        _lost(request, error)
        return
    request.statuses.append(response.status_code)
    request.ended = time.time()
    if response.status_code != 200:
        request.terminals.append(_error_of(response))
        return
    request.vector = response.json()["data"][0]["embedding"]
    request.first = request.ended
    request.terminals.append("done")


async def call(c: Client, method: str, path: str, statuses: list[int], **kwargs: Any) -> httpx.Response:
    """A harness call (files, batches, stored responses) on either API, again through faults (transport errors and
    503), at most TRIES times; every status is written down for the 5xx count."""
    last: Exception | None = None
    for attempt in range(TRIES):
        api = c.apis[attempt % 2]
        try:
            response = await c.http.request(method, f"{api}{path}", headers=c.headers, **kwargs)
            statuses.append(response.status_code)
            if response.status_code != 503:
                return response
        except httpx.TransportError as error:
            last = error
        await asyncio.sleep(BACKOFF_S * (attempt + 1))
    raise RuntimeError(f"{method} {path}: no answer in {TRIES} tries ({last})")


def batch_file(lines: list[tuple[str, dict[str, Any]]]) -> io.BytesIO:
    return io.BytesIO("".join(json.dumps({"custom_id": key, "method": "POST", "url": "/v1/chat/completions",
                                          "body": body}) + "\n" for key, body in lines).encode())
