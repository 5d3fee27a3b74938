"""Build tiny random-weight test models offline and export them to OpenVINO IR.

Five models are produced next to this script, each a directory that the
OpenVINO GenAI pipelines load directly:

* ``tiny-llama``  - LlamaForCausalLM (2 layers, hidden 64) with a byte-level BPE
  vocabulary trained here on built-in English text and a ChatML chat template.
  For ``LLMPipeline`` and ``ContinuousBatchingPipeline``.
* ``tiny-llava``  - LlavaForConditionalGeneration (CLIP vision tower, 30 px
  images, 6 px patches = 25 image tokens; the tiny Llama as language model;
  ``<image>`` special token). For ``VLMPipeline`` and
  ``ContinuousBatchingPipeline.add_request(..., images=[...])``.
* ``tiny-sd``     - Stable Diffusion 1.5 layout (hand-made CLIP vocabulary,
  UNet / VAE with block widths (32, 64), DDIM scheduler). For
  ``Text2ImagePipeline``, ``Image2ImagePipeline`` and ``InpaintingPipeline``.
* ``tiny-embed``  - BertModel (2 layers, hidden 32) with a hand-made WordPiece
  vocabulary, exported for ``feature-extraction``. For ``TextEmbeddingPipeline``.
* ``tiny-rerank`` - BertForSequenceClassification (one logit, same vocabulary),
  exported for ``text-classification``. For ``TextRerankPipeline``.
* ``tiny-ltx``    - LTX-Video layout (a T5 encoder with a SentencePiece vocabulary
  trained here, a 1-layer video transformer, an 8-channel video VAE), exported
  for ``text-to-video``. For ``Text2VideoPipeline``.

Weights are random with fixed seeds; nothing is downloaded (``HF_HUB_OFFLINE=1``).

The script needs torch, transformers, diffusers and optimum-intel, which the
project's own environment does not have. Build a throw-away venv first::

    python3 -m venv /tmp/ovq-builder-venv
    /tmp/ovq-builder-venv/bin/pip install "torch==2.13.0" "torchvision==0.28.0" \\
        "optimum-intel[openvino]" diffusers transformers tokenizers sentencepiece protobuf \\
        "openvino==2026.4.1" "openvino-tokenizers==2026.4.1.0" "openvino-genai==2026.4.1.0"
    /tmp/ovq-builder-venv/bin/pip uninstall -y torchvision

(The torch pin keeps pip from pulling the multi-GB CUDA build; PyPI's torchvision
is a CUDA build that breaks ``transformers`` beside the CPU torch, hence the
uninstall. The openvino pins must match the runtime that loads the models.)

Then::

    /tmp/ovq-builder-venv/bin/python tests/models/build_tiny_models.py            # all of them
    /tmp/ovq-builder-venv/bin/python tests/models/build_tiny_models.py --only sd  # one of them

``--only llama-draft`` and ``--only llama-lora`` build the tiny Llama's draft model and LoRA adapter (the
adapter needs ``peft`` in the venv: ``/tmp/ovq-builder-venv/bin/pip install peft``); ``--only sd-lora`` a LoRA
adapter for tiny-sd's UNet.

Check the result with the project's own interpreter:
``python3 tests/models/check_tiny_models.py``.
"""

from __future__ import annotations

import os

# Must be set before transformers / huggingface_hub / diffusers are imported.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["DO_NOT_TRACK"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

MODELS_DIR = Path(__file__).resolve().parent
SEED = 1234

# Special tokens of the tiny Llama / LLaVA vocabulary (ids in this order, from 0).
PAD_TOKEN = "<|endoftext|>"
BOS_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
IMAGE_TOKEN = "<image>"

LLM_VOCAB_SIZE = 512
MAX_POSITION_EMBEDDINGS = 2048

# ChatML. Message content may be a plain string (what openvino_genai passes; image
# tags are already in it) or an OpenAI/HF-style list of {"type": "text"|"image"} parts.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}{{- '<image>\\n' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# Built-in English training text for the BPE vocabulary (no downloads).
CORPUS = """\
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins
with a single step. What is the capital of France? The capital of France is Paris.
Hello! How are you today? I am fine, thank you. Please tell me a short story about
a cat, a dog and a little red bird who lived in a small house near the river.
Once upon a time there was a king who had three daughters. The youngest was the
most beautiful, and the sun itself was astonished whenever it shone on her face.
The weather is nice and the sky is blue. It may rain tomorrow, so take an umbrella.
Computers process numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000. Python is a programming
language. The server answers requests from a queue, one token at a time.
Describe this image. The picture shows a green field, a white cloud and a yellow sun.
You are a helpful assistant. Answer the question briefly and politely.
Beautiful is better than ugly. Explicit is better than implicit. Simple is better
than complex. Readability counts. Errors should never pass silently.
"""

