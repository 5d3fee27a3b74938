"""An OVMS repository (config.json + graph.pbtxt) read as ovq's ModelConfigs, its import command and its errors."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cli.main import main, parser
from cli.tiers import config_env
from common.models.config import CacheEvictionConfig, ConfigError, ModelConfig
from common.models.ovms import load_ovms
from common.models.sources import configured_models, load_models
from common.servable import ServableType, infer_servable
from common.settings import Settings
from tests.ovms_repository import (
    IMAGE_FIRST_OPTION_LINE,
    LLM_FIRST_OPTION_LINE,
    embeddings_graph,
    image_graph,
    link_model,
    llm_graph,
    rerank_graph,
    s2t_graph,
    t2s_graph,
    write_repository,
)

MODELS = Path(__file__).resolve().parents[3] / "models"
LLAMA, LLAVA, SD = MODELS / "tiny-llama", MODELS / "tiny-llava", MODELS / "tiny-sd"
EMBED, RERANK = MODELS / "tiny-embed", MODELS / "tiny-rerank"
SD_LORA = MODELS / "tiny-sd-lora" / "tiny_sd_lora.safetensors"


def only(config: Path) -> ModelConfig:
    (model,) = load_ovms(config).models
    return model


def test_continuous_batching_llm_with_every_seed_option(tmp_path: Path) -> None:
    link_model(LLAMA, tmp_path / "llama")
    config = write_repository(tmp_path, {"llama": llm_graph(
        'models_path: "./"',
        "max_num_batched_tokens: 512",
        "cache_size: 2",
        "max_num_seqs: 16",
        "dynamic_split_fuse: false",
        'device: "GPU"',
        """plugin_config: '{"KV_CACHE_PRECISION": "u8", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "32"}'""",
        "best_of_limit: 4",
        "max_tokens_limit: 1024",
        "enable_prefix_caching: true",
        "cache_eviction_config: {start_size: 32, recent_size: 128, max_cache_size: 672}",
        'reasoning_parser: "qwen3"',
        'tool_parser: "hermes3"',
        "enable_tool_guided_generation: true",
    )}, [{"name": "OpenVINO/tiny-llama", "base_path": "llama"}])
    imported = load_ovms(config)
    assert imported.warnings == []
    assert imported.models == [ModelConfig(
        name="OpenVINO/tiny-llama", path=tmp_path / "llama", devices=["GPU"], max_num_batched_tokens=512,
        cache_size=2, max_num_seqs=16, dynamic_split_fuse=False,
        plugin_config={"KV_CACHE_PRECISION": "u8", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "32"}, best_of_limit=4,
        max_tokens_limit=1024, enable_prefix_caching=True,
        cache_eviction_config=CacheEvictionConfig(start_size=32, recent_size=128, max_cache_size=672),
        reasoning_parser="qwen3", tool_parser="hermes3", enable_tool_guided_generation=True,
    )]
    assert infer_servable(imported.models[0].path, "GPU") is ServableType.LM_CB


def test_unset_options_take_ovms_defaults(tmp_path: Path) -> None:
    config = write_repository(tmp_path, {"llm": llm_graph(f'models_path: "{LLAMA}"'),
                                         "sd": image_graph(f'models_path: "{SD}"')})
    llm, image = load_ovms(config).models
    # The seeds' defaults, written out: a change to ModelConfig's own defaults must not change an OVMS import.
    assert (llm.max_num_batched_tokens, llm.cache_size, llm.max_num_seqs, llm.dynamic_split_fuse) == (256, 8, 256, True)
    assert (llm.devices, llm.plugin_config, llm.best_of_limit, llm.max_tokens_limit) == (["CPU"], {}, 20, None)
    assert (llm.enable_prefix_caching, llm.cache_eviction_config, llm.pipeline_type) == (False, None, "AUTO")
    assert (llm.tool_parser, llm.reasoning_parser, llm.enable_tool_guided_generation) == (None, None, False)
    assert (image.max_resolution, image.default_resolution, image.max_num_images_per_prompt) == ("4096x4096", None, 10)
    assert (image.default_num_inference_steps, image.max_num_inference_steps, image.devices) == (50, 100, ["CPU"])
    assert infer_servable(image.path, "CPU") is ServableType.IMAGE
    # Unset options are unset, as in a models file: a stateful worker warns only about options a graph sets.
    assert llm.model_fields_set == image.model_fields_set == {"name", "path"}


def test_stateful_npu_style_llm(tmp_path: Path) -> None:
    """As OVMS's NPU demos: device NPU means stateful; `pipeline_type: LM` asks for it on CPU."""
    config = write_repository(tmp_path, {
        "npu": llm_graph(f'models_path: "{LLAMA}"', 'device: "NPU"', """plugin_config: '{"MAX_PROMPT_LEN": 2048}'"""),
        "cpu": llm_graph(f'models_path: "{LLAMA}"', "pipeline_type: LM", 'device: "CPU"'),
    })
    npu, cpu = load_ovms(config).models
    assert (npu.devices, npu.pipeline_type, npu.plugin_config) == (["NPU"], "AUTO", {"MAX_PROMPT_LEN": 2048})
    assert infer_servable(npu.path, npu.devices[0], npu.pipeline_type) is ServableType.LM
    assert (cpu.devices, cpu.pipeline_type) == (["CPU"], "LM")
    assert infer_servable(cpu.path, cpu.devices[0], cpu.pipeline_type) is ServableType.LM


