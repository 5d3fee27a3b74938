"""A GGUF's tokenizer as Hugging Face's `tokenizer.json` and `tokenizer_config.json`, so that tools which take a model
directory as their tokenizer (guidellm, lm-eval, transformers) can use a prepared one.

Written only for what it can write exactly: GPT-2-style byte-level BPE (`tokenizer.ggml.model` "gpt2") with a
pre-tokenizer llama.cpp names and we know (`tokenizer.ggml.pre`). Anything else gets no files rather than
a tokenizer that splits text differently from the model's own.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# llama.cpp's pre-tokenizer names -> whether digits are split one by one before GPT-2's byte-level split
# (llama.cpp's "\p{N}" expression, Hugging Face's Digits(individual_digits=True)).
BYTE_LEVEL_PRE = {"default": False, "gpt-2": False, "smollm": True, "starcoder": True, "refact": True}
CONTROL, USER_DEFINED = 3, 4  # gguf.TokenType


def _field(reader: Any, name: str) -> Any:
    field = reader.fields.get(name)
    return None if field is None else field.contents()


def _tokenizer(reader: Any) -> Any | None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    pre = _field(reader, "tokenizer.ggml.pre") or "default"
    if _field(reader, "tokenizer.ggml.model") != "gpt2" or pre not in BYTE_LEVEL_PRE:
        return None
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(merge.split(" ", 1)) for merge in _field(reader, "tokenizer.ggml.merges") or []]
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                               if BYTE_LEVEL_PRE[pre] else byte_level)
    tokenizer.decoder = decoders.ByteLevel()
    post = processors.ByteLevel(trim_offsets=False)
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    if _field(reader, "tokenizer.ggml.add_bos_token") and bos is not None:
        template = processors.TemplateProcessing(single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A $B",
                                                 special_tokens=[(tokens[bos], int(bos))])
        post = processors.Sequence([post, template])
    tokenizer.post_processor = post
    # Control tokens (<|im_start|>) are matched whole in any text, as the model's own tokenizer does.
    tokenizer.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                  for i, kind in enumerate(types) if kind == CONTROL])
    tokenizer.add_tokens([AddedToken(tokens[i], normalized=False) for i, kind in enumerate(types)
                          if kind == USER_DEFINED])
    return tokenizer


def _config(reader: Any, context: int | None) -> dict[str, Any]:
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type") or []
    config: dict[str, Any] = {
        "tokenizer_class": "GPT2Tokenizer",
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token")),
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            str(i): {"content": tokens[i], "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": kind == CONTROL}
            for i, kind in enumerate(types) if kind in (CONTROL, USER_DEFINED)
        },
    }
    for role in ("bos", "eos", "unknown", "padding"):
        index = _field(reader, f"tokenizer.ggml.{role}_token_id")
        if index is not None and 0 <= int(index) < len(tokens):
            name = {"unknown": "unk", "padding": "pad"}.get(role, role)
            config[f"{name}_token"] = tokens[int(index)]
    if context:
        config["model_max_length"] = context
    template = _field(reader, "tokenizer.chat_template")
    if template:
        config["chat_template"] = template
    return config


def write_hf_tokenizer(reader: Any, out: Path, context: int | None = None) -> bool:
    """Write `tokenizer.json` and `tokenizer_config.json` into `out` from a `gguf.GGUFReader`; False (nothing
    written) for a tokenizer this cannot write exactly."""
    tokenizer = _tokenizer(reader)
    if tokenizer is None:
        return False
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(_config(reader, context), indent=2, ensure_ascii=False))
    return True
