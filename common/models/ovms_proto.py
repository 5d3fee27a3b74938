"""The protobuf messages of an OVMS `graph.pbtxt`, built at import time (no protoc, no generated code).

Field names are OVMS's (`src/llm/llm_calculator.proto`, `src/image_gen/image_gen_calculator.proto`, numbers too;
the embeddings and rerank calculators' options by name)
and MediaPipe's (`calculator.proto`); text format goes by name only. No defaults here: an option the graph leaves
unset takes `ModelConfig`'s default, which is OVMS's. Only the options ovq honours are defined: every other field
is unknown to these messages, which is how the parser finds the options ovq ignores. The graph's own structure is
defined as far as OVMS's LLM and image graphs use it.
"""
from __future__ import annotations

from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {"string": _F.TYPE_STRING, "bool": _F.TYPE_BOOL, "uint64": _F.TYPE_UINT64, "uint32": _F.TYPE_UINT32,
            "int32": _F.TYPE_INT32, "float": _F.TYPE_FLOAT}
_EXTENSIONS_FROM = 20000  # MediaPipe's option messages reserve 20000 to max for extensions

LLM_OPTIONS = "mediapipe.LLMCalculatorOptions"
IMAGE_OPTIONS = "mediapipe.ImageGenCalculatorOptions"
EMBEDDINGS_OPTIONS = "mediapipe.EmbeddingsCalculatorOVOptions"
RERANK_OPTIONS = "mediapipe.RerankCalculatorOVOptions"
GRAPH = "mediapipe.CalculatorGraphConfig"
S2T_OPTIONS = "mediapipe.S2tCalculatorOptions"
T2S_OPTIONS = "mediapipe.T2sCalculatorOptions"