# Words that get whole-word merges in the hand-made CLIP vocabulary of tiny-sd.
SD_WORDS = (
    "a", "an", "the", "of", "in", "on", "and", "with", "photo", "picture", "painting",
    "cat", "dog", "red", "blue", "green", "white", "black", "house", "tree", "sky",
    "sun", "river", "mountain", "beautiful", "small", "big", "astronaut", "horse",
)


# --------------------------------------------------------------------------- helpers


def log(message: str) -> None:
    print(f"[build_tiny_models] {message}", flush=True)


def seed_everything(seed: int = SEED) -> None:
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def optimum_export(checkpoint: Path, output: Path, task: str) -> None:
    """Run ``optimum-cli export openvino`` (fp16 weights) from this interpreter's venv."""
    cli = Path(sys.executable).parent / "optimum-cli"
    command = [
        str(cli), "export", "openvino",
        "--model", str(checkpoint),
        "--task", task,
        "--weight-format", "fp16",
        str(output),
    ]
    log("running: " + " ".join(command))
    subprocess.run(command, check=True, env=os.environ.copy())


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def prune(output: Path, keep: Callable[[Path], bool]) -> None:
    """Delete every file below ``output`` for which ``keep`` is false."""
    for file in sorted(output.rglob("*")):
        if file.is_file() and not keep(file.relative_to(output)):
            file.unlink()


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def drop_checkpoint_paths(output: Path) -> None:
    """Remove ``_name_or_path`` (the temporary checkpoint path) from exported JSON
    configs, so rebuilds are byte-identical."""
    for path in sorted(output.rglob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict) and "_name_or_path" in data:
            del data["_name_or_path"]
            path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def put_chat_template_in_tokenizer_config(output: Path, template: str) -> None:
    """Keep the template in tokenizer_config.json (transformers 5 writes chat_template.jinja)."""
    config_path = output / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["chat_template"] = template
    write_json(config_path, config)
    (output / "chat_template.jinja").unlink(missing_ok=True)


# --------------------------------------------------------------------- tokenizers


def train_bpe_tokenizer(special_tokens: list[str]):
    """Train a byte-level BPE vocabulary on CORPUS and wrap it as a HF fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=LLM_VOCAB_SIZE,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS.splitlines(), trainer=trainer)

    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=None,
        model_max_length=MAX_POSITION_EMBEDDINGS,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def byte_symbols() -> dict[int, str]:
    """GPT-2 / CLIP byte-to-unicode table: every byte maps to a printable character."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return dict(sorted(table.items()))


