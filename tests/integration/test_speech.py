"""Speech to text and text to speech through the queue, with the official openai SDK, on a tiny random-weight Whisper
and SpeechT5 (tests/models): what the API answers is what GenAI's own pipelines give for the same input."""
from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import soundfile
from openai import OpenAI

from common.audio import decode
from common.jobs import JobHash
from tests.conftest import Tiers
from tests.precision import F32

MODELS = Path(__file__).resolve().parents[1] / "models"
WHISPER, TTS = "tiny-whisper", "tiny-speecht5"
KEY = "sk-speech-test"
MAX_SECONDS = 600


@pytest.fixture(scope="module")
def tiers(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiers]:
    models = {WHISPER: {"path": str(MODELS / "tiny-whisper")},
              # f32, pinned (with `speaker`): in bf16 the same pipeline in two processes rounds its waveform up to
              # 1.2e-3 apart, past 16-bit PCM's few LSBs (precision.md)
              TTS: {"path": str(MODELS / "tiny-speecht5"), "voices": [{"name": "voice-a", "path": "voice-a.bin"}],
                    "plugin_config": F32}}
    tiers = Tiers(redis_url, tmp_path_factory.mktemp("speech"), models, OVQ_API_KEYS=json.dumps([KEY]),
                  OVQ_MAX_AUDIO_SECONDS=str(MAX_SECONDS), OVQ_MAX_AUDIO_BYTES=str(2 * 1024 * 1024),
                  OVQ_WORKER_TTL_S="10")  # long audio holds the GIL a while (see the cancel test)
    tiers.worker(WHISPER, name="whisper")
    tiers.worker(TTS, name="tts")
    tiers.api()
    try:
        tiers.wait_served(WHISPER, TTS)
        yield tiers
    finally:
        tiers.stop()


