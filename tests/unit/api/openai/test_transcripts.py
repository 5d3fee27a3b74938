"""A transcript in each response_format: SubRip and WebVTT cues from the segments, OpenAI's JSON shapes."""
from __future__ import annotations

import orjson
import pytest

from api.openai.transcripts import clock, render, srt, vtt
from common.events import TranscriptDict

SEGMENTS = [{"start": 0.0, "end": 2.5, "text": " Hello there."}, {"start": 2.5, "end": 3661.004, "text": " Bye."}]
TRANSCRIPT: TranscriptDict = {"text": " Hello there. Bye.", "language": "en", "duration": 3700.0,
                              "segments": SEGMENTS, "words": [{"start": 0.0, "end": 0.4, "text": " Hello"}]}


@pytest.mark.parametrize(("seconds", "decimal", "text"), [
    (0, ",", "00:00:00,000"), (2.5, ".", "00:00:02.500"), (3661.004, ",", "01:01:01,004"),
    (59.9996, ".", "00:01:00.000"), (-0.01, ",", "00:00:00,000")])
def test_clock(seconds: float, decimal: str, text: str) -> None:
    assert clock(seconds, decimal) == text


def test_srt_numbers_its_cues_and_trims_the_text() -> None:
    assert srt(SEGMENTS) == ("1\n00:00:00,000 --> 00:00:02,500\nHello there.\n\n"
                             "2\n00:00:02,500 --> 01:01:01,004\nBye.\n")


def test_vtt_has_its_header_and_dotted_times() -> None:
    assert vtt(SEGMENTS) == ("WEBVTT\n\n00:00:00.000 --> 00:00:02.500\nHello there.\n\n"
                             "00:00:02.500 --> 01:01:01.004\nBye.\n")
    assert vtt([]) == "WEBVTT\n"


def test_json_and_text() -> None:
    json = render(TRANSCRIPT, "json", "transcribe", 0.0, False, {})
    assert json.media_type == "application/json"
    assert orjson.loads(json.body) == {"text": " Hello there. Bye.", "usage": {"type": "duration", "seconds": 3700.0}}
    text = render(TRANSCRIPT, "text", "transcribe", 0.0, False, {"X-Request-Id": "r"})
    assert text.body == b" Hello there. Bye." and text.headers["x-request-id"] == "r"


def test_verbose_json_has_segments_and_words_when_asked() -> None:
    body = orjson.loads(render(TRANSCRIPT, "verbose_json", "translate", 0.4, True, {}).body)
    assert (body["task"], body["language"], body["duration"]) == ("translate", "en", 3700.0)
    assert body["segments"][1] == {"id": 1, "seek": 250, "start": 2.5, "end": 3661.004, "text": " Bye.",
                                   "temperature": 0.4, "tokens": []}
    assert body["words"] == [{"word": " Hello", "start": 0.0, "end": 0.4}]
    assert "words" not in orjson.loads(render(TRANSCRIPT, "verbose_json", "transcribe", 0, False, {}).body)
