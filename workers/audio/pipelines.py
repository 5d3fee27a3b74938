"""OpenVINO GenAI speech pipelines for one model directory: `WhisperPipeline` (speech to text) or
`Text2SpeechPipeline` (text to speech). Both run one request at a time and release the GIL in `generate()`, so they
run in a thread of the worker's I/O process. Whisper's streamer is how text leaves it and cancels reach it; speech
synthesis has no callback and gets the whole input in one call (as in OVMS; sentence by sentence would change the
waveform), so a cancel stops it only before it starts; after, the worker drops what the call returns."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from common.audio import WHISPER_RATE
from common.events import Segment, Transcript
from common.jobs import SpeechParams
from common.modelcard import SpeechInfo
from common.models.config import ModelConfig
from common.servable import ServableType, whisper_languages, whisper_multilingual

# The streamer gets each piece of decoded text; True stops decoding (the partial text is kept).
TextCallback = Callable[[str], bool]
SAMPLE_RATES = {"speecht5": 16_000, "kokoro": 24_000}
SPEED_MODELS = ("kokoro",)  # SpeechGenerationConfig.speed is Kokoro's


def model_type(path: Path) -> str:
    try:
        return str(json.loads((path / "config.json").read_text()).get("model_type", "")).lower()
    except FileNotFoundError:
        return ""


def speech_info(model: ModelConfig, kind: ServableType) -> SpeechInfo:
    path = Path(model.path)
    if kind is ServableType.S2T:
        languages = whisper_languages(path) if whisper_multilingual(path) else []
        return SpeechInfo(languages=languages, word_timestamps=model.enable_word_timestamps,
                          sample_rate=WHISPER_RATE)
    kind_of = model_type(path)
    return SpeechInfo(voices=[v.name for v in model.voices], sample_rate=SAMPLE_RATES.get(kind_of, 16_000),
                      speed=kind_of in SPEED_MODELS)


def read_voice(path: Path) -> np.ndarray:
    """A speaker embedding as OVMS reads one: raw little-endian float32, shape [1, N]."""
    data = np.fromfile(path, dtype="<f4")
    if data.size == 0:
        raise ValueError(f"voice file {path} is empty")
    return data.reshape(1, -1)


class SpeechPipelines:
    def __init__(self, model: ModelConfig, device: str, kind: ServableType) -> None:
        self.model, self.device, self.kind = model, device, kind
        self.path = Path(model.path)
        self.properties = dict(model.plugin_config)
        self.pipe: Any = None
        self.voices: dict[str, Any] = {}

    def load(self) -> None:
        import openvino as ov
        import openvino_genai as g

        if self.kind is ServableType.S2T:
            extra = {"word_timestamps": True} if self.model.enable_word_timestamps else {}
            self.pipe = g.WhisperPipeline(str(self.path), self.device, **self.properties, **extra)
            return
        # Voices first: a missing file fails the worker's start, as it fails OVMS's graph.
        self.voices = {v.name: ov.Tensor(read_voice(self.path / v.path)) for v in self.model.voices}
        self.pipe = g.Text2SpeechPipeline(str(self.path), self.device, **self.properties)

    def transcribe(self, samples: np.ndarray, params: SpeechParams, on_text: TextCallback) -> Transcript:
        kwargs: dict[str, Any] = {}
        if self.pipe.get_generation_config().is_multilingual:
            kwargs["task"] = params.task
            if params.language:
                kwargs["language"] = f"<|{params.language}|>"
        if params.prompt:
            kwargs["initial_prompt"] = params.prompt
        if params.temperature:  # 0 or unset: greedy, as Whisper decodes by default
            kwargs.update(do_sample=True, temperature=params.temperature)
        if params.timestamps or params.words:
            kwargs["return_timestamps"] = True
        if params.words:
            kwargs["word_timestamps"] = True
        result = self.pipe.generate(samples, streamer=on_text, **kwargs)
        segments = [Segment(start=round(c.start_ts, 2), end=round(c.end_ts, 2), text=c.text)
                    for c in (result.chunks or [])] if params.timestamps else []
        words = [Segment(start=round(w.start_ts, 2), end=round(w.end_ts, 2), text=w.word)
                 for w in (result.words or [])] if params.words else []
        return Transcript(text=result.texts[0] if result.texts else "", language=result.language or params.language,
                          duration=round(len(samples) / WHISPER_RATE, 3), segments=segments, words=words)

    def speak(self, text: str, params: SpeechParams) -> tuple[np.ndarray, int]:
        """Mono float samples and their rate (copied: the result's tensor is the pipeline's own buffer)."""
        kwargs: dict[str, Any] = {}
        if params.speed is not None:
            kwargs["speed"] = params.speed
        if params.voice and params.voice not in self.voices:  # the API checked the card; this worker may differ
            raise ValueError(f"voice {params.voice!r} is not one of this model's voices")
        voice = self.voices.get(params.voice) if params.voice else None
        result = self.pipe.generate(text, voice, **kwargs) if voice is not None else self.pipe.generate(text, **kwargs)
        samples = np.array(result.speeches[0].data, dtype=np.float32, copy=True).ravel()
        return samples, int(result.output_sample_rate)
