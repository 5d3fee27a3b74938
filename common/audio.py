"""Audio bytes in and out, by soundfile (libsndfile): what an upload holds, Whisper's 16 kHz mono float input, and
the speech formats OpenAI's `/audio/speech` names that libsndfile writes."""
from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import soundfile
import soxr

WHISPER_RATE = 16_000
# response_format -> (libsndfile container, subtype, media type); `pcm` is OpenAI's raw 16-bit little-endian.
SPEECH_FORMATS: dict[str, tuple[str, str, str]] = {
    "mp3": ("MP3", "MPEG_LAYER_III", "audio/mpeg"),
    "opus": ("OGG", "OPUS", "audio/ogg"),
    "flac": ("FLAC", "PCM_16", "audio/flac"),
    "wav": ("WAV", "PCM_16", "audio/wav"),
    "pcm": ("RAW", "PCM_16", "audio/pcm"),
}
# Opus encodes only these rates; other rates are resampled to the nearest one above (or 48 kHz).
OPUS_RATES = (8_000, 12_000, 16_000, 24_000, 48_000)


class AudioError(ValueError):
    """Bytes libsndfile cannot read as audio."""


@dataclass(frozen=True)
class AudioInfo:
    format: str  # libsndfile's container name: WAV, FLAC, MP3, OGG, ...
    seconds: float
    rate: int
    channels: int


def probe(data: bytes) -> AudioInfo:
    """What the bytes hold, from their header (no decoding)."""
    try:
        info = soundfile.info(io.BytesIO(data))
    except (soundfile.SoundFileError, RuntimeError) as exc:
        raise AudioError(f"not an audio file libsndfile reads ({_reason(exc)})") from None
    if info.samplerate <= 0 or info.channels <= 0:
        raise AudioError("the audio file has no samples")
    return AudioInfo(info.format, float(info.duration), int(info.samplerate), int(info.channels))


def decode(data: bytes) -> np.ndarray:
    """The whole file as 16 kHz mono float32 in [-1, 1], as Whisper takes it."""
    try:
        samples, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except (soundfile.SoundFileError, RuntimeError) as exc:
        raise AudioError(f"the audio could not be decoded ({_reason(exc)})") from None
    mono = samples.mean(axis=1) if samples.shape[1] > 1 else samples[:, 0]
    if rate != WHISPER_RATE:
        mono = soxr.resample(mono, rate, WHISPER_RATE)
    return np.ascontiguousarray(mono, dtype=np.float32)


def encode(samples: np.ndarray, rate: int, response_format: str) -> bytes:
    """Mono float samples as a file of `response_format` (a key of SPEECH_FORMATS)."""
    container, subtype, _ = SPEECH_FORMATS[response_format]
    samples = np.clip(np.asarray(samples, dtype=np.float32).ravel(), -1.0, 1.0)
    if container == "OGG" and rate not in OPUS_RATES:
        target = next((r for r in OPUS_RATES if r >= rate), OPUS_RATES[-1])
        samples, rate = soxr.resample(samples, rate, target).astype(np.float32), target
    buffer = io.BytesIO()
    extra = {"endian": "LITTLE"} if container == "RAW" else {}
    soundfile.write(buffer, samples, rate, format=container, subtype=subtype, **extra)
    return buffer.getvalue()


def _reason(exc: Exception) -> str:
    text = str(exc)
    return text.rsplit(": ", 1)[-1].strip() or type(exc).__name__