def clip_vocab_and_merges(words: Iterable[str]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Hand-made CLIP vocabulary: all byte symbols (plain and with ``</w>``) plus
    left-to-right merges that make each of ``words`` a single token."""
    symbols = list(byte_symbols().values())
    vocab_list = symbols + [s + "</w>" for s in symbols]
    merges: list[tuple[str, str]] = []
    for word in words:
        parts = list(word[:-1]) + [word[-1] + "</w>"]
        current = parts[0]
        for part in parts[1:]:
            merge = (current, part)
            current += part
            if merge not in merges:
                merges.append(merge)
                vocab_list.append(current)
    vocab_list += ["<|startoftext|>", "<|endoftext|>"]
    vocab = {token: index for index, token in enumerate(dict.fromkeys(vocab_list))}
    return vocab, merges


# ------------------------------------------------------------------------- models


def tiny_llama_config(vocab_size: int, tokenizer):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        rope_theta=10000.0,
        # Untied, so greedy decoding does not just repeat the last token.
        tie_word_embeddings=False,
        bos_token_id=tokenizer.convert_tokens_to_ids(BOS_TOKEN),
        eos_token_id=tokenizer.convert_tokens_to_ids(EOS_TOKEN),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN),
    )


def generation_config_for(tokenizer):
    from transformers import GenerationConfig

    return GenerationConfig(
        bos_token_id=tokenizer.convert_tokens_to_ids(BOS_TOKEN),
        eos_token_id=tokenizer.convert_tokens_to_ids(EOS_TOKEN),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN),
        max_new_tokens=32,
    )


def suppress_unprintable_tokens(model, tokenizer) -> None:
    """Zero the output-projection rows of special tokens and of tokens that do not
    decode to printable ASCII, so that a random model's greedy text is readable and
    runs to ``max_new_tokens`` (their logit is exactly 0, below the max of the rest)."""
    import torch

    def printable(token_id: int) -> bool:
        text = tokenizer.decode([token_id])
        return bool(text) and text.isascii() and text.isprintable()

    unwanted = [i for i in range(len(tokenizer)) if i in tokenizer.all_special_ids or not printable(i)]
    with torch.no_grad():
        model.get_output_embeddings().weight[unwanted] = 0.0


LLM_KEEP = {
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "openvino_tokenizer.xml", "openvino_tokenizer.bin",
    "openvino_detokenizer.xml", "openvino_detokenizer.bin",
}


def build_llama(output: Path, workdir: Path) -> None:
    """Tiny Llama causal LM -> ``text-generation-with-past`` IR."""
    from transformers import LlamaForCausalLM

    seed_everything()
    tokenizer = train_bpe_tokenizer([PAD_TOKEN, BOS_TOKEN, EOS_TOKEN])
    config = tiny_llama_config(len(tokenizer), tokenizer)
    model = LlamaForCausalLM(config).eval()
    suppress_unprintable_tokens(model, tokenizer)
    model.generation_config = generation_config_for(tokenizer)

    checkpoint = workdir / "tiny-llama-torch"
    model.save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    optimum_export(checkpoint, output, "text-generation-with-past")

    put_chat_template_in_tokenizer_config(output, CHAT_TEMPLATE)
    prune(output, lambda rel: str(rel) in LLM_KEEP or str(rel).startswith("openvino_model."))


def build_llava(output: Path, workdir: Path) -> None:
    """Tiny LLaVA (CLIP vision tower + tiny Llama) -> ``image-text-to-text`` IR."""
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    image_size, patch_size = 30, 6
    seed_everything()
    tokenizer = train_bpe_tokenizer([PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, IMAGE_TOKEN])
    image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)

    vision_config = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=image_size,
        patch_size=patch_size,
        projection_dim=32,
    )
    config = LlavaConfig(
        vision_config=vision_config,
        text_config=tiny_llama_config(len(tokenizer), tokenizer),
        image_token_index=image_token_id,
        image_seq_length=(image_size // patch_size) ** 2,
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
    )
    model = LlavaForConditionalGeneration(config).eval()
    suppress_unprintable_tokens(model, tokenizer)
    model.generation_config = generation_config_for(tokenizer)

    image_processor = CLIPImageProcessor(
        size={"shortest_edge": image_size},
        crop_size={"height": image_size, "width": image_size},
        do_resize=True,
        do_center_crop=True,
        do_normalize=True,
        do_convert_rgb=True,
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=patch_size,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        image_token=IMAGE_TOKEN,
        chat_template=CHAT_TEMPLATE,
    )

    checkpoint = workdir / "tiny-llava-torch"
    model.save_pretrained(checkpoint)
    processor.save_pretrained(checkpoint)
    optimum_export(checkpoint, output, "image-text-to-text")

    # openvino_genai reads a flat preprocessor_config.json; transformers 5 nests the
    # image settings inside processor_config.json instead.
    image_processor.save_pretrained(output)
    put_chat_template_in_tokenizer_config(output, CHAT_TEMPLATE)
    keep = LLM_KEEP | {"preprocessor_config.json"}
    prune(output, lambda rel: str(rel) in keep or str(rel).startswith("openvino_"))


def build_sd(output: Path, workdir: Path) -> None:
    """Tiny Stable Diffusion 1.5 layout -> ``text-to-image`` IR."""
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    vocab, merges = clip_vocab_and_merges(SD_WORDS)
    tokenizer = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=77)

    seed_everything()
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(vocab),
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=77,
            projection_dim=32,
            bos_token_id=vocab["<|startoftext|>"],
            eos_token_id=vocab["<|endoftext|>"],
            pad_token_id=vocab["<|endoftext|>"],
        )
    ).eval()
    unet = UNet2DConditionModel(
        sample_size=32,
        in_channels=4,
        out_channels=4,
        block_out_channels=(32, 64),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=32,
    ).eval()
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        block_out_channels=(32, 64),
        layers_per_block=1,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        norm_num_groups=32,
        sample_size=64,
    ).eval()
    scheduler = DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )
    pipeline = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )

    checkpoint = workdir / "tiny-sd-torch"
    pipeline.save_pretrained(checkpoint)
    optimum_export(checkpoint, output, "text-to-image")

    def keep(rel: Path) -> bool:
        name = rel.name
        if len(rel.parts) == 1:
            return name == "model_index.json"
        if rel.parts[0] == "tokenizer":
            return name.startswith("openvino_") or name in {
                "vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json",
                "tokenizer.json",
            }
        return name.startswith("openvino_") or name in {"config.json", "scheduler_config.json"}

    prune(output, keep)


# ------------------------------------------------------------------------- video


def t5_tokenizer(workdir: Path):
    """A unigram SentencePiece model trained on CORPUS, with T5's ids for <pad>, </s>, <unk>."""
    import sentencepiece as spm
    from transformers import T5Tokenizer

    prefix = workdir / "spiece"
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS.splitlines()), model_prefix=str(prefix), model_type="unigram",
        vocab_size=180, pad_id=0, eos_id=1, unk_id=2, bos_id=-1, character_coverage=1.0, minloglevel=2,
        num_threads=1,
    )
    return T5Tokenizer(vocab_file=f"{prefix}.model", extra_ids=0, model_max_length=128)


