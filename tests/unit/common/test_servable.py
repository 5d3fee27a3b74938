from __future__ import annotations

import json
from pathlib import Path

from common import servable
from common.servable import ServableType, infer_servable

MODELS = Path(__file__).resolve().parents[2] / "models"


def test_servable_type_from_directory_and_device(tmp_path: Path) -> None:
    assert infer_servable(MODELS / "tiny-llama", "CPU") is ServableType.LM_CB
    assert infer_servable(MODELS / "tiny-llama", "NPU") is ServableType.LM
    assert infer_servable(MODELS / "tiny-llava", "GPU") is ServableType.VLM_CB
    assert infer_servable(MODELS / "tiny-llava", "NPU") is ServableType.VLM
    assert infer_servable(MODELS / "tiny-sd", "CPU") is ServableType.IMAGE
    assert infer_servable(MODELS / "tiny-llama", "CPU", "LM") is ServableType.LM


def test_chat_template_precedence(tmp_path: Path) -> None:
    assert servable.chat_template(tmp_path) == servable.DEFAULT_CHAT_TEMPLATE
    assert servable.chat_template(tmp_path, "from-tokenizer") == "from-tokenizer"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "from-config"}))
    assert servable.chat_template(tmp_path, "from-tokenizer") == "from-config"
    (tmp_path / "template.jinja").write_text("from-template")
    assert servable.chat_template(tmp_path) == "from-template"
    (tmp_path / "chat_template.jinja").write_text("from-chat-template")
    assert servable.chat_template(tmp_path) == "from-chat-template"


def test_special_tokens_from_tokenizer_config(tmp_path: Path) -> None:
    assert servable.special_tokens(tmp_path, "<b>", "<e>") == ("<b>", "<e>")
    config = {"bos_token": {"content": "<s>"}, "eos_token": "</s>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert servable.special_tokens(tmp_path) == ("<s>", "</s>")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    assert servable.special_tokens(tmp_path, "<b>") == ("", "</s>")


def test_limits_and_defaults(tmp_path: Path) -> None:
    assert servable.context_length(tmp_path) == 2048
    assert servable.context_length(MODELS / "tiny-llama") == 2048
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 77}}))
    assert servable.context_length(tmp_path) == 77
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": False, "max_new_tokens": 9}))
    assert servable.generation_defaults(tmp_path) == {"max_tokens": 9, "temperature": 0.0}


def test_speech_directories_are_s2t_and_t2s_on_any_device(tmp_path: Path) -> None:
    for device in ("CPU", "NPU"):
        assert infer_servable(MODELS / "tiny-whisper", device) is ServableType.S2T
        assert infer_servable(MODELS / "tiny-speecht5", device) is ServableType.T2S
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "kokoro"}))
    assert servable.speech_servable(tmp_path) is ServableType.T2S
    assert servable.speech_servable(MODELS / "tiny-llama") is None


def test_whisper_languages_in_generation_config_order() -> None:
    assert servable.whisper_languages(MODELS / "tiny-whisper") == ["de", "en", "es", "fr"]
    assert servable.whisper_multilingual(MODELS / "tiny-whisper")
    assert servable.whisper_languages(MODELS / "tiny-llama") == []
def test_encoder_servables_from_their_architecture(tmp_path: Path) -> None:
    assert infer_servable(MODELS / "tiny-embed", "CPU") is ServableType.EMBEDDINGS
    assert infer_servable(MODELS / "tiny-rerank", "NPU") is ServableType.RERANK
    # A decoder exported for embeddings says so in the models file; its directory alone reads as a text model.
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    assert infer_servable(tmp_path, "CPU") is ServableType.LM_CB
    assert infer_servable(tmp_path, "CPU", "EMBEDDINGS") is ServableType.EMBEDDINGS
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["XLMRobertaModel"]}))
    assert infer_servable(tmp_path, "CPU") is ServableType.EMBEDDINGS


def test_default_pooling_from_sentence_transformers(tmp_path: Path) -> None:
    assert servable.default_pooling(tmp_path) == "CLS"
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": False,
                                                                    "pooling_mode_mean_tokens": True}))
    assert servable.default_pooling(tmp_path) == "MEAN"
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_lasttoken": True}))
    assert servable.default_pooling(tmp_path) == "LAST"


def test_an_ltx_directory_is_a_video_servable_and_sd_stays_an_image() -> None:
    from common.servable import ServableType, infer_servable
    from tests.conftest import MODELS

    assert infer_servable(MODELS / "tiny-ltx", "CPU") is ServableType.VIDEO
    assert infer_servable(MODELS / "tiny-sd", "CPU") is ServableType.IMAGE