@pytest.fixture(scope="module")
def client(tiers: Tiers) -> OpenAI:
    return OpenAI(base_url=tiers.base_url, api_key=KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def whisper() -> object:
    import openvino_genai as g

    return g.WhisperPipeline(str(MODELS / "tiny-whisper"), "CPU")


@pytest.fixture(scope="module")
def speaker() -> object:
    import openvino_genai as g

    return g.Text2SpeechPipeline(str(MODELS / "tiny-speecht5"), "CPU", **F32)


def noise(seconds: float, rate: int = 16_000, channels: int = 1, seed: int = 0) -> np.ndarray:
    shape = (int(seconds * rate), channels) if channels > 1 else (int(seconds * rate),)
    return (np.random.default_rng(seed).standard_normal(shape) * 0.1).astype(np.float32)


def audio_file(samples: np.ndarray, rate: int = 16_000, fmt: str = "WAV", subtype: str = "PCM_16") -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


WAV = audio_file(noise(3))


def test_transcription_is_the_whisper_pipelines_own_text(client: OpenAI, whisper) -> None:
    result = client.audio.transcriptions.create(model=WHISPER, file=("a.wav", WAV), language="en")
    expected = whisper.generate(decode(WAV), language="<|en|>", task="transcribe").texts[0]
    assert expected.strip() and result.text == expected


@pytest.mark.parametrize(("fmt", "subtype", "rate", "channels"),
                         [("FLAC", "PCM_16", 44_100, 2), ("MP3", "MPEG_LAYER_III", 22_050, 1)])
def test_flac_and_mp3_at_other_rates_are_decoded_to_16khz_mono(client: OpenAI, whisper, fmt: str, subtype: str,
                                                                rate: int, channels: int) -> None:
    data = audio_file(noise(2, rate, channels, seed=1), rate, fmt, subtype)
    result = client.audio.transcriptions.create(model=WHISPER, file=(f"a.{fmt.lower()}", data), language="en")
    assert result.text == whisper.generate(decode(data), language="<|en|>", task="transcribe").texts[0]


def test_translation_runs_the_translate_task(client: OpenAI, whisper) -> None:
    result = client.audio.translations.create(model=WHISPER, file=("a.wav", WAV), prompt="hello there")
    expected = whisper.generate(decode(WAV), task="translate", initial_prompt="hello there").texts[0]
    assert result.text == expected


def test_verbose_json_srt_and_vtt_carry_the_pipelines_timestamped_segments(client: OpenAI, whisper) -> None:
    timed = whisper.generate(decode(WAV), language="<|en|>", task="transcribe", return_timestamps=True)
    chunks = timed.chunks
    assert chunks
    verbose = client.audio.transcriptions.create(model=WHISPER, file=("a.wav", WAV), language="en",
                                                 response_format="verbose_json", timestamp_granularities=["segment"])
    assert verbose.duration == 3.0 and verbose.language == "en" and verbose.task == "transcribe"
    assert verbose.text == timed.texts[0]
    assert [(s.start, s.end, s.text) for s in verbose.segments] == [
        (round(c.start_ts, 2), round(c.end_ts, 2), c.text) for c in chunks]
    srt = client.audio.transcriptions.create(model=WHISPER, file=("a.wav", WAV), language="en",
                                             response_format="srt")
    first = verbose.segments[0]
    assert srt.startswith(f"1\n00:00:{first.start:06.3f}".replace(".", ",")), srt
    assert srt.count(" --> ") == len(chunks)
    vtt = client.audio.transcriptions.create(model=WHISPER, file=("a.wav", WAV), language="en",
                                             response_format="vtt")
    assert vtt.startswith("WEBVTT\n\n") and vtt.count(" --> ") == len(chunks)
    text = client.audio.transcriptions.create(model=WHISPER, file=("a.wav", WAV), language="en",
                                              response_format="text")  # decoded without timestamps
    assert text == whisper.generate(decode(WAV), language="<|en|>", task="transcribe").texts[0]


def test_streamed_transcription_sends_deltas_then_the_whole_text(client: OpenAI, whisper) -> None:
    expected = whisper.generate(decode(WAV), language="<|en|>", task="transcribe").texts[0]
    stream = client.audio.transcriptions.create(model=WHISPER, file=("a.wav", WAV), language="en", stream=True)
    events = list(stream)
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    assert len(deltas) > 1 and events[-1].type == "transcript.text.done"
    assert "".join(deltas) == events[-1].text == expected
    assert events[-1].usage.seconds == 3.0


def test_speech_is_the_pipelines_waveform_as_wav_and_flac(client: OpenAI, speaker) -> None:
    result = speaker.generate("Hi.")
    samples = np.array(result.speeches[0].data, copy=True).ravel()
    with client.audio.speech.with_streaming_response.create(model=TTS, voice="default", input="Hi.",
                                                            response_format="wav") as response:
        assert response.headers["content-type"] == "audio/wav"
        wav = response.read()
    read, rate = soundfile.read(io.BytesIO(wav), dtype="float32")
    assert rate == result.output_sample_rate == 16_000 and read.shape == samples.shape
    same_as(read, samples)
    flac = client.audio.speech.create(model=TTS, voice="default", input="Hi.", response_format="flac").read()
    assert soundfile.info(io.BytesIO(flac)).format == "FLAC"
    same_as(soundfile.read(io.BytesIO(flac), dtype="float32")[0], samples)
    mp3 = client.audio.speech.create(model=TTS, voice="default", input="Hi.").read()  # OpenAI's default: mp3
    assert soundfile.info(io.BytesIO(mp3)).format == "MP3"


def test_a_configured_voice_is_its_speaker_embedding(client: OpenAI, speaker) -> None:
    import openvino as ov

    embedding = np.fromfile(MODELS / "tiny-speecht5" / "voice-a.bin", dtype="<f4").reshape(1, -1)
    result = speaker.generate("Hi.", ov.Tensor(embedding))
    samples = np.array(result.speeches[0].data, copy=True).ravel()
    wav = client.audio.speech.create(model=TTS, voice="voice-a", input="Hi.", response_format="wav").read()
    voiced = soundfile.read(io.BytesIO(wav), dtype="float32")[0]
    same_as(voiced, samples)
    default = client.audio.speech.create(model=TTS, voice="default", input="Hi.", response_format="wav").read()
    assert np.abs(soundfile.read(io.BytesIO(default), dtype="float32")[0] - voiced).max() > 0.01


def same_as(received: np.ndarray, samples: np.ndarray) -> None:
    """The pipeline's waveform through 16-bit PCM: a few LSBs apart at most (CPU kernels in another process may
    round differently in the last bit)."""
    assert received.shape == samples.shape and np.abs(samples).max() > 0.01
    assert np.abs(received - np.clip(samples, -1, 1)).max() < 1e-3


@pytest.mark.parametrize(("extra", "param", "text"), [
    ({"voice": "alloy"}, "voice", "not one of this model's voices (default, voice-a)"),
    ({"speed": 1.5}, "speed", "speed is not supported"),
    ({"response_format": "aac"}, "response_format", "not available"),
    ({"stream_format": "sse"}, "stream_format", "not supported"),
    ({"input": ""}, "input", ""),
    ({"input": "x" * 4097}, "input", "OVQ_MAX_SPEECH_CHARS"),
    ({"model": WHISPER}, "model", "does not generate speech"),
])
def test_speech_requests_the_model_cannot_answer_are_400s(tiers: Tiers, extra: dict, param: str, text: str) -> None:
    body = {"model": TTS, "input": "Hi.", **extra}
    response = httpx.post(f"{tiers.base_url}/audio/speech", json=body, headers=auth(), timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and text in error["message"]


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


@pytest.mark.parametrize(("data", "fields", "status", "param", "text"), [
    (b"not audio at all" * 10, {}, 400, "file", "not an audio file"),
    (audio_file(np.zeros(16_000 * (MAX_SECONDS + 1), np.float32), fmt="FLAC"), {}, 400, "file",
     "OVQ_MAX_AUDIO_SECONDS"),
    (audio_file(noise(70), fmt="WAV", subtype="FLOAT"), {}, 413, "file", "OVQ_MAX_AUDIO_BYTES"),
    (WAV, {"language": "xx"}, 400, "language", "not one this model knows (de, en, es, fr)"),
    (WAV, {"response_format": "srt", "stream": "true"}, 400, "stream", "json or text"),
    (WAV, {"timestamp_granularities[]": "word", "response_format": "verbose_json"}, 400,
     "timestamp_granularities", "enable_word_timestamps"),
    (WAV, {"temperature": "2"}, 400, "temperature", ""),
    (WAV, {"model": TTS}, 400, "model", "does not transcribe audio"),
], ids=["not-audio", "too-long", "too-large", "language", "stream-srt", "words-off", "temperature", "tts-model"])
def test_uploads_and_options_the_model_cannot_take_are_4xx(tiers: Tiers, data: bytes, fields: dict, status: int,
                                                           param: str, text: str) -> None:
    form = {"model": WHISPER, **fields}
    response = httpx.post(f"{tiers.base_url}/audio/transcriptions", data=form, files={"file": ("a.wav", data)},
                          headers=auth(), timeout=30)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and text in error["message"]


def test_v1_twins_models_list_and_api_keys(tiers: Tiers, client: OpenAI) -> None:
    v1 = OpenAI(base_url=tiers.base_url.replace("/v3", "/v1"), api_key=KEY, max_retries=0, timeout=60)
    assert v1.audio.transcriptions.create(model=WHISPER, file=("a.wav", WAV), language="en").text == \
        client.audio.transcriptions.create(model=WHISPER, file=("a.wav", WAV), language="en").text
    assert {WHISPER, TTS} <= {m.id for m in v1.models.list()}
    anonymous = OpenAI(base_url=tiers.base_url, api_key="wrong", max_retries=0, timeout=30)
    with pytest.raises(openai.AuthenticationError):
        anonymous.audio.transcriptions.create(model=WHISPER, file=("a.wav", WAV))
    with pytest.raises(openai.AuthenticationError):
        anonymous.audio.speech.create(model=TTS, voice="default", input="Hi.")


def test_closing_a_streamed_transcription_cancels_its_job(tiers: Tiers, client: OpenAI, whisper) -> None:
    """Five minutes of audio (ten 30 s windows, text from each; the pipeline copies the samples with the GIL held,
    about a second here, hence these tiers' 10 s worker TTL): the client leaves after the first delta; the worker
    stops at its next piece of text (the job ends cancelled, not done) and takes the next job."""
    samples = np.zeros(8_000 * 300, np.float32)  # silence, FLAC makes it small
    samples[:16_000] = noise(2, 8_000, seed=2)
    long = audio_file(samples, 8_000, fmt="FLAC")
    form = {"model": WHISPER, "language": "en", "stream": "true"}
    with httpx.stream("POST", f"{tiers.base_url}/audio/transcriptions", data=form, files={"file": ("a.flac", long)},
                      headers=auth(), timeout=60) as response:
        assert response.status_code == 200
        job = response.headers["x-request-id"]
        first = next(line for line in response.iter_lines() if line.startswith("data: "))
        assert "transcript.text.delta" in first
    status_key, store = tiers.keys.job(job, WHISPER), tiers.redis()
    deadline = time.monotonic() + 60
    while store.hget(status_key, JobHash.STATUS) not in (b"cancelled", b"done", b"error") and \
            time.monotonic() < deadline:
        time.sleep(0.1)
    assert store.hget(status_key, JobHash.STATUS) == b"cancelled", store.hgetall(status_key)
    assert client.audio.transcriptions.create(model=WHISPER, file=("a.wav", WAV), language="en").text == \
        whisper.generate(decode(WAV), language="<|en|>", task="transcribe").texts[0]
