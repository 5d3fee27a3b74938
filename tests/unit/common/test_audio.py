"""Audio bytes in and out: what libsndfile reads from an upload's header, Whisper's 16 kHz mono input, and the
speech formats written back."""
from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile

from common.audio import SPEECH_FORMATS, WHISPER_RATE, AudioError, decode, encode, probe


def tone(seconds: float, rate: int, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    wave = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    return np.stack([wave] * channels, axis=1) if channels > 1 else wave


def written(samples: np.ndarray, rate: int, fmt: str, subtype: str) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


@pytest.mark.parametrize(("fmt", "subtype"), [("WAV", "PCM_16"), ("FLAC", "PCM_24"), ("MP3", "MPEG_LAYER_III"),
                                              ("OGG", "VORBIS")])
def test_probe_reads_format_duration_rate_and_channels_from_the_header(fmt: str, subtype: str) -> None:
    info = probe(written(tone(2, 44_100, 2), 44_100, fmt, subtype))
    assert (info.format, info.rate, info.channels) == (fmt, 44_100, 2)
    assert info.seconds == pytest.approx(2, abs=0.05)


@pytest.mark.parametrize("data", [b"", b"RIFF" + b"\0" * 40, b"hello, not audio" * 20])
def test_probe_refuses_what_is_not_audio(data: bytes) -> None:
    with pytest.raises(AudioError):
        probe(data)


def test_decode_mixes_to_mono_and_resamples_to_16khz() -> None:
    stereo = tone(1, 44_100, 2)
    stereo[:, 1] = 0.0  # the mix halves the tone
    samples = decode(written(stereo, 44_100, "FLAC", "PCM_24"))
    assert samples.dtype == np.float32 and samples.ndim == 1
    assert len(samples) == WHISPER_RATE
    assert np.abs(samples[1000:-1000]).max() == pytest.approx(0.25, abs=0.01)


def test_decode_keeps_16khz_mono_as_it_is() -> None:
    wave = tone(0.5, WHISPER_RATE)
    samples = decode(written(wave, WHISPER_RATE, "WAV", "FLOAT"))
    assert np.array_equal(samples, wave)


def test_decode_of_a_truncated_file_is_an_audio_error() -> None:
    data = written(tone(1, WHISPER_RATE), WHISPER_RATE, "FLAC", "PCM_16")
    with pytest.raises(AudioError):
        decode(data[:20])


@pytest.mark.parametrize("response_format", sorted(SPEECH_FORMATS))
def test_encode_writes_each_speech_format_libsndfile_reads_back(response_format: str) -> None:
    wave = tone(1, 16_000)
    data = encode(wave, 16_000, response_format)
    if response_format == "pcm":  # raw 16-bit little-endian, no header
        assert len(data) == 2 * len(wave)
        assert np.abs(np.frombuffer(data, "<i2") / 32768 - wave).max() < 1e-4
        return
    info = probe(data)
    assert info.format == SPEECH_FORMATS[response_format][0] and info.channels == 1
    assert info.seconds == pytest.approx(1, abs=0.1)


def test_encode_clips_and_resamples_opus_to_a_rate_it_takes() -> None:
    data = encode(np.full(22_050, 3.0, dtype=np.float32), 22_050, "opus")
    assert probe(data).rate == 24_000
    wav, _ = soundfile.read(io.BytesIO(encode(np.array([3.0, -3.0], dtype=np.float32), 16_000, "wav")))
    assert np.allclose(wav, [1.0, -1.0], atol=1e-4)