def build_ltx(output: Path, workdir: Path) -> None:
    """Tiny LTX-Video (a 1-layer T5 encoder, a 1-layer video transformer, an 8-channel causal video VAE; diffusers'
    own test sizes) -> ``text-to-video`` IR, for ``Text2VideoPipeline``."""
    from diffusers import (AutoencoderKLLTXVideo, FlowMatchEulerDiscreteScheduler, LTXPipeline,
                           LTXVideoTransformer3DModel)
    from transformers import T5Config, T5EncoderModel

    seed_everything()
    tokenizer = t5_tokenizer(workdir)
    text_encoder = T5EncoderModel(T5Config(
        vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=37, num_layers=1, num_heads=4,
        relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)).eval()
    transformer = LTXVideoTransformer3DModel(
        in_channels=8, out_channels=8, patch_size=1, patch_size_t=1, num_attention_heads=4, attention_head_dim=8,
        cross_attention_dim=32, num_layers=1, caption_channels=32).eval()
    flat = (False, False, False, False)
    vae = AutoencoderKLLTXVideo(
        in_channels=3, out_channels=3, latent_channels=8, block_out_channels=(8, 8, 8, 8),
        decoder_block_out_channels=(8, 8, 8, 8), layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1, 1), spatio_temporal_scaling=(True, True, False, False),
        decoder_spatio_temporal_scaling=(True, True, False, False), decoder_inject_noise=(*flat, False),
        upsample_residual=flat, upsample_factor=(1, 1, 1, 1), timestep_conditioning=False, patch_size=1,
        patch_size_t=1, encoder_causal=True, decoder_causal=False).eval()
    pipeline = LTXPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=text_encoder,
                           tokenizer=tokenizer, transformer=transformer)
    checkpoint = workdir / "tiny-ltx-torch"
    pipeline.save_pretrained(checkpoint)
    optimum_export(checkpoint, output, "text-to-video")

    def keep(rel: Path) -> bool:
        if len(rel.parts) == 1:
            return rel.name == "model_index.json"
        return rel.name.startswith("openvino_") or rel.name in {
            "config.json", "scheduler_config.json", "tokenizer_config.json", "tokenizer.json"}

    prune(output, keep)


# ------------------------------------------------------------------------ speech

WHISPER_LANGUAGES = ("en", "de", "fr", "es")
WHISPER_TIMESTAMPS = 1501  # <|0.00|> .. <|30.00|> in 0.02 s steps, as every Whisper has


