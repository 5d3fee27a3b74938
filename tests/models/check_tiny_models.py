"""Smoke-check the tiny OpenVINO test models with openvino_genai (no torch needed).

Run with the project's interpreter::

    python3 tests/models/check_tiny_models.py            # all of them
    python3 tests/models/check_tiny_models.py llava sd   # some of them

Exits non-zero if any check fails.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np
import openvino as ov
import openvino_genai as ov_genai

MODELS_DIR = Path(__file__).resolve().parent
DEVICE = "CPU"
# The checks whose claims hold at f32 only pin it (tests/precision.py says why, and what f32 takes besides the hint).
F32 = {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}

CHATML_PROMPT = "<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"


def log(message: str) -> None:
    print(f"[check_tiny_models] {message}", flush=True)


def run_to_completion(pipe: ov_genai.ContinuousBatchingPipeline,
                      handles: list[ov_genai.GenerationHandle]) -> list[str]:
    """Step the CB pipeline until every request is done; return each request's text."""
    while any(h.get_status() == ov_genai.GenerationStatus.RUNNING for h in handles):
        pipe.step()
    tokenizer = pipe.get_tokenizer()
    texts = []
    for handle in handles:
        status = handle.get_status()
        assert status == ov_genai.GenerationStatus.FINISHED, status
        outputs = handle.read_all()
        texts.append(tokenizer.decode(outputs[0].generated_ids))
    return texts


def test_image(seed: int, height: int = 48, width: int = 64) -> ov.Tensor:
    rng = np.random.default_rng(seed)
    return ov.Tensor(rng.integers(0, 256, (1, height, width, 3), dtype=np.uint8))


def check_llama() -> None:
    path = MODELS_DIR / "tiny-llama"
    pipe = ov_genai.LLMPipeline(str(path), DEVICE)
    tokenizer = pipe.get_tokenizer()
    assert tokenizer.get_bos_token() == "<|im_start|>", tokenizer.get_bos_token()
    assert tokenizer.get_eos_token() == "<|im_end|>", tokenizer.get_eos_token()
    templated = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert templated == CHATML_PROMPT.format(content="Hi"), repr(templated)

    # LLMPipeline.generate(str) applies the chat template.
    text = pipe.generate("What is the capital of France?", max_new_tokens=16)
    assert isinstance(text, str) and text.strip(), repr(text)
    assert pipe.generate("What is the capital of France?", max_new_tokens=16) == text
    history = ov_genai.ChatHistory()
    history.append({"role": "user", "content": "What is the capital of France?"})
    from_history = pipe.generate(history, max_new_tokens=16).texts[0]
    assert from_history == text, (from_history, text)
    log(f"tiny-llama LLMPipeline: {text!r}")

    # ContinuousBatchingPipeline.add_request does not apply the template: do it here.
    cb = ov_genai.ContinuousBatchingPipeline(str(path), ov_genai.SchedulerConfig(), DEVICE)
    config = ov_genai.GenerationConfig(max_new_tokens=16)
    handles = [
        cb.add_request(0, CHATML_PROMPT.format(content="What is the capital of France?"), config),
        cb.add_request(1, CHATML_PROMPT.format(content="Tell me a story."), config),
    ]
    texts = run_to_completion(cb, handles)
    assert texts[0] == text, (texts[0], text)
    assert texts[1].strip(), repr(texts[1])
    log(f"tiny-llama ContinuousBatchingPipeline: {texts!r}")


