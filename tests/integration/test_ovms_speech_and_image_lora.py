"""An OVMS repository's speech graphs (S2tCalculator, T2sCalculator with `voices`) and an image graph's
`lora_adapters`, served unchanged by `ovq serve --config_path`: each answers through the openai SDK with its graph's
options in force."""
from __future__ import annotations

import base64
import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import psutil
import pytest
import soundfile
from openai import OpenAI
from PIL import Image

from common.audio import decode
from tests.conftest import ROOT, _wait_ready, free_port
from tests.ovms_repository import image_graph, link_model, s2t_graph, t2s_graph, write_repository
from tests.precision import F32

MODELS = ROOT / "tests" / "models"
S2T, T2S, IMAGE = "openai/tiny-whisper", "microsoft/tiny-speecht5", "tiny-sd"


def repository(root: Path) -> Path:
    link_model(MODELS / "tiny-whisper", root / "whisper")
    link_model(MODELS / "tiny-speecht5", root / "tts")
    link_model(MODELS / "tiny-sd", root / "sd")
    (root / "sd" / "loras").mkdir()
    (root / "sd" / "loras" / "style.safetensors").write_bytes(
        (MODELS / "tiny-sd-lora" / "tiny_sd_lora.safetensors").read_bytes())
    (root / "tts" / "voices").mkdir()
    (root / "tts" / "voices" / "a.bin").write_bytes((MODELS / "tiny-speecht5" / "voice-a.bin").read_bytes())
    return write_repository(root, {
        "whisper": s2t_graph('models_path: "./"', 'target_device: "CPU"'),
        # OVMS's plugin_config passes through: f32, pinned as in test_speech (precision.md)
        "tts": t2s_graph('models_path: "./"', 'target_device: "CPU"', f"plugin_config: '{json.dumps(F32)}'",
                         "voices { name: 'speaker-a' path: 'voices/a.bin' }"),
        "sd": image_graph('models_path: "./"', 'max_resolution: "64x64"', "default_num_inference_steps: 2",
                          "lora_adapters { alias: 'style' path: 'loras/style.safetensors' alpha: 0.8 }"),
    }, [{"name": S2T, "base_path": "whisper"}, {"name": T2S, "base_path": "tts"}, {"name": IMAGE, "base_path": "sd"}])


@pytest.fixture(scope="module")
def client(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenAI]:
    work = tmp_path_factory.mktemp("ovms-speech")
    config = repository(work / "repo")
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key not in ("OVQ_CONFIG", "OVQ_OVMS_CONFIG")}
    env.update(REDIS_URL=redis_url, OVQ_KEY_PREFIX="ovqovmsspeech", OVQ_SHUTDOWN_GRACE_S="5", PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "cli.main", "serve", "--config_path", str(config), "--rest_port", str(port),
               "--rest_bind_address", "127.0.0.1", "--log_level", "WARNING"]
    serve = subprocess.Popen(command, env=env, cwd=ROOT, stdout=(work / "serve.log").open("wb"),
                             stderr=subprocess.STDOUT)
    try:
        _wait_ready(f"http://127.0.0.1:{port}/health", [serve], work, {S2T, T2S, IMAGE})
        yield OpenAI(base_url=f"http://127.0.0.1:{port}/v3", api_key="unused", max_retries=0, timeout=120)
    finally:
        children = psutil.Process(serve.pid).children(recursive=True)
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(60)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
        for child in children:
            if child.is_running():
                child.kill()


def test_a_speech_to_text_graph_transcribes_as_the_whisper_pipeline(client: OpenAI) -> None:
    import openvino_genai as g

    buffer = io.BytesIO()
    samples = (np.random.default_rng(0).standard_normal(32_000) * 0.1).astype(np.float32)
    soundfile.write(buffer, samples, 16_000, format="WAV", subtype="PCM_16")
    wav = buffer.getvalue()
    result = client.audio.transcriptions.create(model=S2T, file=("a.wav", wav), language="en")
    own = g.WhisperPipeline(str(MODELS / "tiny-whisper"), "CPU")
    assert result.text == own.generate(decode(wav), language="<|en|>", task="transcribe").texts[0]


def test_a_text_to_speech_graph_speaks_with_its_voices(client: OpenAI) -> None:
    import openvino as ov
    import openvino_genai as g

    embedding = np.fromfile(MODELS / "tiny-speecht5" / "voice-a.bin", dtype="<f4").reshape(1, -1)
    own = g.Text2SpeechPipeline(str(MODELS / "tiny-speecht5"), "CPU", **F32).generate("Hi.", ov.Tensor(embedding))
    expected = np.clip(np.array(own.speeches[0].data, copy=True).ravel(), -1, 1)
    wav = client.audio.speech.create(model=T2S, voice="speaker-a", input="Hi.", response_format="wav").read()
    received = soundfile.read(io.BytesIO(wav), dtype="float32")[0]
    assert received.shape == expected.shape and np.abs(received - expected).max() < 1e-3
    with pytest.raises(openai.BadRequestError, match="speaker-a"):  # the graph's voices are the model's
        client.audio.speech.create(model=T2S, voice="alloy", input="Hi.")


def test_an_image_graphs_lora_adapter_is_weighed_per_request(client: OpenAI) -> None:
    def image(weights: dict[str, float]) -> np.ndarray:
        result = client.images.generate(model=IMAGE, prompt="a red square", size="64x64", response_format="b64_json",
                                        extra_body={"lora_weights": weights, "rng_seed": 7})
        return np.asarray(Image.open(io.BytesIO(base64.b64decode(result.data[0].b64_json))), dtype=np.int16)

    assert np.abs(image({"style": 1.0}) - image({"style": 0.0})).max() > 8  # the graph's adapter is applied
    with pytest.raises(openai.BadRequestError, match="style"):
        image({"pokemon": 1.0})
