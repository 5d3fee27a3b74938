"""What a speech request may ask of its model, checked before any job is queued: each refusal a 4xx naming the
field."""
from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile

from api.openai.audio_protocol import SpeechRequest, TranscriptionRequest, TranslationRequest
from api.openai.speech import check_audio, check_speech, check_transcription
from common.errors import OvqError
from common.modelcard import SpeechInfo
from common.settings import Settings

WHISPER = SpeechInfo(languages=["en", "de"])
ENGLISH_ONLY = SpeechInfo()
SPEECHT5 = SpeechInfo(voices=["alice"])


def refused(call, param: str, status: int = 400) -> str:
    with pytest.raises(OvqError) as caught:
        call()
    assert caught.value.status == status and caught.value.body.param == param
    return caught.value.body.message


def transcription(**fields) -> TranscriptionRequest:
    return TranscriptionRequest.model_validate({"model": "w", **fields})


def test_a_plain_transcription_passes() -> None:
    check_transcription(transcription(language="de", stream="true"), WHISPER, "transcribe")
    check_transcription(transcription(response_format="verbose_json", timestamp_granularities=["segment"]),
                        WHISPER, "transcribe")


@pytest.mark.parametrize(("fields", "speech", "task", "param", "text"), [
    ({}, ENGLISH_ONLY, "translate", "model", "English-only"),
    ({"language": "fr"}, WHISPER, "transcribe", "language", "(en, de)"),
    ({"language": "de"}, ENGLISH_ONLY, "transcribe", "language", "(en)"),
    ({"timestamp_granularities": ["segment"]}, WHISPER, "transcribe", "timestamp_granularities", "verbose_json"),
    ({"timestamp_granularities": ["word"], "response_format": "verbose_json"}, WHISPER, "transcribe",
     "timestamp_granularities", "enable_word_timestamps"),
    ({"stream": True, "response_format": "vtt"}, WHISPER, "transcribe", "stream", "json or text"),
])
def test_transcription_refusals(fields: dict, speech: SpeechInfo, task: str, param: str, text: str) -> None:
    assert text in refused(lambda: check_transcription(transcription(**fields), speech, task), param)


def test_word_timestamps_pass_where_the_model_has_them() -> None:
    body = transcription(timestamp_granularities=["word"], response_format="verbose_json")
    check_transcription(body, SpeechInfo(languages=["en"], word_timestamps=True), "transcribe")


@pytest.mark.parametrize("fields", [{"language": "en"}, {"include": ["logprobs"]}, {"temperature": 1.5},
                                    {"chunking_strategy": "server_vad"}, {"voice": "x"}])
def test_fields_openai_does_not_allow_here_fail_validation(fields: dict) -> None:
    shape = TranslationRequest if "language" in fields else TranscriptionRequest
    with pytest.raises(ValueError):
        shape.model_validate({"model": "w", **fields})


def wav(seconds: float) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, np.zeros(int(seconds * 8000), dtype=np.float32), 8000, format="WAV")
    return buffer.getvalue()


def test_audio_limits() -> None:
    settings = Settings(max_audio_seconds=2, max_audio_bytes=60_000)
    assert check_audio(wav(1.5), settings) == pytest.approx(1.5)
    assert "OVQ_MAX_AUDIO_SECONDS" in refused(lambda: check_audio(wav(2.5), settings), "file")
    assert "OVQ_MAX_AUDIO_BYTES" in refused(lambda: check_audio(b"\0" * 60_001, settings), "file", 413)
    assert "empty" in refused(lambda: check_audio(b"", settings), "file")
    assert "WAV, FLAC, MP3 or Ogg" in refused(lambda: check_audio(b"ID3 but no mp3 frames" * 9, settings), "file")


def speech(**fields) -> SpeechRequest:
    return SpeechRequest.model_validate({"model": "t", "input": "Hi.", **fields})


@pytest.mark.parametrize(("voice", "chosen"), [(None, None), ("", None), ("default", None), ("alice", "alice")])
def test_voices(voice: str | None, chosen: str | None) -> None:
    assert check_speech(speech(voice=voice), SPEECHT5, Settings()) == chosen


@pytest.mark.parametrize(("fields", "param", "text"), [
    ({"voice": "alloy"}, "voice", "(default, alice)"),
    ({"speed": 2.0}, "speed", "not supported"),
    ({"response_format": "aac"}, "response_format", "mp3, opus, flac, wav, pcm"),
    ({"stream_format": "sse"}, "stream_format", "whole"),
    ({"instructions": "cheerfully"}, "instructions", "not supported"),
    ({"input": "x" * 11}, "input", "OVQ_MAX_SPEECH_CHARS"),
])
def test_speech_refusals(fields: dict, param: str, text: str) -> None:
    settings = Settings(max_speech_chars=10)
    assert text in refused(lambda: check_speech(speech(**fields), SPEECHT5, settings), param)


def test_speed_passes_where_the_pipeline_honours_it() -> None:
    assert check_speech(speech(speed=1.5), SpeechInfo(speed=True), Settings()) is None
