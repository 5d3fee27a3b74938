"""Speculative decoding and LoRA adapters through the queue, on the tiny Llama: a draft model leaves greedy text
as it is; an adapter, selected as `MODEL:ADAPTER` or by its own name, gives GenAI's own adapted text."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai import OpenAI

from tests.conftest import MODELS, Tiers
from tests.precision import F32, at_run_precision, run_precision

DRAFTED, ADAPTED = "tiny-drafted", "tiny-adapted"
LORA = MODELS / "tiny-llama-lora" / "adapter_model.safetensors"
PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def client(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenAI]:
    llama = str(MODELS / "tiny-llama")
    # A draft leaves greedy text as it is at f32 only (pinned: tests/precision.py); adapters compare like with like.
    models = {DRAFTED: {"path": llama, "cache_size": 0, "draft_models_path": str(MODELS / "tiny-llama-draft"),
                        "plugin_config": F32},
              ADAPTED: {"path": llama, "cache_size": 0, "lora_adapters": {"loud": {"path": str(LORA), "alpha": 0.7}},
                        "plugin_config": at_run_precision()}}
    tiers = Tiers(redis_url, tmp_path_factory.mktemp("speclora"), models)
    try:
        tiers.worker(DRAFTED, name="drafted")
        tiers.worker(ADAPTED, name="adapted")
        tiers.api()
        tiers.wait_served(DRAFTED, ADAPTED, timeout=300)
        yield OpenAI(base_url=tiers.base_url, api_key="unused", max_retries=0, timeout=120)
    finally:
        tiers.stop()


def own_greedy(adapter: Path | None = None, alpha: float = 1.0, precision: dict | None = None) -> str:
    """GenAI's own greedy completion of PROMPT (no draft), with the adapter if one is given, at the run's precision
    unless another is named."""
    import numpy as np
    import openvino as ov
    import openvino_genai as g

    properties = {**(run_precision() if precision is None else precision)}
    if adapter:
        properties["adapters"] = g.AdapterConfig(g.Adapter(str(adapter)))
    pipe = g.ContinuousBatchingPipeline(str(MODELS / "tiny-llama"), g.SchedulerConfig(), "CPU", properties)
    tokenizer = pipe.get_tokenizer()
    ids = ov.Tensor(np.asarray([tokenizer.encode(PROMPT).input_ids.data[0].tolist()], dtype=np.int64))
    config = g.GenerationConfig(max_new_tokens=24)
    if adapter:
        config.adapters = g.AdapterConfig(g.Adapter(str(adapter)), alpha)
    return tokenizer.decode(list(pipe.generate([ids], [config])[0].m_generation_ids[0]))


def test_greedy_text_with_a_draft_model_is_the_models_own(client: OpenAI) -> None:
    expected = own_greedy(precision=F32)
    for extra in ({}, {"num_assistant_tokens": 3}, {"assistant_confidence_threshold": 0.3}):
        answer = client.completions.create(model=DRAFTED, prompt=PROMPT, temperature=0, max_tokens=24,
                                           extra_body=extra)
        assert answer.choices[0].text == expected
    with pytest.raises(openai.BadRequestError, match="draft model"):
        client.completions.create(model=ADAPTED, prompt=PROMPT, max_tokens=2,
                                  extra_body={"assistant_confidence_threshold": 0.3})


@pytest.mark.numerics
def test_an_adapter_is_listed_and_selected_by_either_name(client: OpenAI) -> None:
    assert {m.id for m in client.models.list()} >= {DRAFTED, ADAPTED, f"{ADAPTED}:loud"}
    adapted, base = own_greedy(LORA, 0.7), own_greedy()
    assert adapted != base
    for name in (f"{ADAPTED}:loud", "loud"):
        answer = client.completions.create(model=name, prompt=PROMPT, temperature=0, max_tokens=24)
        assert answer.choices[0].text == adapted
    assert client.completions.create(model=ADAPTED, prompt=PROMPT, temperature=0,
                                     max_tokens=24).choices[0].text == base
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model=f"{ADAPTED}:quiet", prompt=PROMPT, max_tokens=2)