def whisper_tokenizer():
    """Byte-level BPE on CORPUS plus Whisper's special tokens in Whisper's order (end of text, start of
    transcript, languages, tasks, start of LM / previous, no speech, no timestamps, then the timestamps)."""
    from tokenizers import Tokenizer, pre_tokenizers, trainers
    from tokenizers import models as tk_models
    from transformers import WhisperTokenizerFast

    bpe = Tokenizer(tk_models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=LLM_VOCAB_SIZE, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator(CORPUS.splitlines(), trainer=trainer)
    vocab = bpe.get_vocab()
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tokenizer = WhisperTokenizerFast(vocab=dict(sorted(vocab.items(), key=lambda kv: kv[1])), merges=merges,
                                     model_max_length=448)
    specials = ["<|endoftext|>", "<|startoftranscript|>", *[f"<|{lang}|>" for lang in WHISPER_LANGUAGES],
                "<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>",
                "<|notimestamps|>"]
    tokenizer.add_special_tokens({"additional_special_tokens": specials}, replace_extra_special_tokens=False)
    tokenizer.add_tokens([f"<|{i * 0.02:.2f}|>" for i in range(WHISPER_TIMESTAMPS)])
    return tokenizer


def build_whisper(output: Path, workdir: Path) -> None:
    """Tiny Whisper (1 encoder and 1 decoder layer, d_model 32, 80 mel bins, 30 s windows) with a byte-level BPE
    vocabulary and Whisper's special tokens -> ``automatic-speech-recognition-with-past`` IR."""
    from transformers import (GenerationConfig, WhisperConfig, WhisperFeatureExtractor,
                              WhisperForConditionalGeneration, WhisperProcessor)

    seed_everything()
    tokenizer = whisper_tokenizer()
    ids = tokenizer.convert_tokens_to_ids
    eot, sot, no_ts = ids("<|endoftext|>"), ids("<|startoftranscript|>"), ids("<|notimestamps|>")
    config = WhisperConfig(
        vocab_size=len(tokenizer), num_mel_bins=80, d_model=32, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_source_positions=1500, max_target_positions=448, decoder_start_token_id=sot, pad_token_id=eot,
        bos_token_id=eot, eos_token_id=eot, begin_suppress_tokens=[eot], suppress_tokens=[],
    )
    model = WhisperForConditionalGeneration(config).eval()
    suppress_whisper_specials(model, tokenizer)
    model.generation_config = GenerationConfig(
        decoder_start_token_id=sot, bos_token_id=eot, eos_token_id=eot, pad_token_id=eot,
        no_timestamps_token_id=no_ts, prev_sot_token_id=ids("<|startofprev|>"), is_multilingual=True,
        lang_to_id={f"<|{lang}|>": ids(f"<|{lang}|>") for lang in WHISPER_LANGUAGES},
        task_to_id={"transcribe": ids("<|transcribe|>"), "translate": ids("<|translate|>")},
        begin_suppress_tokens=[eot], suppress_tokens=[], max_initial_timestamp_index=50, max_length=448,
        max_new_tokens=WHISPER_MAX_NEW_TOKENS, alignment_heads=[[0, 0]],
    )
    processor = WhisperProcessor(WhisperFeatureExtractor(feature_size=80), tokenizer)

    checkpoint = workdir / "tiny-whisper-torch"
    model.save_pretrained(checkpoint)
    processor.save_pretrained(checkpoint)
    optimum_export(checkpoint, output, "automatic-speech-recognition-with-past")
    prune(output, lambda rel: rel.name.startswith("openvino_") or rel.name in WHISPER_KEEP)



def suppress_whisper_specials(model, tokenizer) -> None:
    """Zero the (tied) embedding rows of the special tokens and of unprintable text tokens, timestamps kept:
    a random Whisper then writes readable text up to max_new_tokens instead of ending at once."""
    import torch

    def printable(token_id: int) -> bool:
        text = tokenizer.decode([token_id])
        return bool(text) and text.isascii() and text.isprintable()

    timestamps = set(tokenizer.convert_tokens_to_ids([f"<|{i * 0.02:.2f}|>" for i in range(WHISPER_TIMESTAMPS)]))
    unwanted = [i for i in range(len(tokenizer))
                if i not in timestamps and (i in tokenizer.all_special_ids or not printable(i))]
    with torch.no_grad():
        model.get_output_embeddings().weight[unwanted] = 0.0


WHISPER_MAX_NEW_TOKENS = 24  # a random model seldom ends on its own: keep each window's text short
WHISPER_KEEP = {"config.json", "generation_config.json", "preprocessor_config.json", "tokenizer_config.json",
                "special_tokens_map.json", "added_tokens.json"}


def speecht5_tokenizer(workdir: Path):
    """A character-level SentencePiece model trained on CORPUS, with SpeechT5's ids for <s>, <pad>, </s>, <unk>."""
    import sentencepiece as spm
    from transformers import SpeechT5Tokenizer

    prefix = workdir / "spm_char"
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS.splitlines()), model_prefix=str(prefix), model_type="char",
        vocab_size=len(set(CORPUS.replace("\n", ""))) + 4, bos_id=0, pad_id=1, eos_id=2, unk_id=3,
        character_coverage=1.0, minloglevel=2, num_threads=1, normalization_rule_name="identity",
    )
    # The model records where it was trained (a temporary directory): name it plainly, for byte-identical rebuilds.
    from sentencepiece import sentencepiece_model_pb2

    model_file = Path(f"{prefix}.model")
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model_file.read_bytes())
    proto.trainer_spec.model_prefix = "spm_char"
    model_file.write_bytes(proto.SerializeToString())
    return SpeechT5Tokenizer(vocab_file=str(model_file))


