"""The speech pipelines on the tiny models: what a job's settings ask of GenAI, and what comes back."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from common.jobs import SpeechParams
from common.models.config import ModelConfig, Voice
from common.servable import ServableType
from workers.audio.pipelines import SpeechPipelines, read_voice, speech_info

MODELS = Path(__file__).resolve().parents[3] / "models"
AUDIO = (np.random.default_rng(0).standard_normal(16_000 * 2) * 0.1).astype(np.float32)


@pytest.fixture(scope="module")
def whisper() -> SpeechPipelines:
    pipes = SpeechPipelines(ModelConfig(name="w", path=MODELS / "tiny-whisper"), "CPU", ServableType.S2T)
    pipes.load()
    return pipes


def test_the_card_lists_whisper_languages_and_speecht5_voices() -> None:
    s2t = speech_info(ModelConfig(name="w", path=MODELS / "tiny-whisper"), ServableType.S2T)
    assert (s2t.languages, s2t.word_timestamps, s2t.sample_rate) == (["de", "en", "es", "fr"], False, 16_000)
    model = ModelConfig(name="t", path=MODELS / "tiny-speecht5", voices=[Voice(name="a", path=Path("voice-a.bin"))])
    t2s = speech_info(model, ServableType.T2S)
    assert (t2s.voices, t2s.sample_rate, t2s.speed) == (["a"], 16_000, False)


def test_streamed_text_is_the_transcript_and_a_stop_ends_it(whisper: SpeechPipelines) -> None:
    pieces: list[str] = []
    full = whisper.transcribe(AUDIO, SpeechParams(task="transcribe", language="en"),
                              lambda text: pieces.append(text) or False)
    assert full.text and "".join(pieces) == full.text
    assert (full.language, full.duration, full.segments) == ("en", 2.0, [])
    stopped = whisper.transcribe(AUDIO, SpeechParams(task="transcribe", language="en"), lambda text: True)
    assert len(stopped.text) < len(full.text)


def test_timestamps_come_as_segments(whisper: SpeechPipelines) -> None:
    timed = whisper.transcribe(AUDIO, SpeechParams(task="transcribe", language="en", timestamps=True),
                               lambda text: False)
    assert timed.segments and all(s.end >= s.start for s in timed.segments)
    assert "".join(s.text for s in timed.segments) == timed.text


def test_an_unknown_language_is_the_pipelines_error(whisper: SpeechPipelines) -> None:
    with pytest.raises(RuntimeError, match="lang_to_id"):
        whisper.transcribe(AUDIO, SpeechParams(task="transcribe", language="xx"), lambda text: False)


def test_speech_with_and_without_a_voice() -> None:
    model = ModelConfig(name="t", path=MODELS / "tiny-speecht5", voices=[Voice(name="a", path=Path("voice-a.bin"))])
    pipes = SpeechPipelines(model, "CPU", ServableType.T2S)
    pipes.load()
    plain, rate = pipes.speak("Hi.", SpeechParams(task="speak"))
    voiced, _ = pipes.speak("Hi.", SpeechParams(task="speak", voice="a"))
    assert rate == 16_000 and plain.shape == voiced.shape and plain.dtype == np.float32
    assert not np.array_equal(plain, voiced)
    again, _ = pipes.speak("Hi.", SpeechParams(task="speak"))
    assert np.abs(again - plain).max() < 1e-3  # a copy: the next call did not overwrite it
    with pytest.raises(ValueError, match="not one of this model's voices"):
        pipes.speak("Hi.", SpeechParams(task="speak", voice="b"))


def test_a_voice_file_is_raw_float32(tmp_path: Path) -> None:
    np.arange(4, dtype="<f4").tofile(tmp_path / "v.bin")
    assert read_voice(tmp_path / "v.bin").tolist() == [[0.0, 1.0, 2.0, 3.0]]
    (tmp_path / "empty.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="empty"):
        read_voice(tmp_path / "empty.bin")


def test_word_timestamps_where_the_model_enables_them() -> None:
    model = ModelConfig(name="w", path=MODELS / "tiny-whisper", enable_word_timestamps=True)
    pipes = SpeechPipelines(model, "CPU", ServableType.S2T)
    pipes.load()
    timed = pipes.transcribe(AUDIO, SpeechParams(task="transcribe", language="en", words=True), lambda text: False)
    assert timed.words and timed.segments == []  # segments only when asked for
    assert all(w.end >= w.start for w in timed.words)
    assert "".join(w.text for w in timed.words).strip().startswith(timed.text.strip()[:4])
