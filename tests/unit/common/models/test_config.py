from __future__ import annotations

from pathlib import Path

import pytest

from common.models.config import ModelConfig, parse_size


def test_sampling_defaults_sit_below_the_directory_generation_config() -> None:
    from workers.text.servable_info import ServableInfo

    tiny = Path(__file__).resolve().parents[3] / "models" / "tiny-llama"  # generation_config: max_new_tokens 32
    model = ModelConfig(name="m", path=tiny, sampling_defaults={"temperature": 0.2, "max_tokens": 99})
    info = ServableInfo.load(tiny, model, "CPU")
    assert info.defaults == {"temperature": 0.2, "max_tokens": 32}


def test_sizes_are_width_by_height_and_checked() -> None:
    assert parse_size("512X256") == (512, 256)
    with pytest.raises(ValueError):
        ModelConfig(name="m", path=Path("/x"), max_resolution="512")


def test_draft_scheduler_options_default_to_the_served_models() -> None:
    model = ModelConfig(name="m", path=Path("m"), draft_models_path=Path("d"), max_num_seqs=4, cache_size=2,
                        draft_max_num_batched_tokens=64)
    assert model.draft_scheduler() == {"max_num_batched_tokens": 64, "cache_size": 2, "max_num_seqs": 4,
                                       "dynamic_split_fuse": True, "enable_prefix_caching": False}
    assert ModelConfig(name="m", path=Path("m"), draft_models_path=Path("d"), draft_cache_size=0
                       ).draft_scheduler()["cache_size"] == 0
    with pytest.raises(ValueError, match="draft_device set without draft_models_path"):
        ModelConfig(name="m", path=Path("m"), draft_device="CPU")


def test_lora_adapters_are_named_without_a_colon_and_resolve_against_the_models_file(tmp_path: Path) -> None:
    from common.models.sources import load_models

    config = tmp_path / "models.yaml"
    config.write_text("models:\n  m:\n    path: m\n    lora_adapters: {sql: {path: adapters/sql.safetensors, "
                      "alpha: 0.5}}\n")
    (model,) = load_models(config)
    assert model.lora_adapters["sql"].path == tmp_path / "adapters" / "sql.safetensors"
    assert model.lora_adapters["sql"].alpha == 0.5
    with pytest.raises(ValueError, match="without ':'"):
        ModelConfig(name="m", path=Path("m"), lora_adapters={"a:b": {"path": "x"}})
