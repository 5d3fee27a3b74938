"""A transcript in each of OpenAI's `response_format`s: json, text, srt, vtt, verbose_json."""
from __future__ import annotations

from starlette.responses import Response

from api.openai.audio_protocol import (
    Transcription,
    TranscriptionSegment,
    TranscriptionVerbose,
    TranscriptionWord,
    Usage,
)
from common.events import SegmentDict, TranscriptDict


def clock(seconds: float, decimal: str) -> str:
    """`HH:MM:SS,mmm` (SubRip, decimal ",") or `HH:MM:SS.mmm` (WebVTT, decimal ".")."""
    millis = max(0, round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal}{millis:03d}"


def _cues(segments: list[SegmentDict], decimal: str) -> list[str]:
    return [f"{clock(s['start'], decimal)} --> {clock(s['end'], decimal)}\n{s['text'].strip()}\n" for s in segments]


def srt(segments: list[SegmentDict]) -> str:
    return "\n".join(f"{n}\n{cue}" for n, cue in enumerate(_cues(segments, ","), 1))


def vtt(segments: list[SegmentDict]) -> str:
    return "\n".join(["WEBVTT\n", *_cues(segments, ".")])


def verbose(transcript: TranscriptDict, task: str, temperature: float, words: bool) -> TranscriptionVerbose:
    segments = [TranscriptionSegment(id=n, seek=round(s["start"] * 100), start=s["start"], end=s["end"],
                                     text=s["text"], temperature=temperature)
                for n, s in enumerate(transcript.get("segments", []))]
    return TranscriptionVerbose(
        task="translate" if task == "translate" else "transcribe", language=transcript.get("language") or "",
        duration=transcript["duration"], text=transcript["text"], segments=segments,
        words=[TranscriptionWord(word=w["text"], start=w["start"], end=w["end"]) for w in transcript.get("words", [])]
        if words else None,
        usage=usage(transcript))


def usage(transcript: TranscriptDict) -> Usage:
    return Usage(seconds=transcript["duration"])


def render(transcript: TranscriptDict, response_format: str, task: str, temperature: float, words: bool,
           headers: dict[str, str]) -> Response:
    if response_format == "text":
        return Response(transcript["text"], media_type="text/plain", headers=headers)
    if response_format == "srt":
        return Response(srt(transcript.get("segments", [])), media_type="text/plain", headers=headers)
    if response_format == "vtt":
        return Response(vtt(transcript.get("segments", [])), media_type="text/vtt", headers=headers)
    if response_format == "verbose_json":
        body = verbose(transcript, task, temperature, words).model_dump_json(exclude_none=True)
    else:
        body = Transcription(text=transcript["text"], usage=usage(transcript)).model_dump_json()
    return Response(body, media_type="application/json", headers=headers)
