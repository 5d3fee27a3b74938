"""OVMS repositories for tests, written from the graphs of OVMS's reference pages (the seeds 001 and 003)."""
from __future__ import annotations

import json
from pathlib import Path

# Seed 001's quick-start graph, node_options left to the test.
LLM_GRAPH = """input_stream: "HTTP_REQUEST_PAYLOAD:input"
output_stream: "HTTP_RESPONSE_PAYLOAD:output"

node: {
  name: "LLMExecutor"
  calculator: "HttpLLMCalculator"
  input_stream: "LOOPBACK:loopback"
  input_stream: "HTTP_REQUEST_PAYLOAD:input"
  input_side_packet: "LLM_NODE_RESOURCES:llm"
  output_stream: "LOOPBACK:loopback"
  output_stream: "HTTP_RESPONSE_PAYLOAD:output"
  input_stream_info: {
    tag_index: 'LOOPBACK:0',
    back_edge: true
  }
  node_options: {
      [type.googleapis.com / mediapipe.LLMCalculatorOptions]: {
%s
      }
  }
  input_stream_handler {
    input_stream_handler: "SyncSetInputStreamHandler",
    options {
      [mediapipe.SyncSetInputStreamHandlerOptions.ext] {
        sync_set {
          tag_index: "LOOPBACK:0"
        }
      }
    }
  }
}
"""

# Seed 003's image generation graph.
IMAGE_GRAPH = """input_stream: "HTTP_REQUEST_PAYLOAD:input"
output_stream: "HTTP_RESPONSE_PAYLOAD:output"

node: {
  name: "ImageGenExecutor"
  calculator: "ImageGenCalculator"
  input_stream: "HTTP_REQUEST_PAYLOAD:input"
  input_side_packet: "IMAGE_GEN_NODE_RESOURCES:pipes"
  output_stream: "HTTP_RESPONSE_PAYLOAD:output"
  node_options: {
      [type.googleapis.com / mediapipe.ImageGenCalculatorOptions]: {
%s
      }
  }
}
"""

# OVMS's embeddings and rerank graphs (as its export_model.py writes them).
EMBEDDINGS_GRAPH = """input_stream: "REQUEST_PAYLOAD:input"
output_stream: "RESPONSE_PAYLOAD:output"
node {
  name: "EmbeddingsExecutor"
  input_side_packet: "EMBEDDINGS_NODE_RESOURCES:embeddings_servable"
  calculator: "EmbeddingsCalculatorOV"
  input_stream: "REQUEST_PAYLOAD:input"
  output_stream: "RESPONSE_PAYLOAD:output"
  node_options: {
    [type.googleapis.com / mediapipe.EmbeddingsCalculatorOVOptions]: {
%s
    }
  }
}
"""

RERANK_GRAPH = """input_stream: "REQUEST_PAYLOAD:input"
output_stream: "RESPONSE_PAYLOAD:output"
node {
  name: "RerankExecutor"
  input_side_packet: "RERANK_NODE_RESOURCES:rerank_servable"
  calculator: "RerankCalculatorOV"
  input_stream: "REQUEST_PAYLOAD:input"
  output_stream: "RESPONSE_PAYLOAD:output"
  node_options: {
    [type.googleapis.com / mediapipe.RerankCalculatorOVOptions]: {
%s
    }
  }
}
"""

# The line of the first option inside node_options, for tests that name lines.
LLM_FIRST_OPTION_LINE = LLM_GRAPH.splitlines().index("%s") + 1
IMAGE_FIRST_OPTION_LINE = IMAGE_GRAPH.splitlines().index("%s") + 1


def llm_graph(*options: str) -> str:
    return LLM_GRAPH % "\n".join(f"          {option}" for option in options)


def image_graph(*options: str) -> str:
    return IMAGE_GRAPH % "\n".join(f"          {option}" for option in options)


def embeddings_graph(*options: str) -> str:
    return EMBEDDINGS_GRAPH % "\n".join(f"      {option}" for option in options)


def rerank_graph(*options: str) -> str:
    return RERANK_GRAPH % "\n".join(f"      {option}" for option in options)


def link_model(source: Path, target: Path) -> Path:
    """OVMS's usual layout: the model's files and graph.pbtxt in one directory (`models_path: "./"`)."""
    target.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        (target / item.name).symlink_to(item)
    return target


def write_repository(root: Path, graphs: dict[str, str], entries: list[dict] | None = None) -> Path:
    """`graphs`: graph.pbtxt text by base path (relative to root); `entries`: the mediapipe_config_list
    (default: one entry per base path, named after it)."""
    for base, text in graphs.items():
        (root / base).mkdir(parents=True, exist_ok=True)
        (root / base / "graph.pbtxt").write_text(text)
    entries = entries if entries is not None else [{"name": base, "base_path": base} for base in graphs]
    config = root / "config.json"
    config.write_text(json.dumps({"model_config_list": [], "mediapipe_config_list": entries}, indent=2))
    return config


# OVMS's speech graphs as its export script writes them (src/audio: S2tCalculator, T2sCalculator).
SPEECH_GRAPH = """input_stream: "HTTP_REQUEST_PAYLOAD:input"
output_stream: "HTTP_RESPONSE_PAYLOAD:output"
node {
  name: "%(name)s"
  input_side_packet: "%(side)s"
  calculator: "%(calculator)s"
  input_stream: "HTTP_REQUEST_PAYLOAD:input"
  output_stream: "HTTP_RESPONSE_PAYLOAD:output"
  node_options: {
    [type.googleapis.com / mediapipe.%(calculator)sOptions]: {
%(options)s
    }
  }
}
"""


def s2t_graph(*options: str) -> str:
    return SPEECH_GRAPH % {"name": "S2tExecutor", "side": "STT_NODE_RESOURCES:s2t_servable",
                           "calculator": "S2tCalculator", "options": "\n".join(f"      {o}" for o in options)}


def t2s_graph(*options: str) -> str:
    return SPEECH_GRAPH % {"name": "T2sExecutor", "side": "TTS_NODE_RESOURCES:t2s_servable",
                           "calculator": "T2sCalculator", "options": "\n".join(f"      {o}" for o in options)}
