"""The wire shapes of /audio/transcriptions, /audio/translations and /audio/speech, as OpenAI's API reference has
them; anything else is a 400."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

TranscriptFormat = Literal["json", "text", "srt", "verbose_json", "vtt"]


class TranscriptionRequest(BaseModel):
    """The form fields besides the file (multipart values arrive as strings; pydantic reads "true", "0.2")."""

    model_config = ConfigDict(extra="forbid")

    model: str
    language: str | None = None
    prompt: str | None = None
    response_format: TranscriptFormat = "json"
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    timestamp_granularities: list[Literal["word", "segment"]] = Field(default_factory=list)
    stream: bool = False
    # OpenAI's fields for other models: accepted only at the value Whisper's behaviour already has.
    chunking_strategy: Literal["auto"] | None = None
    include: list[str] = Field(default_factory=list, max_length=0)


class TranslationRequest(TranscriptionRequest):
    language: None = None  # a translation's language is English: OpenAI's request has no such field


class Usage(BaseModel):
    type: Literal["duration"] = "duration"
    seconds: float


class TranscriptionSegment(BaseModel):
    """Whisper's segment: what the pipeline reports (its decoding statistics per segment are not available)."""

    id: int
    seek: int
    start: float
    end: float
    text: str
    temperature: float
    tokens: list[int] = Field(default_factory=list)


class TranscriptionWord(BaseModel):
    word: str
    start: float
    end: float


class Transcription(BaseModel):
    text: str
    usage: Usage


class TranscriptionVerbose(BaseModel):
    task: Literal["transcribe", "translate"]
    language: str
    duration: float
    text: str
    segments: list[TranscriptionSegment] | None = None
    words: list[TranscriptionWord] | None = None
    usage: Usage


class TextDelta(BaseModel):
    type: Literal["transcript.text.delta"] = "transcript.text.delta"
    delta: str


class TextDone(BaseModel):
    type: Literal["transcript.text.done"] = "transcript.text.done"
    text: str
    usage: Usage


class SpeechRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    input: str = Field(min_length=1)
    # A voice named in the model's `voices`; omitted or "default": the model's own (SpeechT5's built-in speaker).
    voice: str | None = None
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    instructions: str | None = None
    stream_format: Literal["audio", "sse"] | None = None