def build_speecht5(output: Path, workdir: Path) -> None:
    """Tiny SpeechT5 text-to-speech (1 encoder and 1 decoder layer, hidden 32, 80 mel bins, 512-wide speaker
    embeddings as the pipeline's built-in default voice) with a tiny HiFi-GAN vocoder -> ``text-to-audio`` IR."""
    import torch
    from transformers import SpeechT5Config, SpeechT5ForTextToSpeech, SpeechT5HifiGan, SpeechT5HifiGanConfig

    seed_everything()
    tokenizer = speecht5_tokenizer(workdir)
    config = SpeechT5Config(
        vocab_size=len(tokenizer), hidden_size=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, speech_decoder_prenet_units=32,
        speech_decoder_postnet_units=32, speech_decoder_postnet_layers=2, max_speech_positions=600,
        max_text_positions=450, encoder_max_relative_position=16, speaker_embedding_dim=512,
    )
    model = SpeechT5ForTextToSpeech(config).eval()
    vocoder = SpeechT5HifiGan(SpeechT5HifiGanConfig(
        upsample_initial_channel=32, resblock_kernel_sizes=[3], resblock_dilation_sizes=[[1, 3]],
    )).eval()
    with torch.no_grad():
        # The stop head never fires: speech lasts maxlenratio (20) frames per input token, the same every time.
        model.speech_decoder_postnet.prob_out.bias.fill_(-20.0)
        # Random HiFi-GAN weights give samples near 1e-9; scaled up, the waveform survives 16-bit PCM.
        vocoder.conv_post.weight.mul_(1e7)

    checkpoint, vocoder_dir = workdir / "tiny-speecht5-torch", workdir / "tiny-hifigan-torch"
    model.save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    vocoder.save_pretrained(vocoder_dir)
    cli = Path(sys.executable).parent / "optimum-cli"
    command = [str(cli), "export", "openvino", "--model", str(checkpoint), "--task", "text-to-audio",
               "--weight-format", "fp16", "--model-kwargs", json.dumps({"vocoder": str(vocoder_dir)}), str(output)]
    log("running: " + " ".join(command))
    subprocess.run(command, check=True, env=os.environ.copy())
    prune(output, lambda rel: rel.name.startswith("openvino_") or rel.name in SPEECHT5_KEEP)
    write_voice(output / SPEECHT5_VOICE)


def write_voice(path: Path) -> None:
    """A speaker embedding as OVMS's `voices` option reads one: 512 raw little-endian float32."""
    import numpy as np

    np.random.default_rng(SEED).standard_normal(512).astype("<f4").tofile(path)


SPEECHT5_VOICE = "voice-a.bin"
SPEECHT5_KEEP = {"config.json", "generation_config.json", "tokenizer_config.json", "special_tokens_map.json",
                 "spm_char.model", "added_tokens.json"}
# ------------------------------------------------------------ embedding / rerank

BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
BERT_MAX_POSITIONS = 128


def bert_tokenizer():
    """A hand-made WordPiece vocabulary (CORPUS's lower-case words whole, plus every ASCII character alone and as a
    ``##`` continuation, so any English text tokenizes), loaded as BERT's own fast tokenizer (``[CLS] ... [SEP]``,
    pairs as ``[CLS] a [SEP] b [SEP]``). Hand-made, not trained: WordPiece training breaks ties differently from
    run to run, and rebuilds must be byte-identical."""
    import re

    from transformers import BertTokenizerFast

    characters = [chr(c) for c in range(33, 127) if not chr(c).isupper()]
    words = sorted(set(re.findall(r"[a-z0-9]+", CORPUS.lower())) - set(characters))
    tokens = BERT_SPECIALS + characters + [f"##{c}" for c in characters if c.isalnum()] + words
    vocab = {token: index for index, token in enumerate(tokens)}
    return BertTokenizerFast(vocab=vocab, do_lower_case=True, model_max_length=BERT_MAX_POSITIONS)


