"""Configuration without a restart (docs/how-to/reload.md), end to end with requests in flight: the models file
changes under load, and OVMS's `POST /v1/config/reload` applies it to the API at once and to the workers through
the fleet's reload generation. Weighted aliases: by weight, sticky per conversation, the target named in the
answer and in the metrics, changed by a reload."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.conftest import ROOT, Tiers, _wait_ready, free_port
from tests.ovms_repository import llm_graph, write_repository
from tests.precision import models_at_run_precision

# Several SmolLM2 workers loading and restarting on a shared two-core machine: past the suite's default 300 s there.
pytestmark = pytest.mark.timeout(900)
POLL = {"OVQ_CONFIG_POLL_S": "0.5"}


def _rewrite(t: Tiers, models: dict[str, dict], aliases: dict[str, dict[str, int]] | None = None) -> None:
    """The models file, replaced as an editor or a ConfigMap update would (a new file moved over the old)."""
    config = t.work / "models.json"
    staged = t.work / "models.json.new"
    staged.write_text(json.dumps({"models": models_at_run_precision(models), **({"aliases": aliases} if aliases
                                                                                else {})}))
    staged.replace(config)


def _chat(t: Tiers, model: str, max_tokens: int | None = 8, **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "Say something."}], **extra}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return httpx.post(f"{t.base_url}/chat/completions", json=body, timeout=180)


class Load:
    """Requests to each model, back to back from a few threads, until stopped: what each got."""

    def __init__(self, t: Tiers, models: list[str], per_model: int = 2) -> None:
        self.t, self.results, self._stop = t, [], threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(m,)) for m in models for _ in range(per_model)]

    def _run(self, model: str) -> None:
        while not self._stop.is_set():
            sent = time.monotonic()
            try:
                response = _chat(self.t, model, max_tokens=16)
                self.results.append((model, sent, response.status_code, _body(response)))
            except httpx.HTTPError as exc:
                self.results.append((model, sent, 0, {"error": str(exc)}))
                continue
            if response.status_code == 404:  # a removed model: ask again now and then, not in a tight loop
                time.sleep(0.2)

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(200)


def _body(response: httpx.Response) -> dict[str, Any]:
    try:
        return response.json()
    except ValueError:
        return {"text": response.text}


def _wait(what: str, until: Callable[[], bool], timeout: float = 120, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() >= deadline:
            said = log.read_text(errors="replace")[-4000:] if log is not None else ""
            pytest.fail(f"not within {timeout:.0f}s: {what}\n{said}")
        time.sleep(0.2)


def _restarts(log: str) -> tuple[datetime, datetime, int]:
    """When a worker began and ended its engine restart (its log's timestamps), and how many jobs it carried over."""
    began = re.search(r"^(\S+ \S+) .*restarting its engine \((\d+) jobs carried over\)", log, re.M)
    ended = re.search(r"^(\S+ \S+) .*engine restarted with the new configuration", log, re.M)
    assert began and ended, log[-3000:]
    stamp = "%Y-%m-%d %H:%M:%S,%f"
    return datetime.strptime(began[1], stamp), datetime.strptime(ended[1], stamp), int(began[2])


def test_a_reload_under_load_adds_drains_and_restarts_without_losing_a_request(tiers: Callable[..., Tiers],
                                                                               model_dir: Path) -> None:
    path = str(model_dir)
    t = tiers({"keep": {"path": path, "max_num_seqs": 4}, "gone": {"path": path, "max_num_seqs": 4}}, **POLL)
    t.api()
    # No grace for keep's running jobs: whatever runs when its engine restarts is carried over to the new one.
    keeps = [t.worker("keep", name=f"keep{i}", OVQ_SHUTDOWN_GRACE_S="0") for i in (1, 2)]
    gone = t.worker("gone", name="gone")
    t.wait_served("keep", "gone", timeout=600)  # three workers loading at once on a busy machine
    t.wait_served("keep", workers=2, timeout=600)
    transcript = []
    long: list[httpx.Response] = []
    with Load(t, ["keep", "gone"]) as load:
        _wait("some answers under load", lambda: len(load.results) >= 8)
        # A long answer, running when the reload comes: it goes on on its worker's new engine.
        started = threading.Event()
        runner = threading.Thread(target=lambda: long.append(_long(t, started)))
        runner.start()
        assert started.wait(120)
        _rewrite(t, {"keep": {"path": path, "max_num_seqs": 4, "max_tokens_default": 3}, "added": {"path": path}})
        reloaded = httpx.post(f"{t.base_url.rsplit('/v3', 1)[0]}/v1/config/reload", timeout=30)
        at = time.monotonic()
        transcript.append(f"{time.strftime('%H:%M:%S')} POST /v1/config/reload -> {reloaded.status_code} "
                          f"{reloaded.text}")
        # 201, or 200 when this API process's own poll of the file got there first (OVMS's "already applied")
        assert reloaded.status_code in (200, 201), reloaded.text
        states = {name: v["model_version_status"][0]["state"] for name, v in reloaded.json().items()}
        assert states["keep"] == "AVAILABLE" and states["added"] == "LOADING"
        assert states["gone"] in ("UNLOADING", "END")
        refused = _chat(t, "gone")
        assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found"
        assert "added" in [m["id"] for m in httpx.get(f"{t.base_url}/models").json()["data"]]
        gone.wait(120)  # it drained what was queued for it, then stopped by itself
        assert gone.returncode == 0, t.log(gone)[-3000:]
        for keep in keeps:
            _wait("keep's engine restarts", lambda keep=keep: "engine restarted with the new" in t.log(keep))
        t.worker("added", name="added")
        answered = _chat(t, "added")
        assert answered.status_code == 200, answered.text
        settled = len(load.results)
        _wait("answers after the restarts", lambda: len(load.results) >= settled + 4)
        runner.join(300)
    lost = [r for r in load.results if r[2] != 200 and not (r[0] == "gone" and r[2] == 404)]
    assert not lost, lost[:5]
    late = [r for r in load.results if r[0] == "gone" and r[2] == 200 and r[1] > at]
    assert not late, "a removed model answered a request sent after the reload"
    served = Counter(r[0] for r in load.results if r[2] == 200)
    assert served["keep"] >= 8 and served["gone"] >= 1, served
    (first_begin, first_end, carried), (second_begin, second_end, carried2) = sorted(_restarts(t.log(k))
                                                                                     for k in keeps)
    assert first_end <= second_begin, "both of keep's engines restarted at once: not a rolling restart"
    for keep in keeps:  # a restarting worker stays alive to the others: none of its jobs is taken over
        assert "of dead workers" not in t.log(keep), t.log(keep)[-3000:]
    assert long and long[0] == ("length", LONG), long  # it went on to its whole length on the new engine
    after = _chat(t, "keep", max_tokens=None)  # the changed option reached the workers: max_tokens_default 3
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] <= 3, after.text
    for proc, name in ((keeps[0], "keep1"), (keeps[1], "keep2"), (gone, "gone")):
        transcript += [f"{line[11:19]} [{name}] {line.split(' ovq.', 1)[-1]}" for line in t.log(proc).splitlines()
                       if re.search(r"models file|engine restarted|configuration|stopping|stopped|continu", line)]
    transcript.append(f"requests under load: {dict(served)} answered, "
                      f"{sum(1 for r in load.results if r[2] == 404)} refused 404 (gone, after the reload), 0 lost; "
                      f"the long answer: {long[0]}; carried over to a new engine: {carried + carried2}")
    print("\n".join(sorted(transcript, key=lambda line: line[:8])))


