"""Session fixtures: a real redis-server, the real default model prepared once per machine, real processes."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis

from common.keys import Keys
from common.models.sources import default_model
from common.redis.client import sync_client
from common.redis.cluster import is_cluster
from common.redis.server import EmbeddedRedis
from common.settings import Settings
from tests.precision import at_run_precision, header, models_at_run_precision

ROOT = Path(__file__).resolve().parent.parent
MODEL = "smollm2-135m-instruct"
SINGLE = "smollm2-single"  # the same weights with max_num_seqs 1: observable queueing
IMAGE = "tiny-sd"  # random-weight Stable Diffusion built by tests/models/build_tiny_models.py
VLM = "tiny-llava"  # random-weight LLaVA, continuous batching
STATEFUL = "smollm2-stateful"  # SmolLM2 as OVMS's stateful (NPU-style) servable, run on CPU
STATEFUL_VLM = "tiny-llava-stateful"  # the tiny LLaVA in VLMPipeline
TOOLS = "smollm2-tools"  # the default model's tools settings, unguided `auto`, and the qwen3 reasoning parser
MODELS = ROOT / "tests" / "models"
UNRESOLVABLE = "no-such-host.invalid"  # on the media allow-list, resolves nowhere (RFC 2606)

# Tool-calling requests shared by the SDK and tool tests.
WEATHER = [{"role": "user", "content": "What is the weather like in Paris today?"}]
LOCATION = {"type": "object", "properties": {"location": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
            "required": ["location", "unit"]}
TOOLS_SPEC = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                      "parameters": LOCATION}},
    {"type": "function", "function": {"name": "get_time", "description": "Local time in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def model_dir() -> Path:
    """SmolLM2 prepared into the user's cache (reused by later runs, as `ovq serve` would)."""
    from common.models.prepare import prepare

    return prepare(default_model(Settings()))


# `OVQ_TEST_REDIS=cluster`: the session's Redis is a real 3-master cluster with one replica each (Debian's
# redis-server >= 7, tests/integration/redis_ha.py) instead of the embedded server, for the whole suite's end-to-end
# tests (`redis+cluster://`). Tests that read keys name them with `test_keys` and read them with `redis_client`.
ON_CLUSTER = os.environ.get("OVQ_TEST_REDIS", "") == "cluster"


def test_keys(prefix: str) -> Keys:
    """The key names the tiers use on the session's Redis (hash-tagged on a Cluster)."""
    return Keys(prefix, cluster=ON_CLUSTER)


test_keys.__test__ = False  # type: ignore[attr-defined] - a helper, not a test


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if ON_CLUSTER:
        from tests.integration.redis_ha import ClusterSet, missing_for_cluster

        if missing_for_cluster():
            pytest.exit(f"OVQ_TEST_REDIS=cluster: {missing_for_cluster()}", returncode=2)
        cluster = ClusterSet(tmp_path_factory.mktemp("cluster"))
        yield cluster.url
        cluster.stop()
        return
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"), port=free_port())
    yield server.start()
    server.stop()


@pytest.fixture()
def redis_client(redis_url: str) -> redis.Redis:
    return sync_client(redis_url)  # a RedisCluster on a redis+cluster:// URL


@dataclass
class Stack:
    base_url: str
    redis_url: str
    config: Path
    logs: Path
    env: dict[str, str]
    media_port: int  # the one port of localhost on the media allow-list (tests serve images there)

    def url(self, path: str) -> str:
        return self.base_url.rsplit("/v3", 1)[0] + path


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", *args], env=env, cwd=ROOT, stdout=log.open("wb"),
                            stderr=subprocess.STDOUT)


