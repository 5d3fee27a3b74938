"""How one generation looks on the wire: chat or text completion, whole or as stream chunks."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from api.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    CompletionChoice,
    DeltaMessage,
    UsageInfo,
)


@dataclass
class ChatFormat:
    id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))

    def whole(self, text: str, finish_reason: str, usage: UsageInfo) -> ChatCompletion:
        choice = ChatChoice(message=AssistantMessage(content=text), finish_reason=finish_reason)
        return ChatCompletion(id=self.id, created=self.created, model=self.model, choices=[choice], usage=usage)

    def chunk(self, text: str | None, finish_reason: str | None = None, first: bool = False) -> ChatCompletionChunk:
        delta = DeltaMessage(role="assistant" if first else None, content=text)
        choice = ChatChunkChoice(delta=delta, finish_reason=finish_reason)
        return ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=[choice])

    def usage_chunk(self, usage: UsageInfo) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=[], usage=usage)


@dataclass
class CompletionFormat:
    id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))

    def whole(self, text: str, finish_reason: str, usage: UsageInfo) -> Completion:
        choice = CompletionChoice(text=text, finish_reason=finish_reason)
        return Completion(id=self.id, created=self.created, model=self.model, choices=[choice], usage=usage)

    def chunk(self, text: str | None, finish_reason: str | None = None, first: bool = False) -> Completion | None:
        if first:  # a text completion stream has no role chunk
            return None
        choice = CompletionChoice(text=text or "", finish_reason=finish_reason)
        return Completion(id=self.id, created=self.created, model=self.model, choices=[choice])

    def usage_chunk(self, usage: UsageInfo) -> Completion:
        return Completion(id=self.id, created=self.created, model=self.model, choices=[], usage=usage)


Format = ChatFormat | CompletionFormat