def check_llava() -> None:
    path = MODELS_DIR / "tiny-llava"
    image, other_image = test_image(0), test_image(1)
    pipe = ov_genai.VLMPipeline(str(path), DEVICE)

    # Chat template applied by the pipeline; "<image>" is prepended when absent.
    answer = pipe.generate("Describe this image.", images=[image], max_new_tokens=16)
    text = answer.texts[0]
    assert text.strip(), repr(text)
    # 21 prompt tokens + 25 image tokens.
    assert answer.perf_metrics.get_num_input_tokens() == 46, answer.perf_metrics.get_num_input_tokens()
    other = pipe.generate("Describe this image.", images=[other_image], max_new_tokens=16).texts[0]
    assert other != text, "the image does not change the answer"
    history = ov_genai.ChatHistory()
    history.append({"role": "user", "content": "Describe this image."})
    from_history = pipe.generate(history, images=[image], max_new_tokens=16).texts[0]
    assert from_history == text, (from_history, text)
    log(f"tiny-llava VLMPipeline: {text!r}")

    # Raw prompt with an explicit image tag, no template: must match CB below.
    raw_prompt = CHATML_PROMPT.format(content="<image>\nDescribe this image.")
    config = pipe.get_generation_config()
    config.max_new_tokens = 16
    config.apply_chat_template = False
    raw_text = pipe.generate(raw_prompt, images=[image], generation_config=config).texts[0]

    cb = ov_genai.ContinuousBatchingPipeline(str(path), ov_genai.SchedulerConfig(), DEVICE)
    cb_config = ov_genai.GenerationConfig(max_new_tokens=16)
    handles = [
        cb.add_request(0, raw_prompt, images=[image], generation_config=cb_config),
        cb.add_request(1, raw_prompt.replace("<image>", "<ov_genai_image_0>"), images=[image],
                       generation_config=cb_config),
        cb.add_request(2, raw_prompt, images=[other_image], generation_config=cb_config),
        cb.add_request(3, CHATML_PROMPT.format(content="Hello"), cb_config),  # text only
    ]
    texts = run_to_completion(cb, handles)
    assert texts[0] == raw_text, (texts[0], raw_text)
    assert texts[1] == raw_text, (texts[1], raw_text)
    assert all(t.strip() for t in texts), texts
    log(f"tiny-llava ContinuousBatchingPipeline: {texts!r}")


def check_sd() -> None:
    path = str(MODELS_DIR / "tiny-sd")
    kwargs = {"width": 64, "height": 64, "num_inference_steps": 4, "rng_seed": 42}

    t2i = ov_genai.Text2ImagePipeline(path, DEVICE)
    image = t2i.generate("a photo of a red cat", **kwargs)
    assert list(image.shape) == [1, 64, 64, 3], image.shape
    assert image.data.dtype == np.uint8
    again = t2i.generate("a photo of a red cat", **kwargs)
    assert np.array_equal(image.data, again.data), "same rng_seed gave different images"
    log(f"tiny-sd Text2ImagePipeline: {list(image.shape)}, mean {image.data.mean():.1f}")

    i2i = ov_genai.Image2ImagePipeline(path, DEVICE)
    changed = i2i.generate("a blue dog", image=image, strength=0.8, num_inference_steps=4, rng_seed=1)
    assert list(changed.shape) == [1, 64, 64, 3], changed.shape
    log(f"tiny-sd Image2ImagePipeline: {list(changed.shape)}")

    mask = np.zeros((1, 64, 64, 3), dtype=np.uint8)
    mask[:, 16:48, 16:48] = 255
    inpaint = ov_genai.InpaintingPipeline(path, DEVICE)
    filled = inpaint.generate("a green tree", image=image, mask_image=ov.Tensor(mask),
                              num_inference_steps=4, rng_seed=1)
    assert list(filled.shape) == [1, 64, 64, 3], filled.shape
    log(f"tiny-sd InpaintingPipeline: {list(filled.shape)}")


def check_ltx() -> None:
    """Makes 8k+1 frames of the asked size, reports each denoising step, stops when the callback asks, repeats a
    seed."""
    pipe = ov_genai.Text2VideoPipeline(str(MODELS_DIR / "tiny-ltx"), DEVICE)
    steps: list[int] = []
    kwargs = {"width": 96, "height": 64, "num_frames": 9, "num_inference_steps": 3, "frame_rate": 8}
    video = pipe.generate("a red cat", generator=ov_genai.CppStdGenerator(42),
                          callback=lambda step, total, latent: steps.append(step) or False, **kwargs).video
    assert list(video.shape) == [1, 9, 64, 96, 3], video.shape
    assert steps == [0, 1, 2], steps
    again = pipe.generate("a red cat", generator=ov_genai.CppStdGenerator(42), **kwargs).video
    assert np.array_equal(video.data, again.data), "the same generator seed gave different videos"
    stopped: list[int] = []
    pipe.generate("a red cat", callback=lambda step, total, latent: stopped.append(step) or True, **kwargs)
    assert stopped == [0], stopped
    log(f"tiny-ltx Text2VideoPipeline: {list(video.shape)}, mean {video.data.mean():.1f}")