def _wait_ready(url: str, procs: list[subprocess.Popen[bytes]], logs: Path, models: set[str],
                timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                tails = "\n".join(p.read_text()[-3000:] for p in logs.glob("*.log"))
                raise RuntimeError(f"a process exited during start-up:\n{tails}")
        try:
            response = httpx.get(url, timeout=2)
            served = response.json()["models"] if response.status_code == 200 else {}
            if all(served.get(model) for model in models):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise RuntimeError("the stack did not become ready in time")


@pytest.fixture(scope="session")
def stack(model_dir: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The real API and two real workers (the default model, and a one-at-a-time variant) on a private Redis."""
    work = tmp_path_factory.mktemp("stack")
    config = work / "models.json"
    default = default_model(Settings())
    # MODEL is the built-in default model as `ovq serve` runs it (its template and tool settings), on a directory
    # prepared once per machine, whose generation_config.json has the defaults (temperature 0.2, top_p 0.9,
    # max_new_tokens 512): tests set the sampling they depend on.
    tools_options = {"chat_template": str(default.chat_template), "tool_parser": default.tool_parser,
                     "enable_tool_guided_generation": default.enable_tool_guided_generation}
    common = {"path": str(model_dir), "cache_size": 0, "max_tokens_limit": 4096, **tools_options}
    image = {"path": str(MODELS / "tiny-sd"), "max_resolution": "256x256", "max_num_images_per_prompt": 3,
             "default_num_inference_steps": 4, "max_num_inference_steps": 100}
    vlm = {"path": str(MODELS / "tiny-llava"), "cache_size": 0}
    stateful = {**common, "pipeline_type": "LM", "max_num_seqs": 8,
                "plugin_config": {"ATTENTION_BACKEND": "SDPA", "MAX_PROMPT_LEN": 96}}
    tools = {**common, "reasoning_parser": "qwen3", "enable_tool_guided_generation": False}
    # SINGLE also decodes with prompt lookup: greedy answers must not change.
    single = {**common, "max_num_seqs": 1, "plugin_config": {"prompt_lookup": True}}
    models = {MODEL: common, SINGLE: single, IMAGE: image, VLM: vlm, STATEFUL: stateful,
              STATEFUL_VLM: {**vlm, "pipeline_type": "VLM"}, TOOLS: tools}
    config.write_text(json.dumps({"models": models_at_run_precision(models)}))
    port = free_port()
    media = work / "media"
    media.mkdir()
    media_port = free_port()
    env = {**os.environ, "REDIS_URL": redis_url, "OVQ_ALLOWED_LOCAL_MEDIA_PATH": str(media),
           "OVQ_ALLOWED_MEDIA_DOMAINS": f'["localhost:{media_port}", "{UNRESOLVABLE}"]', "OVQ_MEDIA_TIMEOUT_S": "2",
           "OVQ_CONFIG": str(config), "OVQ_PORT": str(port),
           "OVQ_KEY_PREFIX": "ovqtest", "OVQ_LOG_LEVEL": "warning", "OVQ_RECLAIM_INTERVAL_S": "1",
           "OVQ_WORKER_TTL_S": "5", "OVQ_FIRST_EVENT_CHECK_S": "1"}
    procs = [
        _spawn(["workers", "--model", MODEL], env, work / "worker.log"),
        _spawn(["workers", "--model", SINGLE], env, work / "single.log"),
        _spawn(["workers", "--model", IMAGE], env, work / "image.log"),
        _spawn(["workers", "--model", VLM], env, work / "vlm.log"),
        _spawn(["workers", "--model", STATEFUL], env, work / "stateful.log"),
        _spawn(["workers", "--model", STATEFUL_VLM], env, work / "stateful_vlm.log"),
        _spawn(["workers", "--model", TOOLS], env, work / "tools.log"),
        _spawn(["api"], env, work / "api.log"),
    ]
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(f"{base}/health", procs, work, set(models))
        yield Stack(f"{base}/v3", redis_url, config, work, env, media_port)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


def raw_greedy(model_dir: Path, prompt: str, max_tokens: int, stateful: bool = False,
               plugin_config: dict | None = None) -> str:
    """What GenAI itself answers, greedy, in this process: the pipeline a servable runs, with its properties.

    Greedy texts of different pipelines (paged vs SDPA attention, prompt lookup's batched verification) and
    precisions (bf16 where the CPU has it) legitimately differ on a 135M model: compare like with like.
    """
    import numpy as np
    import openvino as ov
    import openvino_genai as g

    config = g.GenerationConfig()
    config.max_new_tokens = max_tokens
    tokenizer = g.Tokenizer(str(model_dir))
    ids = tokenizer.encode(prompt, add_special_tokens=True).input_ids.data[0].tolist()
    inputs = ov.Tensor(np.asarray([ids], dtype=np.int64))
    properties = at_run_precision(plugin_config)
    if stateful:
        pipe = g.LLMPipeline(str(model_dir), "CPU", ATTENTION_BACKEND="SDPA", **properties)
        return tokenizer.decode(list(pipe.generate(inputs, config).tokens[0]))
    if properties.get("prompt_lookup"):
        config.num_assistant_tokens, config.max_ngram_size = 3, 2
    scheduler = g.SchedulerConfig()
    scheduler.cache_size = 0
    pipe = g.ContinuousBatchingPipeline(str(model_dir), scheduler, "CPU", properties)
    handle = pipe.add_request(0, inputs, config)
    while pipe.has_non_finished_requests():
        pipe.step()
    return tokenizer.decode(list(handle.read_all()[0].generated_ids))


class Tiers:
    """A test's own processes on the session's Redis, under a key prefix of their own: workers, APIs, clients.

    Started through the `ovq` CLI (`python -m cli.main`), as an operator would, so exec and signals are tested too.
    """

    def __init__(self, redis_url: str, work: Path, models: dict[str, dict], **env: str) -> None:
        self.work, self.redis_url = work, redis_url
        self.prefix = f"ovqt{time.monotonic_ns() % 10**9}"
        config = work / "models.json"
        config.write_text(json.dumps({"models": models_at_run_precision(models)}))
        self.env = {**os.environ, "REDIS_URL": redis_url, "OVQ_CONFIG": str(config), "OVQ_KEY_PREFIX": self.prefix,
                    "OVQ_LOG_LEVEL": "info", "OVQ_WORKER_TTL_S": "3", "OVQ_RECLAIM_INTERVAL_S": "1",
                    "OVQ_FIRST_EVENT_CHECK_S": "1", "OVQ_API_PROCESSES": "1", "PYTHONUNBUFFERED": "1", **env}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: dict[int, Path] = {}
        self.port = 0

    def start(self, *args: str, name: str, prefix: list[str] | None = None, **env: str) -> subprocess.Popen[bytes]:
        log = self.work / f"{name}.log"
        proc = subprocess.Popen([*(prefix or []), sys.executable, "-m", "cli.main", *args],
                                env={**self.env, **env}, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT)
        self.procs.append(proc)
        self.logs[proc.pid] = log
        return proc

    def worker(self, model: str, name: str = "worker", **env: str) -> subprocess.Popen[bytes]:
        return self.start("worker", "--model", model, name=name, **env)

    def api(self, **env: str) -> subprocess.Popen[bytes]:
        self.port = free_port()
        return self.start("api", "--port", str(self.port), name=f"api-{self.port}", **env)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v3"

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        return self.logs[proc.pid].read_text(errors="replace")

    @property
    def keys(self) -> Keys:
        """The key names these tiers use (hash-tagged on a Cluster)."""
        return Keys(self.prefix, cluster=is_cluster(self.redis_url))

    def redis(self) -> redis.Redis:
        """A blocking client of these tiers' Redis (a RedisCluster on a Cluster)."""
        return sync_client(self.redis_url)

    def wait_served(self, *models: str, workers: int = 1, timeout: float = 120) -> None:
        """Until the API is up and each model has `workers` live workers."""
        keys = Keys(self.prefix, cluster=is_cluster(self.redis_url))
        r = sync_client(self.redis_url)  # any REDIS_URL, a redis+sentinel:// or redis+cluster:// one too
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None and proc.returncode != 0:
                    raise RuntimeError(f"a process exited during start-up:\n{self.log(proc)[-3000:]}")
            live = [r.zcount(keys.workers(m, "CPU"), time.time() - 3, "+inf") for m in models]
            try:
                up = all(httpx.get(f"http://127.0.0.1:{self.port}/v2/models/{m}/ready", timeout=2).status_code == 200
                         for m in models)
            except httpx.HTTPError:
                up = False
            if up and all(n >= workers for n in live):
                return
            time.sleep(0.2)
        raise RuntimeError("the tiers did not become ready in time:\n" + "\n".join(
            self.log(p)[-2000:] for p in self.procs))

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture()
def tiers(redis_url: str, tmp_path: Path) -> Iterator[Callable[..., Tiers]]:
    made: list[Tiers] = []

    def make(models: dict[str, dict], url: str | None = None, **env: str) -> Tiers:
        made.append(Tiers(url or redis_url, tmp_path, models, **env))
        return made[-1]

    yield make
    for t in made:
        t.stop()


def pytest_report_header() -> str:
    """Which precision the numerics tests run at (tests/precision.py): a bf16 host and an f32 one differ."""
    return header()
