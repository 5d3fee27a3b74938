"""The README's first command works from a bare install (no test extras): `ovq serve` on the cached default
model with its embedded Redis says "serving" only once a request is answered, and Ctrl-C stops all of it. A worker
that cannot load makes it say which and exit non-zero; Ctrl-C while it starts stops everything cleanly."""
from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
import venv
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import MODEL, ROOT, free_port

SERVING = "ovq serve: serving "  # the line; "not serving: stopping …" is another
README_REQUEST = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}


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


def _environment(tmp_path: Path, model_dir: Path) -> tuple[dict[str, str], int]:
    """A cache of its own (the default model in it, prepared already: nothing is downloaded), a free port."""
    cache = tmp_path / "cache"
    (cache / "models").mkdir(parents=True)
    (cache / "models" / MODEL).symlink_to(model_dir)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OVQ_", "REDIS_URL", "PYTHONPATH"))}
    env.update(OVQ_CACHE_DIR=str(cache), OVQ_PORT=str(port), OVQ_API_PROCESSES="1")
    return env, port


def _start(command: list[str], env: dict[str, str], tmp_path: Path) -> subprocess.Popen[bytes]:
    # Run from elsewhere than the checkout, so only the installed (or PYTHONPATH's) files can be imported.
    return subprocess.Popen(command, env=env, cwd=tmp_path, stdout=(tmp_path / "serve.log").open("wb"),
                            stderr=subprocess.STDOUT)


def _wait_for_line(serve: subprocess.Popen[bytes], log: Path, text: str, timeout: float = 180) -> None:
    """Until `text` shows in the log (polled often: what follows must happen the moment it appears)."""
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert serve.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.02)