def check_whisper() -> None:
    """Transcribes, translates, streams (and stops when the streamer asks) and gives timestamped chunks."""
    path = MODELS_DIR / "tiny-whisper"
    pipe = ov_genai.WhisperPipeline(str(path), DEVICE)
    audio = (np.random.default_rng(0).standard_normal(16000 * 3) * 0.1).astype(np.float32).tolist()
    result = pipe.generate(audio, language="<|en|>", task="transcribe")
    text = result.texts[0]
    assert text.strip(), repr(text)
    assert pipe.generate(audio, language="<|en|>", task="transcribe").texts[0] == text
    assert pipe.generate(audio, language="<|de|>", task="translate").texts[0].strip()
    chunks: list[str] = []
    streamed = pipe.generate(audio, language="<|en|>", streamer=lambda s: chunks.append(s) or False).texts[0]
    assert "".join(chunks) == streamed == text, (chunks, streamed, text)
    stopped: list[str] = []
    pipe.generate(audio, language="<|en|>", streamer=lambda s: stopped.append(s) or len(stopped) >= 2)
    assert len(stopped) < len(chunks), stopped  # a stop ends generation (the held-back text still flushes)
    timed = pipe.generate(audio, language="<|en|>", return_timestamps=True)
    assert timed.chunks and all(c.end_ts >= c.start_ts for c in timed.chunks), timed.chunks
    log(f"tiny-whisper WhisperPipeline: {text!r}, {len(timed.chunks)} timestamped chunks")


def check_speecht5() -> None:
    """Speaks at 16 kHz, deterministically; a speaker embedding (the voice file) changes the waveform."""
    path = MODELS_DIR / "tiny-speecht5"
    pipe = ov_genai.Text2SpeechPipeline(str(path), DEVICE)
    result = pipe.generate("hello world")
    assert result.output_sample_rate == 16000, result.output_sample_rate
    # The result's tensors are the pipeline's own buffers: copy before the next generate.
    first = np.array(result.speeches[0].data, copy=True).ravel()
    assert first.size > 0 and np.abs(first).max() > 1e-3, (first.size, np.abs(first).max())
    again = np.array(pipe.generate("hello world").speeches[0].data, copy=True).ravel()
    assert np.array_equal(first, again)
    voice = np.fromfile(path / "voice-a.bin", dtype="<f4").reshape(1, 512)
    voiced = np.array(pipe.generate("hello world", ov.Tensor(voice)).speeches[0].data, copy=True).ravel()
    assert voiced.shape == first.shape and not np.array_equal(voiced, first)
    log(f"tiny-speecht5 Text2SpeechPipeline: {first.size} samples at {result.output_sample_rate} Hz")




def check_embed() -> None:
    path = str(MODELS_DIR / "tiny-embed")
    texts = ["The capital of France is Paris.", "hello world"]
    pipe = ov_genai.TextEmbeddingPipeline(path, DEVICE)
    vectors = np.asarray(pipe.embed_documents(texts))
    assert vectors.shape == (2, 32), vectors.shape
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)  # normalised by default
    assert not np.allclose(vectors[0], vectors[1])
    # Batched or alone, a text gets the same vector (the worker batches requests).
    np.testing.assert_allclose(np.asarray(pipe.embed_documents(texts[1:]))[0], vectors[1], atol=1e-6)
    mean = ov_genai.TextEmbeddingPipeline(path, DEVICE, ov_genai.TextEmbeddingPipeline.Config(
        pooling_type=ov_genai.TextEmbeddingPipeline.PoolingType.MEAN, normalize=False, max_length=8))
    assert not np.allclose(np.asarray(mean.embed_documents(texts[:1]))[0], vectors[0])
    tokenizer = ov_genai.Tokenizer(path)
    ids = tokenizer.encode(texts[0]).input_ids.data[0].tolist()
    assert ids[0] == 2 and ids[-1] == 3, ids  # [CLS] ... [SEP]
    assert tokenizer.decode(ids, skip_special_tokens=True) == texts[0].lower(), tokenizer.decode(ids)
    log(f"tiny-embed TextEmbeddingPipeline: {vectors.shape}")


def check_rerank() -> None:
    # f32: the random weights put the three logits within one bf16 step of each other (a bf16 host scored all three
    # 0.63671875), so the order this check asks for exists at f32 only.
    pipe = ov_genai.TextRerankPipeline(str(MODELS_DIR / "tiny-rerank"), DEVICE,
                                       ov_genai.TextRerankPipeline.Config(top_n=10), **F32)
    documents = ["Paris is the capital of France", "a cat", "the sky is blue"]
    ranked = pipe.rerank("capital of France", documents)
    assert sorted(i for i, _ in ranked) == [0, 1, 2], ranked
    scores = [s for _, s in ranked]
    assert scores == sorted(scores, reverse=True) and len(set(scores)) == 3, ranked
    assert all(0.0 < s < 1.0 for s in scores), ranked  # a sigmoid of the one logit
    log(f"tiny-rerank TextRerankPipeline: {ranked}")