def test_vlm_and_pipeline_type_must_match_the_directory(tmp_path: Path) -> None:
    config = write_repository(tmp_path, {"vlm": llm_graph('models_path: "../llava"')})
    link_model(LLAVA, tmp_path / "llava")
    model = only(config)
    assert model.path == tmp_path / "llava"
    assert infer_servable(model.path, "CPU", model.pipeline_type) is ServableType.VLM_CB
    write_repository(tmp_path, {"vlm": llm_graph('models_path: "../llava"', "pipeline_type: LM")})
    with pytest.raises(ConfigError, match=r"vlm/graph.pbtxt:\d+: pipeline_type LM does not match .*vision-language"):
        load_ovms(config)
    write_repository(tmp_path, {"vlm": llm_graph(f'models_path: "{LLAMA}"', "pipeline_type: VLM_CB")})
    with pytest.raises(ConfigError, match="pipeline_type VLM_CB does not match .*a text-only model"):
        load_ovms(config)


def test_image_generation_options(tmp_path: Path) -> None:
    config = write_repository(tmp_path, {"sd": image_graph(
        f'models_path: "{SD}"', 'device: "GPU"', """plugin_config: '{"NUM_STREAMS": "1"}'""",
        'max_resolution: "512x512"', 'default_resolution: "256x256"', "max_num_images_per_prompt: 2",
        "default_num_inference_steps: 4", "max_num_inference_steps: 8",
    )})
    assert only(config) == ModelConfig(
        name="sd", path=SD, devices=["GPU"], plugin_config={"NUM_STREAMS": "1"}, max_resolution="512x512",
        default_resolution="256x256", max_num_images_per_prompt=2, default_num_inference_steps=4,
        max_num_inference_steps=8)


def test_the_calculator_decides_text_or_image(tmp_path: Path) -> None:
    config = write_repository(tmp_path, {"m": image_graph(f'models_path: "{LLAMA}"')})
    with pytest.raises(ConfigError, match=f"ImageGenCalculator needs an image generation model: {LLAMA} has no"):
        load_ovms(config)
    write_repository(tmp_path, {"m": llm_graph(f'models_path: "{SD}"')})
    with pytest.raises(ConfigError, match="holds an image generation model"):
        load_ovms(config)
    # The options must be the calculator's own.
    write_repository(tmp_path, {"m": llm_graph(f'models_path: "{LLAMA}"').replace(
        "mediapipe.LLMCalculatorOptions", "mediapipe.ImageGenCalculatorOptions")})
    with pytest.raises(ConfigError, match=r"needs node_options \[type.googleapis.com/mediapipe.LLMCalculatorOptions"):
        load_ovms(config)