def _dev_serve(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli.main", "serve", *args]


def test_ovq_serve_from_a_bare_install_answers_the_moment_it_says_serving_and_stops_on_ctrl_c(
        bare_venv: Path, model_dir: Path, tmp_path: Path) -> None:
    env, port = _environment(tmp_path, model_dir)
    log = tmp_path / "serve.log"
    serve = _start([str(bare_venv / "bin" / "ovq"), "serve"], env, tmp_path)
    try:
        _wait_for_line(serve, log, SERVING)
        # A client that does not retry (the openai SDK would hide a 503 by retrying it).
        reply = httpx.post(f"http://127.0.0.1:{port}/v3/chat/completions", json=README_REQUEST, timeout=60)
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"]
        children = psutil.Process(serve.pid).children(recursive=True)
        serve.send_signal(signal.SIGINT)
        assert serve.wait(60) == 0
        assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
        text = log.read_text()
        # It said what it waited for before it said "serving".
        assert -1 < text.find(f"ovq serve: loading {MODEL} on CPU") < text.find(SERVING), text[-3000:]
        assert "SIGINT: stopping the batch worker and the API, then the workers" in text, text[-3000:]
        assert "Traceback" not in text, text[-3000:]
    finally:
        if serve.poll() is None:
            serve.kill()


def test_ovq_serve_names_the_worker_that_cannot_load_and_exits_non_zero_without_serving(
        model_dir: Path, tmp_path: Path) -> None:
    env, _ = _environment(tmp_path, model_dir)
    env["PYTHONPATH"] = str(ROOT)
    config = tmp_path / "models.json"
    # The model on CPU loads; on a device no OpenVINO runtime has, its worker cannot: "serving" would be a lie.
    config.write_text(json.dumps({"models": {MODEL: {"path": str(model_dir), "cache_size": 0,
                                                     "devices": ["CPU", "NOSUCHDEVICE"]}}}))
    serve = _start(_dev_serve("--config", str(config)), env, tmp_path)
    try:
        assert serve.wait(300) == 1
        text = (tmp_path / "serve.log").read_text()
        assert (f"ovq serve: worker {MODEL} on NOSUCHDEVICE failed to start: exited with code 1: "
                f"ovq worker: device NOSUCHDEVICE unavailable for {MODEL}") in text, text[-3000:]
        assert "not serving: stopping the batch worker and the API, then the workers" in text, text[-3000:]
        assert SERVING not in text, text[-3000:]
        assert "Traceback" not in text, text[-3000:]
    finally:
        if serve.poll() is None:
            serve.kill()


def test_an_api_that_cannot_take_its_port_is_named_with_its_error_and_exit_1(model_dir: Path, tmp_path: Path) -> None:
    env, port = _environment(tmp_path, model_dir)
    env["PYTHONPATH"] = str(ROOT)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        done = subprocess.run(_dev_serve(), env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    said = [line for line in done.stderr.splitlines() if line.startswith("ovq serve: api failed to start")]
    assert done.returncode == 1, done.stderr[-3000:]
    # uvicorn's error, not the lines it logs as it shuts down after it.
    assert said and "address already in use" in said[0], done.stderr[-3000:]
    assert SERVING not in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]


def test_a_model_path_without_a_model_is_one_line_and_exit_1_before_anything_starts(tmp_path: Path) -> None:
    config = tmp_path / "models.json"
    config.write_text(json.dumps({"models": {"nowhere": {"path": str(tmp_path / "no-such-model")}}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OVQ_", "REDIS_URL"))}
    env.update(PYTHONPATH=str(ROOT), OVQ_CACHE_DIR=str(tmp_path / "cache"), OVQ_PORT=str(free_port()))
    done = subprocess.run(_dev_serve("--config", str(config)), env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1
    assert f"ovq serve: nowhere cannot be prepared: {tmp_path / 'no-such-model'} holds no OpenVINO model" in \
        done.stderr, done.stderr
    assert "Traceback" not in done.stderr and SERVING not in done.stderr, done.stderr
    assert not (tmp_path / "cache" / "redis").exists()  # nothing was started


def test_ctrl_c_while_ovq_serve_starts_stops_everything_with_one_line_why(model_dir: Path, tmp_path: Path) -> None:
    env, _ = _environment(tmp_path, model_dir)
    env["PYTHONPATH"] = str(ROOT)
    log = tmp_path / "serve.log"
    serve = _start(_dev_serve(), env, tmp_path)
    try:
        _wait_for_line(serve, log, f"ovq serve: loading {MODEL} on CPU")
        children = psutil.Process(serve.pid).children(recursive=True)
        assert children
        serve.send_signal(signal.SIGINT)
        assert serve.wait(60) == 0
        assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
        text = log.read_text()
        assert text.count("ovq serve: SIGINT: stopping") == 1, text[-3000:]
        assert "Traceback" not in text, text[-3000:]
    finally:
        if serve.poll() is None:
            serve.kill()


def test_ctrl_c_while_ovq_serve_prepares_a_model_stops_it_with_one_line_why(tmp_path: Path) -> None:
    config = tmp_path / "models.json"
    config.write_text(json.dumps({"models": {"slow": {"path": str(tmp_path / "slow"),
                                                      "source": str(tmp_path / "slow.gguf")}}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OVQ_", "REDIS_URL"))}
    env.update(PYTHONPATH=str(ROOT), OVQ_CACHE_DIR=str(tmp_path / "cache"), OVQ_PORT=str(free_port()))
    log = tmp_path / "serve.log"
    # Another process preparing the same model holds its lock: this preparation waits for it.
    with open(tmp_path / "slow.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        serve = _start(_dev_serve("--config", str(config)), env, tmp_path)
        try:
            _wait_for_line(serve, log, "ovq serve: preparing slow: downloading it and converting it")
            serve.send_signal(signal.SIGINT)
            assert serve.wait(60) == 0
            text = log.read_text()
            assert "ovq serve: SIGINT: stopping before anything else started" in text, text[-3000:]
            assert "Traceback" not in text, text[-3000:]
        finally:
            if serve.poll() is None:
                serve.kill()


def test_a_request_sent_before_ovq_serve_says_serving_waits_for_its_worker(model_dir: Path, tmp_path: Path) -> None:
    """The API answers before the model's worker has loaded: a request then waits for the worker (scale from zero,
    README "Operations") instead of a 503, with a client that does not retry."""
    env, port = _environment(tmp_path, model_dir)
    env["PYTHONPATH"] = str(ROOT)
    log = tmp_path / "serve.log"
    serve = _start(_dev_serve(), env, tmp_path)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert serve.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        assert SERVING not in log.read_text(), "the worker was up first: nothing was proven"
        reply = httpx.post(f"http://127.0.0.1:{port}/v3/chat/completions", json=README_REQUEST, timeout=300)
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"]
        assert SERVING in log.read_text()
        serve.send_signal(signal.SIGINT)
        assert serve.wait(60) == 0
    finally:
        if serve.poll() is None:
            serve.kill()


def test_ovq_serve_lists_only_its_models_file_not_an_earlier_runs(model_dir: Path, tmp_path: Path) -> None:
    """The embedded Redis outlives a run: a card an earlier run's worker announced (another models file) is
    forgotten when `ovq serve` starts, so it is neither listed nor waited for; this run's model is."""
    from common.keys import Keys
    from common.modelcard import ModelCard
    from common.redis.client import embedded_socket, sync_client
    from common.redis.server import EmbeddedRedis
    from common.servable import ServableType
    from common.settings import Settings

    env, port = _environment(tmp_path, model_dir)
    earlier = EmbeddedRedis(embedded_socket(Settings(cache_dir=env["OVQ_CACHE_DIR"])).parent)
    client = sync_client(earlier.start())
    keys = Keys("ovq")
    card = ModelCard(name="tiny-chat", device="CPU", servable_type=ServableType.LM_CB, created=int(time.time()))
    client.hset(keys.model("tiny-chat"), "CPU", card.model_dump_json())
    client.zadd(keys.models, {"tiny-chat": time.time()})
    client.close()
    earlier.stop()
    serve = _start(_dev_serve(), {**env, "PYTHONPATH": str(ROOT)}, tmp_path)
    try:
        _wait_for_line(serve, tmp_path / "serve.log", SERVING)
        listed = httpx.get(f"http://127.0.0.1:{port}/v3/models", timeout=30).json()["data"]
        assert [m["id"] for m in listed] == [MODEL]
        reply = httpx.post(f"http://127.0.0.1:{port}/v3/chat/completions", timeout=30,
                           json={**README_REQUEST, "model": "tiny-chat"})
        assert reply.status_code == 404, reply.text
        assert "forgot 1 model(s) an earlier run served: tiny-chat" in (tmp_path / "serve.log").read_text()
        serve.send_signal(signal.SIGINT)
        assert serve.wait(60) == 0
    finally:
        if serve.poll() is None:
            serve.kill()