def _field(name: str, number: int, kind: str) -> descriptor_pb2.FieldDescriptorProto:
    """`kind`: a scalar name, `enum .pkg.Type` or `.pkg.Message`; a leading `*` makes the field repeated."""
    repeated = kind.startswith("*")
    kind = kind.lstrip("*")
    field = _F(name=name, number=number, label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
    if kind in _SCALARS:
        field.type = _SCALARS[kind]
    elif kind.startswith("enum "):
        field.type, field.type_name = _F.TYPE_ENUM, kind.removeprefix("enum ")
    else:
        field.type, field.type_name = _F.TYPE_MESSAGE, kind
    return field


def _message(name: str, fields: list[tuple], nested: tuple = (), enums: dict[str, list[str]] | None = None,
             extendable: bool = False) -> descriptor_pb2.DescriptorProto:
    message = descriptor_pb2.DescriptorProto(name=name, field=[_field(*spec) for spec in fields],
                                             nested_type=list(nested))
    for enum_name, values in (enums or {}).items():
        message.enum_type.add(name=enum_name, value=[
            descriptor_pb2.EnumValueDescriptorProto(name=value, number=number) for number, value in enumerate(values)
        ])
    if extendable:
        message.extension_range.add(start=_EXTENSIONS_FROM, end=536870912)
    return message


_LLM = _message("LLMCalculatorOptions", [
    ("models_path", 1, "string"),
    ("max_num_batched_tokens", 2, "uint64"),
    ("cache_size", 3, "uint64"),
    ("max_num_seqs", 4, "uint64"),
    ("dynamic_split_fuse", 5, "bool"),
    ("device", 6, "string"),
    ("plugin_config", 7, "string"),
    ("best_of_limit", 8, "uint32"),
    ("max_tokens_limit", 9, "uint32"),
    ("enable_prefix_caching", 10, "bool"),
    ("pipeline_type", 19, "enum .mediapipe.LLMCalculatorOptions.PipelineType"),
    ("cache_eviction_config", 20, ".mediapipe.LLMCalculatorOptions.CacheEvictionConfig"),
    ("tool_parser", 21, "string"),
    ("reasoning_parser", 22, "string"),
    ("enable_tool_guided_generation", 23, "bool"),
    # Speculative decoding (text format goes by name; these numbers are ours).
    ("draft_models_path", 11, "string"),
    ("draft_device", 12, "string"),
    ("draft_max_num_batched_tokens", 13, "uint64"),
    ("draft_cache_size", 14, "uint64"),
    ("draft_block_size", 15, "uint64"),
    ("draft_max_num_seqs", 16, "uint64"),
    ("draft_dynamic_split_fuse", 17, "bool"),
    # The older page's single parser option (seed 000), before tool_parser and reasoning_parser replaced it
    # (its number is ours).
    ("response_parser", 1000, "string"),
], nested=(
    _message("CacheEvictionConfig", [
        ("aggregation_mode", 1, "enum .mediapipe.LLMCalculatorOptions.CacheEvictionConfig.AggregationMode"),
        ("start_size", 2, "uint64"),
        ("recent_size", 3, "uint64"),
        ("max_cache_size", 4, "uint64"),
        ("apply_rotation", 5, "bool"),
    ], enums={"AggregationMode": ["SUM", "NORM_SUM"]}),
), enums={"PipelineType": ["LM", "VLM", "LM_CB", "VLM_CB", "AUTO"]})

_IMAGE = _message("ImageGenCalculatorOptions", [
    ("models_path", 1, "string"),
    ("device", 2, "string"),
    ("plugin_config", 3, "string"),
    ("max_resolution", 4, "string"),
    ("default_resolution", 5, "string"),
    ("max_num_images_per_prompt", 6, "uint64"),
    ("default_num_inference_steps", 7, "uint64"),
    ("max_num_inference_steps", 8, "uint64"),
    ("lora_adapters", 9, "*.mediapipe.ImageGenCalculatorOptions.LoraAdapterEntry"),  # (the number is ours)
], nested=(
    _message("LoraAdapterEntry", [
        ("alias", 1, "string"),
        ("path", 2, "string"),
        ("alpha", 3, "float"),
        ("mode", 4, "enum .mediapipe.ImageGenCalculatorOptions.LoraAdapterEntry.LoraLoadMode"),
    ], enums={"LoraLoadMode": ["DYNAMIC", "STATIC", "FUSE"]}),
))

# OVMS's src/audio/speech_to_text/s2t_calculator.proto and text_to_speech/t2s_calculator.proto.
_S2T = _message("S2tCalculatorOptions", [
    ("models_path", 1, "string"),
    ("target_device", 2, "string"),
    ("plugin_config", 3, "string"),
    ("enable_word_timestamps", 4, "bool"),
])

_T2S = _message("T2sCalculatorOptions", [
    ("models_path", 1, "string"),
    ("target_device", 2, "string"),
    ("plugin_config", 3, "string"),
    ("voices", 4, "*.mediapipe.T2sCalculatorOptions.SpeakerEmbeddings"),
], nested=(
    _message("SpeakerEmbeddings", [("name", 1, "string"), ("path", 2, "string")]),
))

# OVMS's `src/embeddings/embeddings_calculator_ov.proto` across its releases: `mean_pooling` (older) became
# `pooling`, whose LAST_TOKEN became LAST; `truncate` came later. Text format goes by name, so the numbers are ours.
_EMBEDDINGS = _message("EmbeddingsCalculatorOVOptions", [
    ("models_path", 1, "string"),
    ("normalize_embeddings", 2, "bool"),
    ("target_device", 3, "string"),
    ("plugin_config", 4, "string"),
    ("pooling", 5, "enum .mediapipe.EmbeddingsCalculatorOVOptions.Pooling"),
    ("mean_pooling", 6, "bool"),
    ("truncate", 7, "bool"),
], enums={"Pooling": ["CLS", "LAST", "MEAN", "LAST_TOKEN"]})

# `src/rerank/rerank_calculator_ov.proto`.
_RERANK = _message("RerankCalculatorOVOptions", [
    ("models_path", 1, "string"),
    ("max_allowed_chunks", 2, "uint64"),
    ("max_position_embeddings", 3, "uint64"),
    ("target_device", 4, "string"),
    ("plugin_config", 5, "string"),
])

_GRAPH = _message("CalculatorGraphConfig", [
    ("node", 1, "*.mediapipe.CalculatorGraphConfig.Node"),
    ("num_threads", 4, "int32"),
    ("input_stream", 10, "*string"),
    ("max_queue_size", 11, "int32"),
    ("input_stream_handler", 12, ".mediapipe.InputStreamHandlerConfig"),
    ("output_stream_handler", 13, ".mediapipe.OutputStreamHandlerConfig"),
    ("output_stream", 15, "*string"),
    ("input_side_packet", 16, "*string"),
    ("output_side_packet", 17, "*string"),
    ("package", 19, "string"),
    ("type", 20, "string"),
    ("options", 1001, ".mediapipe.MediaPipeOptions"),
    ("graph_options", 1002, "*.google.protobuf.Any"),
], nested=(
    _message("Node", [
        ("name", 1, "string"),
        ("calculator", 2, "string"),
        ("input_stream", 3, "*string"),
        ("output_stream", 4, "*string"),
        ("input_side_packet", 5, "*string"),
        ("output_side_packet", 6, "*string"),
        ("options", 7, ".mediapipe.CalculatorOptions"),
        ("node_options", 8, "*.google.protobuf.Any"),
        ("source_layer", 9, "int32"),
        ("buffer_size_hint", 10, "int32"),
        ("input_stream_handler", 11, ".mediapipe.InputStreamHandlerConfig"),
        ("output_stream_handler", 12, ".mediapipe.OutputStreamHandlerConfig"),
        ("input_stream_info", 13, "*.mediapipe.InputStreamInfo"),
        ("executor", 14, "string"),
        ("max_in_flight", 16, "int32"),
        ("option_value", 17, "*string"),
        ("external_input", 1005, "*string"),
    ]),
))

_STRUCTURE = (
    _message("InputStreamInfo", [("tag_index", 1, "string"), ("back_edge", 2, "bool")]),
    _message("InputStreamHandlerConfig", [("input_stream_handler", 1, "string"),
                                          ("options", 3, ".mediapipe.MediaPipeOptions")]),
    _message("OutputStreamHandlerConfig", [("output_stream_handler", 1, "string"), ("input_side_packet", 2, "*string"),
                                           ("options", 3, ".mediapipe.MediaPipeOptions")]),
    # Extension holders: stream handler options and legacy calculator options are MediaPipe's business.
    _message("MediaPipeOptions", [], extendable=True),
    _message("CalculatorOptions", [], extendable=True),
)


def _pool() -> descriptor_pool.DescriptorPool:
    # A private pool: an installed mediapipe package may define the same names differently.
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(any_pb2.DESCRIPTOR.serialized_pb)
    file = descriptor_pb2.FileDescriptorProto(
        name="ovq/ovms_graph.proto", package="mediapipe", syntax="proto2",
        dependency=[any_pb2.DESCRIPTOR.name],
        message_type=[_GRAPH, _LLM, _IMAGE, _S2T, _T2S, _EMBEDDINGS, _RERANK, *_STRUCTURE],
    )
    pool.Add(file)
    return pool


POOL = _pool()


def new(full_name: str) -> Message:
    """An empty message of one of these types."""
    return message_factory.GetMessageClass(POOL.FindMessageTypeByName(full_name))()