def test_paths_resolve_as_in_ovms(tmp_path: Path) -> None:
    link_model(LLAMA, tmp_path / "repo" / "default")
    link_model(LLAMA, tmp_path / "repo" / "graphs" / "model")
    link_model(LLAMA, tmp_path / "abs")
    root = tmp_path / "repo"
    config = write_repository(root, {
        "default": llm_graph('models_path: "./"'),  # base_path defaults to the name
        "graphs": llm_graph('models_path: "model"'),
        str(tmp_path / "abs"): llm_graph('models_path: "."'),
    }, [{"name": "default"}, {"name": "relative", "base_path": "graphs/"},
        {"name": "absolute", "base_path": str(tmp_path / "abs")}])
    # graph_path is relative to base_path; models_path is relative to base_path too, wherever the graph is.
    (root / "graphs" / "other").mkdir()
    (root / "graphs" / "other" / "alt.pbtxt").write_text(llm_graph('models_path: "model"', "max_num_seqs: 3"))
    data = json.loads(config.read_text())
    data["mediapipe_config_list"].append({"name": "alt", "base_path": "graphs", "graph_path": "other/alt.pbtxt"})
    # A model_config_list entry whose base path holds a graph, as OVMS's --add_to_config writes it.
    data["model_config_list"].append({"config": {"name": "listed", "base_path": "default"}})
    config.write_text(json.dumps(data))
    models = {m.name: m for m in load_ovms(root).models}  # a directory means its config.json, as in OVMS
    assert {name: m.path for name, m in models.items()} == {
        "default": root / "default", "relative": root / "graphs" / "model", "absolute": tmp_path / "abs",
        "alt": root / "graphs" / "model", "listed": root / "default"}
    assert models["alt"].max_num_seqs == 3