def tiny_bert_config(tokenizer, **extra):
    from transformers import BertConfig

    return BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=BERT_MAX_POSITIONS,
                      pad_token_id=tokenizer.pad_token_id, **extra)


BERT_KEEP = {"config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json",
             "openvino_tokenizer.xml", "openvino_tokenizer.bin", "openvino_detokenizer.xml",
             "openvino_detokenizer.bin", "openvino_model.xml", "openvino_model.bin"}


def build_embed(output: Path, workdir: Path) -> None:
    """Tiny BERT encoder -> ``feature-extraction`` IR (for TextEmbeddingPipeline: CLS or mean pooling)."""
    from transformers import BertModel

    seed_everything()
    tokenizer = bert_tokenizer()
    model = BertModel(tiny_bert_config(tokenizer), add_pooling_layer=False).eval()
    checkpoint = workdir / "tiny-embed-torch"
    model.save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    optimum_export(checkpoint, output, "feature-extraction")
    prune(output, lambda rel: str(rel) in BERT_KEEP)


def build_embed_minilm(output: Path, workdir: Path) -> None:
    """Not tiny, not committed: BertModel in all-MiniLM-L6-v2's shape (6 layers, hidden 384, 12 heads, 22M
    parameters; the tiny vocabulary), random weights, for benchmarks/embeddings.py, where a pipeline call must cost
    what a real embedder's does. Build it elsewhere: ``--only embed-minilm --output-dir /tmp/ovq-bench-models``."""
    from transformers import BertConfig, BertModel

    seed_everything()
    tokenizer = bert_tokenizer()
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                        intermediate_size=1536, max_position_embeddings=512, pad_token_id=tokenizer.pad_token_id)
    model = BertModel(config, add_pooling_layer=False).eval()
    checkpoint = workdir / "embed-minilm-torch"
    model.save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    optimum_export(checkpoint, output, "feature-extraction")
    prune(output, lambda rel: str(rel) in BERT_KEEP)


def build_rerank(output: Path, workdir: Path) -> None:
    """Tiny BERT cross-encoder (one logit per query/document pair) -> ``text-classification`` IR (for
    TextRerankPipeline)."""
    import torch
    from transformers import BertForSequenceClassification

    seed_everything()
    tokenizer = bert_tokenizer()
    model = BertForSequenceClassification(tiny_bert_config(tokenizer, num_labels=1)).eval()
    with torch.no_grad():  # spread the random scores, so that their order is not decided by rounding
        model.classifier.weight *= 100.0
    checkpoint = workdir / "tiny-rerank-torch"
    model.save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    optimum_export(checkpoint, output, "text-classification")
    prune(output, lambda rel: str(rel) in BERT_KEEP)
def tiny_llama_torch():
    """The tiny Llama's tokenizer and torch model, as `build_llama` makes them (same seed, same weights)."""
    from transformers import LlamaForCausalLM

    seed_everything()
    tokenizer = train_bpe_tokenizer([PAD_TOKEN, BOS_TOKEN, EOS_TOKEN])
    model = LlamaForCausalLM(tiny_llama_config(len(tokenizer), tokenizer)).eval()
    suppress_unprintable_tokens(model, tokenizer)
    model.generation_config = generation_config_for(tokenizer)
    return tokenizer, model


def build_llama_draft(output: Path, workdir: Path) -> None:
    """A draft model for the tiny Llama (speculative decoding): its first layer only, with its embeddings and
    output head, so it agrees with the tiny Llama on some tokens and not on others; same tokenizer."""
    import torch

    tokenizer, model = tiny_llama_torch()
    with torch.no_grad():
        model.model.layers = model.model.layers[:1]
        model.config.num_hidden_layers = 1
    checkpoint = workdir / "tiny-llama-draft-torch"
    model.save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    optimum_export(checkpoint, output, "text-generation-with-past")
    put_chat_template_in_tokenizer_config(output, CHAT_TEMPLATE)
    prune(output, lambda rel: str(rel) in LLM_KEEP or str(rel).startswith("openvino_model."))