def check_llama_draft() -> None:
    """The draft drafts for the tiny Llama (speculative decoding) without changing its greedy text (at f32: in bf16
    verifying several drafted tokens in one pass rounds otherwise than decoding them one by one)."""
    llama, draft = MODELS_DIR / "tiny-llama", MODELS_DIR / "tiny-llama-draft"
    prompt = CHATML_PROMPT.format(content="What is the capital of France?")
    plain = ov_genai.ContinuousBatchingPipeline(str(llama), ov_genai.SchedulerConfig(), DEVICE, F32)
    drafted = ov_genai.ContinuousBatchingPipeline(str(llama), ov_genai.SchedulerConfig(), DEVICE,
                                                  {**F32, "draft_model": ov_genai.draft_model(str(draft), DEVICE, **F32)})
    config = ov_genai.GenerationConfig(max_new_tokens=24, num_assistant_tokens=3)
    expected = plain.generate([prompt], [ov_genai.GenerationConfig(max_new_tokens=24)])[0].m_generation_ids[0]
    result = drafted.generate([prompt], [config])[0]
    assert result.m_generation_ids[0] == expected, (result.m_generation_ids[0], expected)
    rate = result.extended_perf_metrics.get_draft_acceptance_rate()
    assert 0 < rate < 1, rate  # agrees on some tokens, not all
    log(f"llama-draft: greedy text unchanged, acceptance {rate:.2f}")


def check_llama_lora() -> None:
    """The adapter loads in GenAI and changes the tiny Llama's greedy text."""
    llama, lora = MODELS_DIR / "tiny-llama", MODELS_DIR / "tiny-llama-lora" / "adapter_model.safetensors"
    adapter = ov_genai.Adapter(str(lora))
    pipe = ov_genai.ContinuousBatchingPipeline(str(llama), ov_genai.SchedulerConfig(), DEVICE,
                                               {"adapters": ov_genai.AdapterConfig(adapter)})
    prompt = CHATML_PROMPT.format(content="Hi")
    texts = []
    for adapters in (ov_genai.AdapterConfig(), ov_genai.AdapterConfig(adapter, 0.7)):
        config = ov_genai.GenerationConfig(max_new_tokens=16)
        config.adapters = adapters
        texts.append(pipe.generate([prompt], [config])[0].m_generation_ids[0])
    assert texts[0] != texts[1], texts
    log(f"llama-lora: base {texts[0]!r}, adapted {texts[1]!r}")


def check_sd_lora() -> None:
    """The adapter loads in GenAI's image pipeline, every tensor used, and changes tiny-sd's image."""
    import numpy as np

    sd, lora = MODELS_DIR / "tiny-sd", MODELS_DIR / "tiny-sd-lora" / "tiny_sd_lora.safetensors"
    adapter = ov_genai.Adapter(str(lora))
    dynamic = ov_genai.AdapterConfig.Mode.MODE_DYNAMIC
    pipe = ov_genai.Text2ImagePipeline(str(sd), DEVICE, adapters=ov_genai.AdapterConfig(adapter, 1.0, dynamic))
    # np.array copies: the result's tensor is a view of a buffer the pipeline's next generate() overwrites.
    images = [np.array(pipe.generate("a red cat", width=64, height=64, num_inference_steps=2, rng_seed=1,
                                     adapters=ov_genai.AdapterConfig([(adapter, alpha)], dynamic)).data)
              for alpha in (0.0, 1.0)]
    change = float(np.abs(images[0].astype(int) - images[1]).mean())
    assert change > 0.1, change
    log(f"sd-lora: mean pixel change {change:.2f}")


CHECKS: dict[str, Callable[[], None]] = {"llama": check_llama, "llava": check_llava, "sd": check_sd,
                                         "whisper": check_whisper, "speecht5": check_speecht5,
                                         "embed": check_embed, "rerank": check_rerank,
                                         "llama-draft": check_llama_draft, "llama-lora": check_llama_lora,
                                         "sd-lora": check_sd_lora, "ltx": check_ltx}


def main(argv: list[str]) -> int:
    names = argv or list(CHECKS)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        log(f"unknown model(s) {unknown}; choose from {list(CHECKS)}")
        return 2
    failed = []
    for name in names:
        started = time.monotonic()
        try:
            CHECKS[name]()
        except Exception:  # noqa: BLE001 - report every failure, then exit non-zero
            traceback.print_exc()
            failed.append(name)
            log(f"{name}: FAILED")
        else:
            log(f"{name}: ok in {time.monotonic() - started:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
