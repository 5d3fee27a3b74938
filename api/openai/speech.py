"""/audio/transcriptions, /audio/translations and /audio/speech: requests checked here, the work done by a speech
worker (workers/audio).

An upload is checked from its header (libsndfile reads it; its size and duration within the settings) and goes to
Redis as a short-lived blob the job names; the worker decodes it. Speech comes back the same way (the Done event
names the key; this process reads it once and deletes it).
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from pydantic import ValidationError
from starlette.datastructures import UploadFile
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from api.http.sse import DONE as END
from api.http.sse import Last, frame
from api.http.status import CLIENT_CLOSED
from api.openai.audio_protocol import SpeechRequest, TextDelta, TextDone, TranscriptionRequest, TranslationRequest
from api.openai.limits import require_media_type
from api.openai.protocol import StreamError
from api.openai.serving import parse_body, stream_response, validation_error
from api.openai.transcripts import render, usage
from api.ops.metrics import Record
from api.queue.client import ClientGone, Generation, JobClient, deadline, error_of, request_id
from api.queue.registry import Registry, Servable
from common.audio import SPEECH_FORMATS, AudioError, probe
from common.errors import OvqError, exc_text, internal
from common.events import CANCELLED, DELTA, DONE, ERROR, DoneEvent
from common.jobs import Job, SpeechParams
from common.modelcard import SpeechInfo
from common.servable import ServableType
from common.settings import Settings

STREAMABLE = ("json", "text")  # OpenAI streams plain transcripts only
DEFAULT_VOICE = "default"


def check_transcription(body: TranscriptionRequest, speech: SpeechInfo, task: str) -> None:
    """What the model and the format allow; a 400 naming the field otherwise."""
    if task == "translate" and not speech.languages:
        raise OvqError("this model is English-only: it cannot translate", param="model")
    if body.language is not None and body.language not in (speech.languages or ["en"]):
        known = ", ".join(speech.languages or ["en"])
        raise OvqError(f"language {body.language!r} is not one this model knows ({known})", param="language")
    if body.timestamp_granularities and body.response_format != "verbose_json":
        raise OvqError("timestamp_granularities needs response_format verbose_json",
                       param="timestamp_granularities")
    if "word" in body.timestamp_granularities and not speech.word_timestamps:
        raise OvqError("word timestamps are off for this model (enable_word_timestamps)",
                       param="timestamp_granularities")
    if body.stream and body.response_format not in STREAMABLE:
        raise OvqError(f"stream needs response_format json or text, not {body.response_format}", param="stream")


def check_audio(data: bytes, settings: Settings) -> float:
    """The upload's duration (s), if libsndfile reads it and it is within the limits."""
    if len(data) > settings.max_audio_bytes:
        raise OvqError(f"file is larger than {settings.max_audio_bytes} bytes (OVQ_MAX_AUDIO_BYTES)", 413,
                       param="file", code="file_too_large")
    if not data:
        raise OvqError("file is empty", param="file")
    try:
        info = probe(data)
    except AudioError as exc:
        raise OvqError(f"file: {exc}; send WAV, FLAC, MP3 or Ogg", param="file",
                       code="invalid_audio") from None
    if info.seconds > settings.max_audio_seconds:
        raise OvqError(f"the audio lasts {info.seconds:.1f} s, over the limit of {settings.max_audio_seconds:g} s "
                       "(OVQ_MAX_AUDIO_SECONDS)", param="file", code="audio_too_long")
    return info.seconds


def check_speech(body: SpeechRequest, speech: SpeechInfo, settings: Settings) -> str | None:
    """The voice to speak with (None: the model's own), if the model can answer the request as asked."""
    if len(body.input) > settings.max_speech_chars:
        raise OvqError(f"input has {len(body.input)} characters, over the limit of {settings.max_speech_chars} "
                       "(OVQ_MAX_SPEECH_CHARS)", param="input")
    if body.response_format not in SPEECH_FORMATS:
        raise OvqError(f"response_format {body.response_format} is not available; use one of "
                       f"{', '.join(SPEECH_FORMATS)}", param="response_format")
    if body.stream_format not in (None, "audio"):
        raise OvqError("stream_format sse is not supported: the audio comes whole", param="stream_format")
    if body.instructions:
        raise OvqError("instructions are not supported by this model", param="instructions")
    if body.speed != 1.0 and not speech.speed:
        raise OvqError("speed is not supported by this model (only 1.0)", param="speed")
    if body.voice in speech.voices:
        return body.voice
    if body.voice in (None, "", DEFAULT_VOICE):
        return None
    known = ", ".join([DEFAULT_VOICE, *speech.voices])
    raise OvqError(f"voice {body.voice!r} is not one of this model's voices ({known})", param="voice")


