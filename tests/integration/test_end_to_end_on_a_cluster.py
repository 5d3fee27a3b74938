"""A selection of the suite's end-to-end tests, run again on a real Redis Cluster (3 masters with one replica each,
Debian's redis-server >= 7 on loopback ports): chat and completions, streamed and unary, concurrent streams, prompt
arrays, stored, chained, background and cancelled responses. The tests are the end-to-end modules' own, imported
here: this module's `redis_url` and `stack` (the API and a worker of the default model on the cluster) stand in for
the session's. The whole suite runs on a Cluster with `OVQ_TEST_REDIS=cluster` (tests/conftest.py)."""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from common.keys import Keys
from common.models.sources import default_model
from common.redis.client import sync_client
from common.settings import Settings
from tests.conftest import MODEL, ON_CLUSTER, Stack, _spawn, _wait_ready, free_port
from tests.integration.redis_ha import ClusterSet, missing_for_cluster
from tests.integration.test_openai_api import (  # noqa: F401 - collected again, on the cluster
    test_completions_unary_and_streamed,
    test_sixteen_concurrent_streams_all_complete,
    test_streamed_text_equals_unary_text_at_temperature_zero,
)
from tests.integration.test_responses import (  # noqa: F401
    test_a_background_response_through_the_sdk_is_the_same_answer,
    test_a_client_that_leaves_a_stream_leaves_a_cancelled_response,
    test_a_stored_response_is_retrieved_and_deleted,
    test_previous_response_id_continues_the_conversation,
)
from tests.integration.test_text_api import (  # noqa: F401
    test_a_prompt_array_is_one_job_per_prompt_in_one_answer,
    test_n_choices_come_back_with_their_index_unary_and_streamed,
)

pytestmark = [pytest.mark.skipif(missing_for_cluster() is not None, reason=str(missing_for_cluster())),
              pytest.mark.skipif(ON_CLUSTER, reason="OVQ_TEST_REDIS=cluster: the imported modules run on one already")]


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    cluster = ClusterSet(tmp_path_factory.mktemp("cluster"))
    yield cluster.url
    cluster.stop()


@pytest.fixture(scope="module")
def stack(model_dir: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The API and one worker of the default model (as tests/conftest.py's `stack` configures it) on the cluster."""
    work = tmp_path_factory.mktemp("cluster-stack")
    default = default_model(Settings())
    config = work / "models.json"
    config.write_text(json.dumps({"models": {MODEL: {
        "path": str(model_dir), "cache_size": 0, "max_tokens_limit": 4096, "chat_template": str(default.chat_template),
        "tool_parser": default.tool_parser, "enable_tool_guided_generation": default.enable_tool_guided_generation}}}))
    port, media_port = free_port(), free_port()
    env = {**os.environ, "REDIS_URL": redis_url, "OVQ_CONFIG": str(config), "OVQ_PORT": str(port),
           "OVQ_KEY_PREFIX": "ovqtest", "OVQ_LOG_LEVEL": "warning", "OVQ_RECLAIM_INTERVAL_S": "1",
           "OVQ_WORKER_TTL_S": "5", "OVQ_FIRST_EVENT_CHECK_S": "1", "OVQ_API_PROCESSES": "1"}
    procs = [_spawn(["workers", "--model", MODEL], env, work / "worker.log"), _spawn(["api"], env, work / "api.log")]
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(f"{base}/health", procs, work, {MODEL})
        yield Stack(f"{base}/v3", redis_url, config, work, env, media_port)
        logs = "".join(log.read_text(errors="replace") for log in work.glob("*.log"))
        assert "Traceback" not in logs and "CROSSSLOT" not in logs, logs[-3000:]
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)


def test_a_jobs_events_go_over_its_models_master(stack: Stack, redis_url: str) -> None:
    """Its events are published on the master of its model's queue (one round trip with its step's other writes,
    and a Cluster's event traffic spread by model), where its API process listens (`Keys.events`)."""
    keys, r = Keys("ovqtest", cluster=True), sync_client(redis_url)
    [reply_to] = [m.decode() for m in r.zrange(keys.apis, 0, -1)]
    home = r.get_node_from_key(keys.jobs(MODEL, "CPU"))
    assert r.get_node_from_key(keys.events(reply_to, MODEL)).name == home.name

    def published() -> dict[str, int]:
        return {node.name: int(r.info("commandstats", target_nodes=node).get("cmdstat_spublish", {}).get("calls", 0))
                for node in r.get_primaries()}

    before = published()
    reply = httpx.post(f"{stack.base_url}/chat/completions", timeout=60, json={
        "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True})
    assert reply.status_code == 200 and "data: [DONE]" in reply.text, reply.text
    after = published()
    grew = {name for name in after if after[name] > before.get(name, 0)}
    assert grew == {home.name}, (before, after)
    [(_, listeners)] = r.execute_command("PUBSUB SHARDNUMSUB", keys.events(reply_to, MODEL), target_nodes=home)
    assert listeners == 1
    r.close()
