"""The README's first command works from a bare install (no test extras): `ovq serve` on the cached default
model with its embedded Redis answers a chat, and Ctrl-C stops all of it."""
from __future__ import annotations

import os
import signal
import subprocess
import time
import venv
from pathlib import Path

import httpx
import psutil
import pytest
from openai import OpenAI

from tests.conftest import MODEL, ROOT, free_port


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """.ci/run's bare install, else one made here: the project without extras in a fresh virtualenv."""
    given = os.environ.get("OVQ_TEST_BARE_VENV")
    if given:
        return Path(given)
    target = tmp_path_factory.mktemp("bare") / "venv"
    venv.create(target, with_pip=True)
    subprocess.run([str(target / "bin" / "pip"), "install", "-q", str(ROOT)], check=True, timeout=900)
    return target


def test_ovq_serve_from_a_bare_install_answers_and_stops_on_ctrl_c(bare_venv: Path, model_dir: Path,
                                                                    tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "models").mkdir(parents=True)
    (cache / "models" / MODEL).symlink_to(model_dir)  # prepared already: nothing is downloaded
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OVQ_", "REDIS_URL", "PYTHONPATH"))}
    env.update(OVQ_CACHE_DIR=str(cache), OVQ_PORT=str(port), OVQ_API_PROCESSES="1")
    log = (tmp_path / "serve.log").open("wb")
    # Run from elsewhere than the checkout, so only the bare install's own files can be imported.
    serve = subprocess.Popen([str(bare_venv / "bin" / "ovq"), "serve"], env=env, cwd=tmp_path, stdout=log,
                             stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert serve.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/models/{MODEL}/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-3000:]
            time.sleep(0.25)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v3", api_key="unused", max_retries=0, timeout=60)
        reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                               max_tokens=8)
        assert reply.choices[0].message.content
        children = psutil.Process(serve.pid).children(recursive=True)
        serve.send_signal(signal.SIGINT)
        assert serve.wait(60) == 0
        assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
        text = (tmp_path / "serve.log").read_text()
        assert "SIGINT: stopping the batch worker and the API, then the workers" in text, text[-3000:]
        assert "Traceback" not in text, text[-3000:]
    finally:
        if serve.poll() is None:
            serve.kill()
