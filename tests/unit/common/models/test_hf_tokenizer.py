"""A GGUF's byte-level BPE tokenizer as Hugging Face's files: the same ids as the model's own tokenizer."""
from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
from tokenizers import Tokenizer, pre_tokenizers

from common.models.hf_tokenizer import write_hf_tokenizer

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
WORDS = ["he", "ll", "hell", "hello", "Ġhello"]
# Text that takes each rule: pre-tokenizer (spaces, digits one by one), merges, special tokens, bytes of UTF-8.
TEXTS = ["Hello world", "  multiple   spaces\n\n\nnewlines\t tab", "12345 digits 3.14", "unicode: café 日本語 🙂",
         "<|im_start|>user\nHi<|im_end|>\n", "don't I'll we've", "a" * 40, "   "]


def tiny_gguf(path: Path, model: str = "gpt2", pre: str = "smollm") -> Path:
    """A GGUF with a tokenizer and no tensors: the 256 byte-level symbols, three control tokens, a few merges."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(2048)
    writer.add_tokenizer_model(model)
    writer.add_tokenizer_pre(pre)
    tokens = [*SPECIAL, *sorted(pre_tokenizers.ByteLevel.alphabet()), *WORDS]
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] * (len(tokens) - 3))
    writer.add_token_merges(["h e", "l l", "he ll", "hell o", "Ġ hello"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template("{{ messages[0]['content'] }}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_merges_control_tokens_and_the_config_come_from_the_gguf(tmp_path: Path) -> None:
    assert write_hf_tokenizer(gguf.GGUFReader(str(tiny_gguf(tmp_path / "t.gguf"))), tmp_path, 2048)
    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    hello, spaced_hello = (tokenizer.token_to_id(w) for w in ("hello", "Ġhello"))
    assert tokenizer.encode("<|im_start|>hello hello1").ids[:3] == [1, hello, spaced_hello]
    assert tokenizer.decode(tokenizer.encode("hello hello 12").ids) == "hello hello 12"
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert [config[f"{role}_token"] for role in ("bos", "eos", "pad")] == ["<|im_start|>", "<|im_end|>", "<|im_end|>"]
    assert config["chat_template"] == "{{ messages[0]['content'] }}" and config["model_max_length"] == 2048
    assert config["added_tokens_decoder"]["2"]["special"] and not config["add_bos_token"]


@pytest.mark.parametrize(("model", "pre"), [("llama", "default"), ("gpt2", "qwen2")])
def test_a_tokenizer_it_cannot_write_exactly_gets_no_files(tmp_path: Path, model: str, pre: str) -> None:
    assert not write_hf_tokenizer(gguf.GGUFReader(str(tiny_gguf(tmp_path / "t.gguf", model, pre))), tmp_path)
    assert not (tmp_path / "tokenizer.json").exists() and not (tmp_path / "tokenizer_config.json").exists()


def test_the_default_models_tokenizer_json_encodes_as_its_openvino_tokenizer(model_dir: Path) -> None:
    import openvino_genai

    ours = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    openvino = openvino_genai.Tokenizer(str(model_dir))
    for text in TEXTS:
        expected = openvino.encode(text, add_special_tokens=False).input_ids.data[0].tolist()
        assert ours.encode(text, add_special_tokens=False).ids == expected, text
        assert ours.decode(expected, skip_special_tokens=False) == text