def test_import_round_trips(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    link_model(LLAVA, tmp_path / "vlm")
    config = write_repository(tmp_path, {
        "llm": llm_graph(f'models_path: "{LLAMA}"', "max_num_seqs: 8", "cache_size: 0", 'tool_parser: "llama3"',
                         """plugin_config: '{"prompt_lookup": true}'""", "max_tokens_limit: 100",
                         "cache_eviction_config: {aggregation_mode: NORM_SUM, start_size: 8, recent_size: 8, "
                         "max_cache_size: 64, apply_rotation: true}"),
        "stateful": llm_graph(f'models_path: "{LLAMA}"', "pipeline_type: LM"),
        "vlm": llm_graph('models_path: "./"', 'device: "GPU.1"'),
        "sd": image_graph(f'models_path: "{SD}"', 'default_resolution: "64x64"', "max_num_inference_steps: 7"),
    }, [{"name": "meta/llm", "base_path": "llm"}, {"name": "stateful", "base_path": "stateful"},
        {"name": "vlm", "base_path": "vlm"}, {"name": "sd", "base_path": "sd"}])
    assert main(["models", "import-ovms", str(config)]) == 0
    out = capsys.readouterr().out
    (tmp_path / "models.yaml").write_text(out)
    assert load_models(tmp_path / "models.yaml") == load_ovms(config).models
    assert [m.name for m in load_models(tmp_path / "models.yaml")] == ["meta/llm", "stateful", "vlm", "sd"]


def test_syntax_error_names_file_line_and_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_repository(tmp_path, {"m": llm_graph(f'models_path: "{LLAMA}"', "max_num_seqs 4")})
    graph = tmp_path / "m" / "graph.pbtxt"
    line = LLM_FIRST_OPTION_LINE + 1
    with pytest.raises(ConfigError, match=rf"^{graph}:{line}:24: Expected \":\"\.$"):
        load_ovms(config)
    assert main(["models", "import-ovms", str(config)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f'ovq models import-ovms: {graph}:{line}:24: Expected ":".\n'  # one line, no traceback
    # A value of the wrong type is the same kind of error.
    write_repository(tmp_path, {"m": llm_graph(f'models_path: "{LLAMA}"', "max_num_seqs: -4")})
    with pytest.raises(ConfigError, match=rf"^{graph}:{line}:25: Value out of range: -4$"):
        load_ovms(config)
    (tmp_path / "config.json").write_text('{"mediapipe_config_list": [\n  {"name": "m",}]}')
    with pytest.raises(ConfigError, match=rf"^{tmp_path / 'config.json'}:2:16: Expecting property name"):
        load_ovms(config)


def test_unknown_options_are_one_warning_each_with_file_and_line(tmp_path: Path) -> None:
    config = write_repository(tmp_path, {"m": llm_graph(
        f'models_path: "{LLAMA}"',
        'draft_eagle3_mode: true, max_num_seqs: 5',
        "sparse_attention_config { mode: TRISHAPE num_last_dense_tokens_in_prefill: 4 }",
        "max_num_seq: 4  # a typo",
        "cache_eviction_config: {start_size: 1, recent_size: 2, max_cache_size: 3, snapkv_window_size: 8}",
        'unknown_list: [1, 2], best_of_limit: 3',
        """chat_template_mode: JINJA generation_config_path: "gen" 'config.json' max_tokens_limit: 7""",
    ), "sd": image_graph(f'models_path: "{SD}"', "guidance_scale: 7.5", "lora_weights: 2")})
    imported = load_ovms(config)
    graph, image = tmp_path / "m" / "graph.pbtxt", tmp_path / "sd" / "graph.pbtxt"
    first, image_first = LLM_FIRST_OPTION_LINE, IMAGE_FIRST_OPTION_LINE
    assert imported.warnings == [
        f"{graph}:{first + 1}: 'draft_eagle3_mode' is an OVMS option ovq does not implement; ignored",
        f"{graph}:{first + 2}: 'sparse_attention_config' is an OVMS option ovq does not implement; ignored",
        f"{graph}:{first + 3}: 'max_num_seq' is not an option of mediapipe.LLMCalculatorOptions that ovq knows; "
        "ignored",
        f"{graph}:{first + 4}: 'snapkv_window_size' is an OVMS option ovq does not implement; ignored",
        f"{graph}:{first + 5}: 'unknown_list' is not an option of mediapipe.LLMCalculatorOptions that ovq knows; "
        "ignored",
        f"{graph}:{first + 6}: 'chat_template_mode' is an OVMS option ovq does not implement; ignored",
        f"{graph}:{first + 6}: 'generation_config_path' is an OVMS option ovq does not implement; ignored",
        f"{image}:{image_first + 1}: 'guidance_scale' is an OVMS option ovq does not implement; ignored",
        f"{image}:{image_first + 2}: 'lora_weights' is not an option of mediapipe.ImageGenCalculatorOptions that "
        "ovq knows; ignored",
    ]
    llm = imported.models[0]  # the known options around the ignored ones still apply
    assert (llm.max_num_seqs, llm.best_of_limit, llm.cache_eviction_config.max_cache_size) == (5, 3, 3)
    assert llm.max_tokens_limit == 7


def test_image_lora_adapters_are_the_image_models_adapters(tmp_path: Path) -> None:
    link_model(SD, tmp_path / "sd")
    (tmp_path / "sd" / "loras").mkdir()
    style = tmp_path / "sd" / "loras" / "style.safetensors"
    style.write_bytes((SD_LORA).read_bytes())
    config = write_repository(tmp_path, {"sd": image_graph(
        'models_path: "./"',
        "lora_adapters { alias: 'style' path: 'loras/style.safetensors' alpha: 0.6 mode: DYNAMIC }",
        f"lora_adapters {{ alias: 'npu' path: '{SD_LORA}' mode: STATIC }}",
        "composite_lora_adapters { alias: 'blend' components { adapter_alias: 'style' alpha: 0.5 } }",
    )})
    imported = load_ovms(config)
    (model,) = imported.models
    assert {name: (a.path, a.alpha) for name, a in model.lora_adapters.items()} == {
        "style": (style, pytest.approx(0.6)), "npu": (SD_LORA, 1.0)}
    graph, first = tmp_path / "sd" / "graph.pbtxt", IMAGE_FIRST_OPTION_LINE
    assert imported.warnings == [
        f"{graph}:{first + 3}: 'composite_lora_adapters' is an OVMS option ovq does not implement; ignored",
        f"{graph}:{first + 1}: lora_adapters 'npu': mode STATIC is loaded as DYNAMIC (ovq weighs adapters per "
        "request)",
    ]


@pytest.mark.parametrize(("entries", "error"), [
    (["lora_adapters { alias: 'a' path: 'missing.safetensors' }"], "'a': .*missing.safetensors is not a file"),
    (["lora_adapters { alias: 'a' }"], "each entry needs an alias and a path"),
    ([f"lora_adapters {{ alias: 'a' path: '{MODELS / 'tiny-sd-lora' / 'tiny_sd_lora.safetensors'}' }}"] * 2,
     "alias 'a' is given twice"),
])
def test_image_lora_adapter_errors_name_the_graph_line(tmp_path: Path, entries: list[str], error: str) -> None:
    config = write_repository(tmp_path, {"sd": image_graph(f'models_path: "{SD}"', *entries)})
    with pytest.raises(ConfigError, match=rf"^{tmp_path / 'sd' / 'graph.pbtxt'}:{IMAGE_FIRST_OPTION_LINE + 1}: "
                                          rf"lora_adapters: {error}"):
        load_ovms(config)


def test_speculative_decoding_options(tmp_path: Path) -> None:
    link_model(LLAMA, tmp_path / "llama" / "main")
    link_model(LLAMA, tmp_path / "llama" / "draft")
    config = write_repository(tmp_path, {"llama": llm_graph(
        'models_path: "./main"', "cache_size: 2", 'draft_models_path: "draft"', 'draft_device: "CPU"',
        "draft_max_num_batched_tokens: 64", "draft_cache_size: 1", "draft_max_num_seqs: 8",
        "draft_dynamic_split_fuse: false", "draft_block_size: 32",
    )})
    imported = load_ovms(config)
    assert imported.warnings == []
    (model,) = imported.models
    assert model.draft_models_path == tmp_path / "llama" / "draft"
    assert (model.draft_device, model.draft_block_size) == ("CPU", 32)
    assert model.draft_scheduler() == {"max_num_batched_tokens": 64, "cache_size": 1, "max_num_seqs": 8,
                                       "dynamic_split_fuse": False, "enable_prefix_caching": False}


def test_draft_options_need_a_draft_and_a_directory(tmp_path: Path) -> None:
    config = write_repository(tmp_path, {"m": llm_graph(f'models_path: "{LLAMA}"', "draft_cache_size: 1")})
    with pytest.raises(ConfigError, match="draft_cache_size set without draft_models_path"):
        load_ovms(config)
    write_repository(tmp_path, {"m": llm_graph(f'models_path: "{LLAMA}"', 'draft_models_path: "nowhere"')})
    with pytest.raises(ConfigError, match=rf":{LLM_FIRST_OPTION_LINE + 1}: draft_models_path 'nowhere': no model"):
        load_ovms(config)


def test_warnings_reach_the_user_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_repository(tmp_path, {"m": llm_graph(f'models_path: "{LLAMA}"', "foo: 1")})
    assert main(["models", "prepare", "--config_path", str(config)]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"m: {LLAMA}\n"
    assert captured.err == (f"ovq models prepare: warning: {tmp_path / 'm' / 'graph.pbtxt'}:"
                            f"{LLM_FIRST_OPTION_LINE + 1}: 'foo' is not an option of "
                            "mediapipe.LLMCalculatorOptions that ovq knows; ignored\n")


def test_missing_directories_name_the_path_looked_for(tmp_path: Path) -> None:
    config = write_repository(tmp_path, {"m": llm_graph('models_path: "weights"')})
    with pytest.raises(ConfigError, match=rf"graph.pbtxt:{LLM_FIRST_OPTION_LINE}: models_path 'weights': "
                                          rf"no model directory at {tmp_path / 'm' / 'weights'}$"):
        load_ovms(config)
    write_repository(tmp_path, {}, [{"name": "gone"}])
    with pytest.raises(ConfigError, match=f"graph of 'gone' not found: looked for {tmp_path / 'gone' / 'graph.pbtxt'}"):
        load_ovms(config)
    with pytest.raises(ConfigError, match=f"{tmp_path / 'nothing.json'}: no such OVMS config file"):
        load_ovms(tmp_path / "nothing.json")


def test_bad_option_values(tmp_path: Path) -> None:
    config = write_repository(tmp_path, {"m": llm_graph(f'models_path: "{LLAMA}"', "plugin_config: '{bad'")})
    with pytest.raises(ConfigError, match=rf":{LLM_FIRST_OPTION_LINE + 1}: plugin_config is not JSON"):
        load_ovms(config)
    write_repository(tmp_path, {"m": llm_graph(f'models_path: "{LLAMA}"', 'tool_parser: "gpt"')})
    with pytest.raises(ConfigError, match=rf":{LLM_FIRST_OPTION_LINE + 1}: tool_parser: Input should be 'hermes3'"):
        load_ovms(config)
    write_repository(tmp_path, {"m": llm_graph(f'models_path: "{LLAMA}"', "cache_eviction_config { start_size: 1 }")})
    with pytest.raises(ConfigError, match="cache_eviction_config: recent_size is required"):
        load_ovms(config)
    write_repository(tmp_path, {"m": llm_graph('device: "CPU"')})
    with pytest.raises(ConfigError, match="models_path is required"):
        load_ovms(config)


def test_older_response_parser(tmp_path: Path) -> None:
    """Seed 000's single `response_parser`: qwen3 meant Hermes-style tool calls plus <think> reasoning."""
    config = write_repository(tmp_path, {"m": llm_graph(f'models_path: "{LLAMA}"', 'response_parser: "qwen3"')})
    assert (only(config).tool_parser, only(config).reasoning_parser) == ("hermes3", "qwen3")


def test_graphs_ovq_does_not_serve_are_skipped(tmp_path: Path) -> None:
    classic = ('node {\n  name: "classic"\n  calculator: "OpenVINOInferenceCalculator"\n  node_options: {\n'
               '    [type.googleapis.com / mediapipe.OpenVINOInferenceCalculatorOptions]: { tag_to_input: "x" }\n'
               "  }\n}\n")
    config = write_repository(tmp_path, {"classic": classic, "m": llm_graph(f'models_path: "{LLAMA}"')})
    imported = load_ovms(config)
    assert [m.name for m in imported.models] == ["m"]
    assert imported.warnings == [f"{tmp_path / 'classic' / 'graph.pbtxt'}: no HttpLLMCalculator, ImageGenCalculator, "
                                 "S2tCalculator, T2sCalculator, EmbeddingsCalculatorOV or RerankCalculatorOV node "
                                 "(calculators: OpenVINOInferenceCalculator): ovq does not serve it; 'classic' skipped"]
    write_repository(tmp_path, {"classic": classic})
    with pytest.raises(ConfigError, match="no text or image generation servable"):
        load_ovms(config)


def test_embeddings_graph_options_map_to_the_models_file(tmp_path: Path) -> None:
    link_model(EMBED, tmp_path / "emb")
    config = write_repository(tmp_path, {"emb": embeddings_graph(
        'models_path: "./"', "normalize_embeddings: false", "truncate: true", "pooling: MEAN",
        'target_device: "GPU"', """plugin_config: '{"NUM_STREAMS": "2"}'""", "max_batch: 4")})
    imported = load_ovms(config)
    assert imported.models == [ModelConfig(
        name="emb", path=tmp_path / "emb", devices=["GPU"], pipeline_type="EMBEDDINGS", normalize_embeddings=False,
        truncate=True, pooling="MEAN", plugin_config={"NUM_STREAMS": "2"})]
    (warning,) = imported.warnings
    assert warning.endswith("'max_batch' is not an option of mediapipe.EmbeddingsCalculatorOVOptions that ovq "
                            "knows; ignored")
    assert infer_servable(EMBED, "CPU", imported.models[0].pipeline_type) is ServableType.EMBEDDINGS


@pytest.mark.parametrize(("option", "pooling"), [("pooling: LAST_TOKEN", "LAST"), ("pooling: CLS", "CLS"),
                                                 ("mean_pooling: true", "MEAN"), ("mean_pooling: false", "CLS")])
def test_embeddings_pooling_of_every_ovms_release(tmp_path: Path, option: str, pooling: str) -> None:
    config = write_repository(tmp_path, {"emb": embeddings_graph(f'models_path: "{EMBED}"', option)})
    assert only(config).pooling == pooling


def test_rerank_graph_options_map_to_the_models_file(tmp_path: Path) -> None:
    config = write_repository(tmp_path, {"rr": rerank_graph(
        f'models_path: "{RERANK}"', "max_allowed_chunks: 50", "max_position_embeddings: 64",
        'target_device: "CPU"')})
    imported = load_ovms(config)
    assert imported.warnings == []
    assert imported.models == [ModelConfig(name="rr", path=RERANK, devices=["CPU"], pipeline_type="RERANK",
                                           max_allowed_chunks=50, max_position_embeddings=64)]


def test_encoder_graph_on_an_image_model_is_refused(tmp_path: Path) -> None:
    config = write_repository(tmp_path, {"emb": embeddings_graph(f'models_path: "{SD}"')})
    with pytest.raises(ConfigError, match="holds an image generation model"):
        load_ovms(config)


def test_settings_and_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = write_repository(tmp_path, {"m": llm_graph(f'models_path: "{LLAMA}"')})
    monkeypatch.setenv("OVQ_OVMS_CONFIG", str(config))
    assert [m.name for m in configured_models(Settings())] == ["m"]
    monkeypatch.setenv("OVQ_CONFIG", str(tmp_path / "models.yaml"))
    with pytest.raises(ConfigError, match="both a models file .* and an OVMS config"):
        configured_models(Settings())
    # OVMS's spellings on ovq's commands.
    args = parser().parse_args(["serve", "--config_path", "repo/config.json", "--rest_port", "9001",
                                "--rest_bind_address", "0.0.0.0", "--log_level", "TRACE"])
    assert (args.port, args.host) == (9001, "0.0.0.0")
    assert config_env(args) == {"OVQ_OVMS_CONFIG": str(Path("repo/config.json").absolute()), "OVQ_LOG_LEVEL": "debug"}
    for command in (["api"], ["worker", "--model", "m"], ["models", "prepare"]):
        args = parser().parse_args([*command, "--ovms-config", "x/config.json"])
        assert config_env(args)["OVQ_OVMS_CONFIG"] == str(Path("x/config.json").absolute())
    with pytest.raises(SystemExit):
        parser().parse_args(["serve", "--log_level", "LOUD"])


@pytest.mark.parametrize("command", [["serve"], ["api"], ["worker", "--model", "m"], ["models", "prepare"]])
def test_commands_exit_2_with_one_line_on_a_broken_graph(command: list[str], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if not k.startswith("OVQ_")})
    config = write_repository(tmp_path, {"m": llm_graph(f'models_path: "{LLAMA}"', "cache_size: big")})
    assert main([*command, "--config_path", str(config)]) == 2  # before anything starts or execs
    err = capsys.readouterr().err
    assert err.endswith(f"{tmp_path / 'm' / 'graph.pbtxt'}:{LLM_FIRST_OPTION_LINE + 1}:23: "
                        "Couldn't parse integer: big\n")
    assert err.count("\n") == 1


WHISPER, SPEECHT5 = MODELS / "tiny-whisper", MODELS / "tiny-speecht5"


def test_speech_to_text_graph_is_a_whisper_servable(tmp_path: Path) -> None:
    link_model(WHISPER, tmp_path / "whisper")
    config = write_repository(tmp_path, {"whisper": s2t_graph(
        'models_path: "./"', 'plugin_config: \'{ "NUM_STREAMS": "1" }\'', 'target_device: "CPU"',
        "enable_word_timestamps: true", "max_num_seqs: 4")})
    imported = load_ovms(config)
    assert imported.models == [ModelConfig(name="whisper", path=tmp_path / "whisper", devices=["CPU"],
                                           plugin_config={"NUM_STREAMS": "1"}, enable_word_timestamps=True)]
    assert imported.warnings == [f"{tmp_path / 'whisper' / 'graph.pbtxt'}:15: 'max_num_seqs' is not an option of "
                                 "mediapipe.S2tCalculatorOptions that ovq knows; ignored"]
    assert infer_servable(imported.models[0].path, "CPU") is ServableType.S2T


def test_text_to_speech_graph_with_voices(tmp_path: Path) -> None:
    link_model(SPEECHT5, tmp_path / "tts")
    config = write_repository(tmp_path, {"tts": t2s_graph(
        'models_path: "./"', 'target_device: "CPU"',
        'voices: [{ name: "a", path: "voice-a.bin" }, { name: "b", path: "/abs/b.bin" }]')})
    (model,) = load_ovms(config).models
    assert [(v.name, v.path) for v in model.voices] == [("a", tmp_path / "tts" / "voice-a.bin"),
                                                       ("b", Path("/abs/b.bin"))]
    assert infer_servable(model.path, "CPU") is ServableType.T2S


def test_speech_graph_on_the_wrong_model_is_an_error(tmp_path: Path) -> None:
    config = write_repository(tmp_path, {"s": s2t_graph(f'models_path: "{SPEECHT5}"')})
    with pytest.raises(ConfigError, match="S2tCalculator needs a Whisper model"):
        load_ovms(config)
    config = write_repository(tmp_path, {"s": t2s_graph(f'models_path: "{LLAMA}"')})
    with pytest.raises(ConfigError, match="T2sCalculator needs a SpeechT5 or Kokoro model"):
        load_ovms(config)
