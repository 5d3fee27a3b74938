"""The docs' live stack: the API, a SmolLM2 worker, the two tiny encoders and a batch worker, started once, as an
operator would (`ovq api`, `ovq worker`, `ovq batch-worker`), on the session's Redis under a prefix of their own."""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from common.models.sources import default_model
from common.settings import Settings
from tests.conftest import MODEL, MODELS, ROOT, Tiers

EMBED, RERANK = "bge-small", "bge-reranker"  # the names the docs use; served here by the suite's tiny encoders


@dataclass(frozen=True)
class DocsStack:
    base: str  # http://127.0.0.1:PORT
    env: dict[str, str]  # what a shell on the operator's machine would have set


@pytest.fixture(scope="session")
def docs_stack(model_dir: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocsStack]:
    default = default_model(Settings())
    # The default model as `ovq serve` runs it (its template and tool settings), on the directory prepared once.
    smollm2 = {"path": str(model_dir), "cache_size": 0, "max_tokens_limit": 4096,
               "chat_template": str(default.chat_template), "tool_parser": default.tool_parser,
               "enable_tool_guided_generation": default.enable_tool_guided_generation}
    models = {MODEL: smollm2, EMBED: {"path": str(MODELS / "tiny-embed")},
              RERANK: {"path": str(MODELS / "tiny-rerank")}}
    tiers = Tiers(redis_url, tmp_path_factory.mktemp("docs-stack"), models, OVQ_LOG_LEVEL="warning")
    try:
        for name in models:
            tiers.worker(name, name=name)
        tiers.api()
        tiers.start("batch-worker", "--api-url", f"http://127.0.0.1:{tiers.port}", "--name", "docs-batch",
                    name="batch-worker")
        tiers.wait_served(*models, timeout=300)
        env = {"REDIS_URL": redis_url, "OVQ_KEY_PREFIX": tiers.prefix, "OVQ_PORT": str(tiers.port),
               "OVQ_CONFIG": tiers.env["OVQ_CONFIG"]}
        yield DocsStack(f"http://127.0.0.1:{tiers.port}", env)
    finally:
        tiers.stop()


@dataclass(frozen=True)
class Site:
    path: Path  # the built site
    returncode: int
    log: str


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    """The site as CI builds it: `mkdocs build --strict` (a broken link or anchor, or a page outside the navigation,
    fails the build), into a directory of the session's."""
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    return Site(out, done.returncode, done.stdout + done.stderr)
