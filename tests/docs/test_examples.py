"""Every code block of the docs runs (python, bash) or parses (yaml, json) as its page shows it, against one live
stack (tests/docs/conftest.py); the blocks that cannot run here say why, and are few. How a block is read:
tests/docs/blocks.py."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import ON_CLUSTER
from tests.docs.blocks import BASE, OUTPUT, PARSE, ROOT, RUN, Block, blocks, pages, runnable

# Blocks that need a cluster, Docker, a GPU or video model, or a long-running server: keep them few.
MOST_NOT_RUN = 19
# What commands read from the repository root, linked into each page's scratch directory (never `deploy/`: a page's
# commands write under it, as an operator's would, and must not touch the checkout's).
READ_ONLY = ("benchmarks",)


def _write(block: Block, workdir: Path) -> None:
    target = workdir / block.title
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(block.code)


def _parse(block: Block, workdir: Path) -> None:
    if block.lang == "json":
        json.loads(block.code)
        return
    yaml.safe_load(block.code)
    name = block.title or ""
    if name.endswith("models.yaml"):
        from common.models.sources import load_models

        assert load_models(workdir / name), f"{block.where}: a models file with no model"
    elif name.endswith("keys.yaml"):
        from api.http.auth import read_keys

        assert read_keys(workdir / name), f"{block.where}: a key file with no key"


def _bash(block: Block, workdir: Path, base: str, env: dict[str, str]) -> None:
    shell = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get(
        "PYTHONPATH")])), "NO_COLOR": "1"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block.code.replace(BASE, base)], cwd=workdir, env=shell,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, \
        f"{block.where} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


@pytest.mark.e2e
@pytest.mark.skipif(ON_CLUSTER, reason="the docs' commands address one Redis (`rq info --url` takes no Cluster)")
@pytest.mark.parametrize("page", [p for p in pages() if runnable(p)], ids=lambda p: str(p.relative_to(ROOT / "docs")))
def test_the_page_s_code_blocks_run(page: Path, docs_stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in READ_ONLY:
        (tmp_path / name).symlink_to(ROOT / name)
    namespace: dict[str, object] = {"__name__": "__docs__"}
    for block in blocks(page):
        if block.title:
            _write(block, tmp_path)
        if block.not_run is not None:
            continue
        if block.lang in PARSE:
            _parse(block, tmp_path)
        elif block.lang == "bash":
            _bash(block, tmp_path, docs_stack.base, docs_stack.env)
        elif block.lang == "python":
            code = compile(block.code.replace(BASE, docs_stack.base), block.where, "exec")
            exec(code, namespace)  # noqa: S102 - the docs' own examples, run as a reader would


def test_every_block_is_a_command_a_file_or_output() -> None:
    """A block in another language would silently go unchecked: each is run, parsed or declared output."""
    unknown = [f"{b.where} ({b.lang or 'no language'})" for p in pages() for b in blocks(p)
               if b.lang not in RUN | PARSE | OUTPUT]
    assert not unknown, f"code blocks neither run, parsed nor output: {unknown}"


def test_blocks_left_unrun_say_why_and_are_few() -> None:
    marked = [b for p in pages() for b in blocks(p) if b.not_run is not None]
    assert all(len(b.not_run) > 20 for b in marked), [b.where for b in marked if len(b.not_run) <= 20]
    assert all(b.lang in RUN for b in marked), "only commands are left unrun; files and output are always checked"
    assert len(marked) <= MOST_NOT_RUN, f"{len(marked)} blocks are not run: {[b.where for b in marked]}"