LORA_RANK = 4


def build_llama_lora(output: Path, workdir: Path) -> None:
    """A LoRA adapter for the tiny Llama (peft, safetensors): rank 4 on the attention projections, both
    matrices random (peft's default zero B would change nothing), large enough to change greedy text."""
    import torch
    from peft import LoraConfig, get_peft_model

    _, model = tiny_llama_torch()
    config = LoraConfig(r=LORA_RANK, lora_alpha=2 * LORA_RANK, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                        init_lora_weights=False, lora_dropout=0.0)
    torch.manual_seed(SEED + 1)
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for name, weight in peft_model.named_parameters():
            if "lora_" in name:
                weight.copy_(torch.randn_like(weight) * 0.5)
    peft_model.save_pretrained(output, safe_serialization=True)
    config_path = output / "adapter_config.json"
    adapter_config = json.loads(config_path.read_text(encoding="utf-8"))
    adapter_config["base_model_name_or_path"] = "tiny-llama"  # not the temporary checkpoint's path
    write_json(config_path, adapter_config)
    prune(output, lambda rel: str(rel) in ("adapter_model.safetensors", "adapter_config.json"))


def build_sd_lora(output: Path, workdir: Path) -> None:
    """A LoRA adapter for tiny-sd's UNet: rank 4 on the attention projections, random both ways, in the kohya
    naming (``lora_unet_..._to_q.lora_down.weight``, float32 ``alpha``) that GenAI's image pipelines read: they
    leave peft/diffusers names (``unet....lora_A.weight``) unused."""
    import torch
    from diffusers import UNet2DConditionModel
    from diffusers.utils import convert_state_dict_to_kohya
    from peft import LoraConfig, get_peft_model_state_dict
    from safetensors.torch import save_file

    seed_everything(SEED + 2)
    unet = UNet2DConditionModel(  # tiny-sd's UNet layout: the adapter's names and shapes must match it
        sample_size=32, in_channels=4, out_channels=4, block_out_channels=(32, 64), layers_per_block=1,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=32,
    ).eval()
    unet.add_adapter(LoraConfig(r=LORA_RANK, lora_alpha=LORA_RANK, init_lora_weights=False,
                                target_modules=["to_q", "to_k", "to_v", "to_out.0"]))
    with torch.no_grad():
        for name, weight in unet.named_parameters():
            if "lora_" in name:
                weight.copy_(torch.randn_like(weight) * 0.1)  # enough to change the image, not to saturate it
    state = get_peft_model_state_dict(unet)
    kohya = convert_state_dict_to_kohya({f"unet.{name}": weight for name, weight in state.items()})
    output.mkdir(parents=True, exist_ok=True)
    save_file({name: torch.as_tensor(value, dtype=torch.float32).contiguous() for name, value in kohya.items()},
              output / "tiny_sd_lora.safetensors")


BUILDERS: dict[str, Callable[[Path, Path], None]] = {
    "llama": build_llama,
    "llava": build_llava,
    "sd": build_sd,
    "whisper": build_whisper,
    "speecht5": build_speecht5,
    "embed": build_embed,
    "rerank": build_rerank,
    "ltx": build_ltx,
    "embed-minilm": build_embed_minilm,
}
BUILDERS["llama-draft"] = build_llama_draft
BUILDERS["llama-lora"] = build_llama_lora
# Built only when asked for by name (`--only`): too big for the repository.
NOT_BY_DEFAULT = {"embed-minilm"}
BUILDERS["sd-lora"] = build_sd_lora


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=sorted(BUILDERS), help="build just one model")
    parser.add_argument("--output-dir", type=Path, default=MODELS_DIR,
                        help="where tiny-llama/, tiny-llava/ and tiny-sd/ go (default: next to this script)")
    args = parser.parse_args(argv)

    names = [args.only] if args.only else [name for name in BUILDERS if name not in NOT_BY_DEFAULT]
    for name in names:
        output = args.output_dir / f"tiny-{name}"
        if output.exists():
            shutil.rmtree(output)
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"ovq-tiny-{name}-") as workdir:
            BUILDERS[name](output, Path(workdir))
        drop_checkpoint_paths(output)
        log(f"{output}: {dir_size(output) / 1024:.0f} KiB in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