LONG = 400


def _long(t: Tiers, started: threading.Event) -> tuple[str, int] | str:
    """A streamed answer of LONG tokens (no EOS: ignore_eos): its finish reason and token count."""
    body = {"model": "keep", "prompt": "Once upon a time", "max_tokens": LONG, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    finish, tokens = None, 0
    with httpx.stream("POST", f"{t.base_url}/completions", json=body, timeout=300) as response:
        if response.status_code != 200:
            return f"{response.status_code} {response.read().decode()}"
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            started.set()
            for choice in chunk.get("choices", []):
                finish = choice.get("finish_reason") or finish
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return finish or "none", tokens


def _alias_models(path: str) -> dict[str, dict]:
    return {"model-a": {"path": path, "max_num_seqs": 8}, "model-b": {"path": path, "max_num_seqs": 8}}


def test_an_alias_routes_by_weight_sticky_per_conversation_and_follows_a_reload(tiers: Callable[..., Tiers],
                                                                                 model_dir: Path) -> None:
    t = tiers(_alias_models(str(model_dir)), **POLL)
    _rewrite(t, _alias_models(str(model_dir)), {"chat": {"model-a": 3, "model-b": 1}})
    t.api()
    t.worker("model-a", name="a")
    t.worker("model-b", name="b")
    t.wait_served("model-a", "model-b", timeout=600)
    assert "chat" in [m["id"] for m in httpx.get(f"{t.base_url}/models").json()["data"]]

    keyless = Counter(_chat(t, "chat", max_tokens=1).json()["model"] for _ in range(8))
    assert keyless == {"model-a": 6, "model-b": 2}  # dealt by weight: exact over every 4

    keyed = Counter()
    for field in ("prompt_cache_key", "user"):
        for i in range(6):
            answers = {_chat(t, "chat", max_tokens=1, **{field: f"conversation-{i}"}).json()["model"]
                       for _ in range(3)}
            assert len(answers) == 1, (field, i, answers)  # a conversation stays on one target
            keyed[answers.pop()] += 3

    metrics = httpx.get(f"{t.base_url.rsplit('/v3', 1)[0]}/metrics").text
    counted = {m[0]: float(m[1]) for m in re.findall(
        r'ovq_alias_requests_total\{alias="chat",target="([^"]+)"\} ([0-9.]+)', metrics)}
    assert counted == {target: keyless[target] + keyed[target] for target in ("model-a", "model-b")
                       if keyless[target] + keyed[target]}, counted

    _rewrite(t, _alias_models(str(model_dir)), {"chat": {"model-a": 0, "model-b": 1}})  # followed, no POST
    _wait("the new weights", lambda: _chat(t, "chat", max_tokens=1).json()["model"] == "model-b", timeout=30)
    assert {_chat(t, "chat", max_tokens=1, user=f"conversation-{i}").json()["model"] for i in range(6)} == {"model-b"}


def test_a_reload_asked_of_one_api_process_reaches_the_others(tiers: Callable[..., Tiers], model_dir: Path) -> None:
    # No workers: which models exist is the API's own knowledge. The file changes so that its stat cannot tell
    # (same size, same mtime, same inode), so only the reload generation in Redis can carry it to the second one.
    path = str(model_dir)
    t = tiers({"first": {"path": path}, "other": {"path": path}}, **POLL)
    t.api()
    one = t.base_url.rsplit("/v3", 1)[0]
    t.api()
    two = t.base_url.rsplit("/v3", 1)[0]
    for base in (one, two):
        _wait(f"{base} up", lambda base=base: _listed(base) == {"first", "other"}, timeout=60)
    config = t.work / "models.json"
    stat = config.stat()
    with config.open("r+") as f:  # in place: the inode stays
        text = f.read().replace('"other"', '"third"')
        f.seek(0)
        f.write(text)
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    time.sleep(1.5)  # three polls of each: the stat alone changes nothing
    assert _listed(two) == {"first", "other"}
    reloaded = httpx.post(f"{one}/v1/config/reload", timeout=30)
    assert reloaded.status_code == 201 and set(reloaded.json()) >= {"first", "third"}, reloaded.text
    _wait("the second process reloaded", lambda: _listed(two) == {"first", "third"}, timeout=30)
    gone = httpx.post(f"{two}/v3/chat/completions", json={"model": "other", "messages": [{"role": "user",
                                                                                          "content": "hi"}]})
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"
    again = httpx.post(f"{one}/v1/config/reload", timeout=30)
    assert again.status_code == 200  # nothing changed since: OVMS's 200
    status = httpx.get(f"{two}/v1/config", timeout=30).json()
    assert status["third"]["model_version_status"][0]["state"] == "LOADING"  # no worker yet
    assert status["other"]["model_version_status"][0]["state"] == "END"


def _listed(base: str) -> set[str]:
    try:
        return {m["id"] for m in httpx.get(f"{base}/v3/models", timeout=10).json()["data"]}
    except httpx.HTTPError:
        return set()


def test_ovq_serve_follows_an_ovms_config_json(model_dir: Path, redis_url: str, tmp_path: Path) -> None:
    """A servable added to config.json gets a worker and is served; a removed one's worker drains and is not
    restarted."""
    graphs = {"llm": llm_graph(f'models_path: "{model_dir}"', "cache_size: 0")}
    config = write_repository(tmp_path / "repo", graphs, [{"name": "first", "base_path": "llm"}])
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {key: value for key, value in os.environ.items() if key not in ("OVQ_CONFIG", "OVQ_OVMS_CONFIG")}
    env.update(REDIS_URL=redis_url, OVQ_KEY_PREFIX=f"ovqreload{port}", OVQ_SHUTDOWN_GRACE_S="5",
               PYTHONPATH=str(ROOT), **POLL)
    log = tmp_path / "serve.log"
    serve = subprocess.Popen([sys.executable, "-m", "cli.main", "serve", "--config_path", str(config),
                              "--rest_port", str(port), "--rest_bind_address", "127.0.0.1"],
                             env=env, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        _wait_ready(f"{base}/health", [serve], tmp_path, {"first"})
        write_repository(tmp_path / "repo", graphs, [{"name": "second", "base_path": "llm"}])
        _wait("second served", lambda: _state(base, "second") == "AVAILABLE", timeout=300, log=log)
        answer = httpx.post(f"{base}/v3/completions", json={"model": "second", "prompt": "Hi", "max_tokens": 2},
                            timeout=120)
        assert answer.status_code == 200 and answer.json()["model"] == "second", answer.text
        gone = httpx.post(f"{base}/v3/completions", json={"model": "first", "prompt": "Hi"}, timeout=30)
        assert gone.status_code == 404
        _wait("first's worker gone", lambda: _state(base, "first") == "END", timeout=120, log=log)
        said = log.read_text(errors="replace")
        assert "worker first on CPU: no longer in the models file" in said, said[-3000:]
        assert "restarting it" not in said.split("no longer in the models file", 1)[1], said[-3000:]
    finally:
        children = psutil.Process(serve.pid).children(recursive=True)
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(60)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
        for child in children:
            if child.is_running():
                child.kill()


def _state(base: str, model: str) -> str | None:
    try:
        status = httpx.get(f"{base}/v1/config", timeout=10).json()
    except httpx.HTTPError:
        return None
    return status.get(model, {}).get("model_version_status", [{}])[0].get("state")
