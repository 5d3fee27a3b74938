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
