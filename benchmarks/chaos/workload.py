"""The mixed workload, in rounds until the run's end: first a greedy stream alone on the fleet (its text has a sound
reference: the same body answered alone, in calm, before the run), then a mixed burst of every kind at once
(resumable streams, unary chats, background responses, embeddings, a Batch API batch), some of the streams and
background responses dropping their connection on purpose to resume on the other API."""
from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from benchmarks.prompts import QUESTIONS

from . import client
from .client import Client
from .fleet import EMBED, LLM
from .records import BACKGROUND, BATCH, CHAT, EMBEDDING, STREAM, Request

SOLO_PROMPTS = QUESTIONS[:6]  # the prompts of the streams that run alone: each has a reference answer
BATCH_BOUND_S = 900.0  # a batch that has not ended by then is left: its lines count as lost
ROUND_BOUND_S = 1200.0  # a round's requests that have not ended by then count as hung


@dataclass(frozen=True)
class Mix:
    max_tokens: int = 48
    streams: int = 3
    chats: int = 3
    backgrounds: int = 2
    embeddings: int = 3
    batch_lines: int = 4


def chat_body(prompt: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    return {"model": LLM, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": stream}


def background_body(prompt: str, max_tokens: int) -> dict[str, Any]:
    return {"model": LLM, "input": prompt, "max_output_tokens": max(16, max_tokens), "temperature": 0,
            "background": True, "store": True, "stream": True}


async def references(c: Client, mix: Mix) -> tuple[dict[str, str], dict[str, list[float]]]:
    """Each solo prompt's greedy answer alone, in calm, one after another; each text's embedding."""
    texts: dict[str, str] = {}
    for prompt in SOLO_PROMPTS:
        request = Request(CHAT, f"ref-{len(texts)}", time.time(), c.apis[0], prompt)
        await client.chat(c, request, chat_body(prompt, mix.max_tokens, False))
        if not request.terminals or not request.terminals[0].startswith("done"):
            raise RuntimeError(f"the reference answer failed: {request}")
        texts[prompt] = request.text
    vectors: dict[str, list[float]] = {}
    for prompt in QUESTIONS:
        request = Request(EMBEDDING, f"ref-e{len(vectors)}", time.time(), c.apis[0], prompt)
        await client.embedding(c, request, EMBED)
        if request.vector is None:
            raise RuntimeError(f"the reference embedding failed: {request}")
        vectors[prompt] = request.vector
    return texts, vectors


class Workload:
    def __init__(self, c: Client, mix: Mix, refs: dict[str, str]) -> None:
        self.c, self.mix, self.refs = c, mix, refs
        self.requests: list[Request] = []
        self.harness_statuses: list[int] = []  # files, batches, stored responses: for the 5xx count
        self.prompts = itertools.cycle(QUESTIONS)
        self.solo_prompts = itertools.cycle(SOLO_PROMPTS)
        self.apis = itertools.cycle(c.apis)
        self.count = 0

    def _new(self, kind: str) -> Request:
        self.count += 1
        request = Request(kind, f"{kind.split()[0]}-{self.count}", time.time(), next(self.apis), next(self.prompts))
        self.requests.append(request)
        return request

    async def run(self, until: float, every_kind: asyncio.Event) -> None:
        """Rounds until `until`, and on until every kind of fault was injected once."""
        def going() -> bool:
            return time.time() < until or not every_kind.is_set()
        while going():
            await self._bounded(self._solo())
            if going():
                await self._bounded(self._mixed())

    async def _bounded(self, work: Any) -> None:
        try:
            await asyncio.wait_for(work, ROUND_BOUND_S)
        except TimeoutError:
            pass  # what did not end is hung: the checker counts it

    async def _solo(self) -> None:
        request = self._new(STREAM)
        request.prompt = next(self.solo_prompts)
        request.reference = self.refs.get(request.prompt)
        await client.stream(self.c, request, chat_body(request.prompt, self.mix.max_tokens, True),
                            drop_after=8 if self.count % 2 else None)

    async def _mixed(self) -> None:
        m = self.mix
        work = [client.stream(self.c, r, chat_body(r.prompt, m.max_tokens, True), 6 if i == 0 else None)
                for i, r in enumerate(self._new(STREAM) for _ in range(m.streams))]
        work += [client.chat(self.c, r, chat_body(r.prompt, m.max_tokens, False))
                 for r in (self._new(CHAT) for _ in range(m.chats))]
        work += [client.background(self.c, r, background_body(r.prompt, m.max_tokens), 10 if i == 0 else None)
                 for i, r in enumerate(self._new(BACKGROUND) for _ in range(m.backgrounds))]
        work += [client.embedding(self.c, r, EMBED) for r in (self._new(EMBEDDING) for _ in range(m.embeddings))]
        if m.batch_lines:
            work.append(self._batch([self._new(BATCH) for _ in range(m.batch_lines)]))
        await asyncio.gather(*work, return_exceptions=True)

    def progress(self) -> str:
        done = Counter(r.kind for r in self.requests if r.ended is not None)
        sent = Counter(r.kind for r in self.requests)
        return ", ".join(f"{kind} {done[kind]}/{sent[kind]}" for kind in sent)

    async def _batch(self, lines: list[Request]) -> None:
        """Upload, create, wait for the end (bounded), read the output and error files; delete the files."""
        c, statuses = self.c, self.harness_statuses
        body = client.batch_file([(r.key, chat_body(r.prompt, self.mix.max_tokens, False)) for r in lines])
        uploaded = await client.call(c, "POST", "/v1/files", statuses, data={"purpose": "batch"},
                                     files={"file": ("chaos.jsonl", body)})
        made = await client.call(c, "POST", "/v1/batches", statuses, json={
            "input_file_id": uploaded.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"})
        state, deadline = made.json(), time.time() + BATCH_BOUND_S
        while state.get("status") not in ("completed", "failed", "expired", "cancelled") and time.time() < deadline:
            await asyncio.sleep(1.0)
            state = (await client.call(c, "GET", f"/v1/batches/{made.json()['id']}", statuses)).json()
        for name in ("output_file_id", "error_file_id"):
            if state.get(name):
                content = await client.call(c, "GET", f"/v1/files/{state[name]}/content", statuses)
                self._answers(lines, content.text)
        for file_id in {uploaded.json()["id"], state.get("output_file_id"), state.get("error_file_id")} - {None}:
            await client.call(c, "DELETE", f"/v1/files/{file_id}", statuses)

    @staticmethod
    def _answers(lines: list[Request], content: str) -> None:
        by_key = {r.key: r for r in lines}
        for line in filter(None, content.splitlines()):
            answer = json.loads(line)
            request = by_key.get(answer["custom_id"])
            if request is None:
                continue
            request.ended = time.time()
            response = answer.get("response") or {}
            if response.get("status_code") == 200:
                body = response["body"]
                request.job = body["id"].removeprefix("chatcmpl-")
                request.text = body["choices"][0]["message"]["content"] or ""
                request.terminals.append(f"done:{body['choices'][0]['finish_reason']}")
            else:
                error = (response.get("body") or {}).get("error") or answer.get("error") or {}
                request.terminals.append(f"error:{response.get('status_code')}:{error.get('code')}")