class SpeechServing:
    def __init__(self, jobs: JobClient, registry: Registry, settings: Settings) -> None:
        self.jobs, self.registry, self.settings = jobs, registry, settings

    async def _servable(self, model: str, kind: ServableType, does: str) -> tuple[Servable, SpeechInfo]:
        servable = await self.registry.servable(model)
        speech = servable.card.speech
        if servable.card.servable_type is not kind or speech is None:
            raise OvqError(f"The model `{model}` does not {does}", param="model")
        return servable, speech

    # ---- speech to text --------------------------------------------------------------------------------
    async def transcriptions(self, request: Request) -> Response:
        return await self._transcribe(request, "transcribe", TranscriptionRequest)

    async def translations(self, request: Request) -> Response:
        return await self._transcribe(request, "translate", TranslationRequest)

    async def _transcribe(self, request: Request, task: str, shape: type[TranscriptionRequest]) -> Response:
        fields, upload = await self._form(request)
        try:
            body = shape.model_validate(fields)
        except ValidationError as exc:
            raise validation_error(exc) from exc
        servable, speech = await self._servable(body.model, ServableType.S2T, "transcribe audio")
        check_transcription(body, speech, task)
        data = await upload.read(self.settings.max_audio_bytes + 1)
        check_audio(data, self.settings)
        words = "word" in body.timestamp_granularities
        params = SpeechParams(task=task, language=body.language, prompt=body.prompt, temperature=body.temperature,
                              timestamps=body.response_format in ("srt", "vtt", "verbose_json"), words=words,
                              stream=body.stream)
        job = Job(id=request_id(request), model=body.model, device="", kind="transcription", prompt="",
                  speech=params, reply_to=self.jobs.hub.reply_to)
        params.audio_key = self.jobs.keys.blob(job.id, "audio", job.model)
        await self.jobs.redis.set(params.audio_key, data, ex=self.settings.blob_ttl_s)
        record: Record = request.state.record
        record.model = body.model
        ends = deadline(request, self.settings.request_timeout_s)
        async with self.jobs.open(request, [job], servable, ends) as generation:
            headers = {"X-Request-Id": record.request_id}
            if body.stream:
                return stream_response(generation, self._stream(generation, record), record, self.jobs.metrics,
                                       headers)
            done = await self._done(generation, record)
            transcript = done.get("transcript")
            if transcript is None:
                raise internal("the worker sent no transcript")
            return render(transcript, body.response_format, task, body.temperature or 0.0, words, headers)

    async def _form(self, request: Request) -> tuple[dict[str, Any], UploadFile]:
        require_media_type(request.headers.get("content-type"), "multipart/form-data", request.url.path)
        try:
            form = await request.form(max_files=1, max_part_size=64 * 1024)
        except (ClientDisconnect, OvqError):  # the client left, or the body guard refused the body
            raise
        except Exception as exc:  # malformed multipart, or a field over the size limit
            raise OvqError(f"could not read the form: {exc_text(exc)}") from exc
        upload = form.get("file")
        if upload is None:
            raise OvqError("file is required", param="file")
        if not isinstance(upload, UploadFile):
            raise OvqError("file must be a file", param="file")
        fields: dict[str, Any] = {}
        for key, value in form.multi_items():
            if key == "file":
                continue
            if not isinstance(value, str):
                raise OvqError(f"{key} must be a plain form field", param=key)
            name = key.removesuffix("[]")
            if name in ("timestamp_granularities", "include"):  # OpenAI sends lists as repeated `name[]` fields
                fields.setdefault(name, []).append(value)
            else:
                fields[name] = value
        return fields, upload

    async def _done(self, generation: Generation, record: Record) -> DoneEvent:
        while not generation.finished:
            for event in await generation.events():
                if event["type"] == DONE:
                    record.done(event)
                    return event
                if event["type"] == ERROR:
                    raise error_of(event, "invalid_request_error")
                if event["type"] == CANCELLED:
                    raise ClientGone()
        raise ClientGone()

    async def _stream(self, generation: Generation, record: Record) -> AsyncIterator[bytes]:
        """OpenAI's transcript events: a delta per piece of decoded text, then the whole text."""
        try:
            while not generation.finished:
                for event in await generation.events():
                    if event["type"] == DELTA:
                        yield frame(TextDelta(delta=event["text"]).model_dump_json().encode())
                    elif event["type"] == DONE:
                        record.done(event)
                        transcript = event.get("transcript")
                        if transcript is None:
                            raise internal("the worker sent no transcript")
                        done = TextDone(text=transcript["text"], usage=usage(transcript))
                        yield Last(frame(done.model_dump_json().encode()) + END)
                    elif event["type"] == ERROR:
                        record.failed(event["status"], event["error"].get("code"))
                        error = StreamError(error=event["error"]).model_dump_json().encode()
                        yield Last(frame(error) + END)
        except OvqError as exc:
            record.failed(exc.status, exc.body.code)
            yield Last(frame(StreamError(error=exc.body).model_dump_json().encode()) + END)
        except ClientGone:
            record.failed(CLIENT_CLOSED)

    # ---- text to speech --------------------------------------------------------------------------------
    async def speech(self, request: Request) -> Response:
        body = await parse_body(request, SpeechRequest)
        servable, speech = await self._servable(body.model, ServableType.T2S, "generate speech")
        voice = check_speech(body, speech, self.settings)
        params = SpeechParams(task="speak", voice=voice, response_format=body.response_format,
                              speed=body.speed if speech.speed else None)
        job = Job(id=request_id(request), model=body.model, device="", kind="speech", prompt=body.input,
                  speech=params, reply_to=self.jobs.hub.reply_to)
        record: Record = request.state.record
        record.model = body.model
        ends = deadline(request, self.settings.request_timeout_s)
        async with self.jobs.open(request, [job], servable, ends) as generation:
            done = await self._done(generation, record)
            key = done.get("audio")
            if key is None:
                raise internal("the worker sent no audio")
            pipe = self.jobs.redis.pipeline(transaction=False)
            pipe.get(key)
            pipe.delete(key)
            data, _ = await pipe.execute()
            if data is None:
                raise internal("the generated speech expired before it could be read")
            return Response(data, media_type=SPEECH_FORMATS[body.response_format][2],
                            headers={"X-Request-Id": record.request_id})
