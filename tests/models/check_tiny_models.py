"""Smoke-check the tiny OpenVINO test models with openvino_genai (no torch needed).

Run with the project's interpreter::

    python3 tests/models/check_tiny_models.py            # all three
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


def check_llama_draft() -> None:
    """The draft drafts for the tiny Llama (speculative decoding) without changing its greedy text."""
    llama, draft = MODELS_DIR / "tiny-llama", MODELS_DIR / "tiny-llama-draft"
    prompt = CHATML_PROMPT.format(content="What is the capital of France?")
    plain = ov_genai.ContinuousBatchingPipeline(str(llama), ov_genai.SchedulerConfig(), DEVICE)
    drafted = ov_genai.ContinuousBatchingPipeline(str(llama), ov_genai.SchedulerConfig(), DEVICE,
                                                  {"draft_model": ov_genai.draft_model(str(draft), DEVICE)})
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


CHECKS: dict[str, Callable[[], None]] = {"llama": check_llama, "llava": check_llava, "sd": check_sd,
                                         "llama-draft": check_llama_draft, "llama-lora": check_llama_lora}


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
