"""How an answer looks on the wire: chat or text completion, whole or as stream chunks, any number of choices."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from api.choices import ChoiceState
from api.parsers import ParsedDelta, ToolCall
from api.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChoiceLogprobs,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    DeltaFunction,
    DeltaMessage,
    DeltaToolCall,
    FunctionCall,
    TokenLogprobInfo,
    ToolCallOut,
    TopLogprob,
    UsageInfo,
)
from common.events import Delta, TokenLogprob


def _chat_logprobs(entries: list[TokenLogprob], top: int) -> ChoiceLogprobs:
    content = []
    for entry in entries:
        if entry.logprob is None:
            continue
        alternative = TopLogprob(token=entry.token, logprob=entry.logprob, bytes=entry.bytes)
        content.append(TokenLogprobInfo(token=entry.token, logprob=entry.logprob, bytes=entry.bytes,
                                        top_logprobs=[alternative] if top >= 1 else []))
    return ChoiceLogprobs(content=content)


def _completion_logprobs(entries: list[TokenLogprob], top: int, choice: ChoiceState) -> CompletionLogprobs:
    out = CompletionLogprobs(top_logprobs=[] if top >= 1 else None)
    for entry in entries:
        out.tokens.append(entry.token)
        out.token_logprobs.append(entry.logprob)
        out.text_offset.append(choice.offset)
        choice.offset += len(entry.token)
        if out.top_logprobs is not None:
            out.top_logprobs.append(None if entry.logprob is None else {entry.token: entry.logprob})
    return out


def _tool_calls(calls: list[ToolCall]) -> list[ToolCallOut] | None:
    if not calls:
        return None
    return [ToolCallOut(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments)) for c in calls]


def _delta_message(parsed: ParsedDelta) -> DeltaMessage:
    calls = [DeltaToolCall(index=c.index, id=c.id, type="function" if c.id else None,
                           function=DeltaFunction(name=c.name, arguments=c.arguments))
             for c in parsed.tool_calls]
    return DeltaMessage(content=parsed.content or None, reasoning_content=parsed.reasoning or None,
                        tool_calls=calls or None)


@dataclass
class ChatFormat:
    id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))

    def whole(self, choices: list[ChoiceState], usage: UsageInfo) -> ChatCompletion:
        out = []
        for choice in choices:
            parsed = choice.parsed()
            message = AssistantMessage(content=parsed.content, reasoning_content=parsed.reasoning,
                                       tool_calls=_tool_calls(parsed.tool_calls))
            logprobs = _chat_logprobs(choice.logprobs, choice.top) if choice.top is not None else None
            out.append(ChatChoice(index=choice.index, message=message, logprobs=logprobs,
                                  finish_reason=choice.finish_reason(bool(parsed.tool_calls))))
        return ChatCompletion(id=self.id, created=self.created, model=self.model, choices=out, usage=usage)

    def first(self, choices: list[ChoiceState]) -> list[ChatCompletionChunk]:
        """The role chunk of every choice, as OpenAI opens a chat stream."""
        return [self._chunk(ChatChunkChoice(index=c.index, delta=DeltaMessage(role="assistant", content="")))
                for c in choices]

    def chunk(self, choice: ChoiceState, delta: Delta) -> ChatCompletionChunk | None:
        parsed = choice.feed(delta)
        logprobs = None
        if choice.top is not None and delta.logprobs:
            logprobs = _chat_logprobs(delta.logprobs, choice.top)
        if not parsed and logprobs is None and delta.finish_reason is None:
            return None
        finish = choice.finish_reason(choice.called) if delta.finish_reason else None
        return self._chunk(ChatChunkChoice(index=choice.index, delta=_delta_message(parsed), logprobs=logprobs,
                                           finish_reason=finish))

    def usage_chunk(self, usage: UsageInfo) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=[], usage=usage)

    def _chunk(self, choice: ChatChunkChoice) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=[choice])


@dataclass
class CompletionFormat:
    id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))

    def whole(self, choices: list[ChoiceState], usage: UsageInfo) -> Completion:
        out = []
        for choice in choices:
            logprobs = None
            if choice.top is not None:
                logprobs = _completion_logprobs(choice.logprobs, choice.top, choice)
            out.append(CompletionChoice(index=choice.index, text="".join(choice.text), logprobs=logprobs,
                                        finish_reason=choice.finish))
        return Completion(id=self.id, created=self.created, model=self.model, choices=out, usage=usage)

    def first(self, choices: list[ChoiceState]) -> list[Completion]:
        return []  # a text completion stream has no role chunk

    def chunk(self, choice: ChoiceState, delta: Delta) -> Completion | None:
        logprobs = None
        if choice.top is not None and delta.logprobs:
            logprobs = _completion_logprobs(delta.logprobs, choice.top, choice)
        if not delta.text and logprobs is None and delta.finish_reason is None:
            return None
        item = CompletionChoice(index=choice.index, text=delta.text, logprobs=logprobs,
                                finish_reason=delta.finish_reason)
        return Completion(id=self.id, created=self.created, model=self.model, choices=[item])

    def usage_chunk(self, usage: UsageInfo) -> Completion:
        return Completion(id=self.id, created=self.created, model=self.model, choices=[], usage=usage)


Format = ChatFormat | CompletionFormat
