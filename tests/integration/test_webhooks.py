"""Webhooks with the real tiers (issue 41, item 4): a background response's and a batch's end reach the endpoint
the key file gives their tenant, signed (checked by the `standardwebhooks` library's verifier and the OpenAI SDK's
`webhooks.unwrap`), and an event whose delivering API process is SIGKILLed mid-delivery still arrives, from another
API process, under the same webhook-id."""
from __future__ import annotations

import io
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from openai import OpenAI

from tests.conftest import MODELS, ROOT, Tiers
from tests.webhook_receiver import Receiver

pytestmark = pytest.mark.e2e

TINY = "tiny-llama"
VIDEO = "tiny-ltx"
ALPHA, BETA, RUNNER, ADMIN = "sk-alpha-hooks", "sk-beta-hooks", "sk-runner-hooks", "adm-hooks"
RESPONSE: dict[str, Any] = {"model": TINY, "input": "Say hi", "max_output_tokens": 16, "background": True}


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def tiers(redis_url: str, tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[Tiers]:
    """A tiny worker; each test starts the API processes it needs. Alpha's key has the receiver as its endpoint
    (on loopback: allowed here); beta's has none. A held delivery is claimed by another process after 3 s."""
    work = tmp_path_factory.mktemp("webhooks")
    keys = {"keys": [{"key": ALPHA, "tenant": "alpha", "webhooks": [{"url": receiver.url, "secret": receiver.secret}]},
                     {"key": BETA, "tenant": "beta"}, {"key": RUNNER, "tenant": "runner"}]}
    (work / "keys.json").write_text(orjson.dumps(keys).decode())
    t = Tiers(redis_url, work, {TINY: {"path": str(MODELS / TINY), "cache_size": 0},
                                VIDEO: {"path": str(MODELS / VIDEO), "default_num_inference_steps": 2}},
              OVQ_API_KEY_FILE=str(work / "keys.json"), OVQ_ADMIN_KEYS=ADMIN, OVQ_WEBHOOK_ALLOW_PRIVATE="1",
              OVQ_WEBHOOK_CLAIM_IDLE_S="3",
              OVQ_WEBHOOK_TIMEOUT_S="2", OVQ_WEBHOOK_BACKOFF_S="0.5", OVQ_BATCH_SWEEP_S="0.5",
              OVQ_BATCH_LEASE_S="2")
    t.worker(TINY)
    yield t
    t.stop()


def live_api(t: Tiers, **env: str) -> subprocess.Popen[bytes]:
    """The API process of these tiers, started (with `env`) when none runs."""
    running = [p for p in t.procs if p.args[3] == "api" and p.poll() is None]
    if running:
        return running[0]
    proc = t.api(**env)
    t.wait_served(TINY)
    return proc


def sdk(t: Tiers, key: str) -> OpenAI:
    return OpenAI(base_url=f"http://127.0.0.1:{t.port}/v1", api_key=key, max_retries=0, timeout=60)


def arrivals(receiver: Receiver, object_id: str, timeout: float = 90) -> list[Any]:
    """Every request the receiver got about `object_id`, once one was answered 2xx."""
    deadline = time.monotonic() + timeout
    while True:
        about = [r for r in receiver.received if r.event["data"]["id"] == object_id]
        if any(r.status // 100 == 2 for r in about):
            return about
        assert time.monotonic() < deadline, receiver.received
        time.sleep(0.1)


def test_an_event_survives_the_death_of_the_api_process_delivering_it(tiers: Tiers, receiver: Receiver) -> None:
    """API A takes the delivery and the receiver holds it unanswered (A would wait 300 s); A is SIGKILLed; API B,
    started after, claims it once idle (3 s) and delivers it again: the receiver has one event, one webhook-id,
    verified, answered once."""
    t = tiers
    for proc in [p for p in t.procs if p.args[3] == "api" and p.poll() is None]:  # A is the only deliverer
        proc.terminate()
        proc.wait(40)
        t.procs.remove(proc)
    start = time.time()
    doomed = live_api(t, OVQ_WEBHOOK_TIMEOUT_S="300", OVQ_WEBHOOK_CLAIM_IDLE_S="301")  # never gives up on its own
    receiver.hold_next = True
    created = sdk(t, ALPHA).responses.create(**RESPONSE)
    assert receiver.held.wait(90), "the delivery never reached the receiver"
    held = receiver.received[-1]
    doomed.send_signal(signal.SIGKILL)
    doomed.wait(10)
    t.procs.remove(doomed)  # (its log stays readable: t.logs)
    killed = time.time()
    survivor = live_api(t)
    got = arrivals(receiver, created.id)
    assert [r.status for r in got] == [0, 200] and got[0] is held  # the held one, then one answered
    assert got[0].id == got[1].id == got[1].event["id"] and got[1].verified
    assert got[1].event["type"] == "response." + sdk(t, ALPHA).responses.retrieve(created.id).status
    assert len({r.id for r in got if r.status == 200}) == 1  # exactly once by webhook-id
    assert "taken over from a process that did not finish it" in t.log(survivor)
    r = t.redis()
    assert r.xlen(t.keys.webhooks) == 0 and r.zcard(t.keys.webhook_retries) == 0  # nothing left behind
    log = [orjson.loads(a) for a in reversed(r.lrange(t.keys.webhook_log, 0, -1))]
    mine = [a for a in log if a["event"] == got[0].id]
    assert [a["outcome"] for a in mine] == ["delivered"]  # A died before it could log its attempt
    print(f"\nwebhook delivery across an API kill ({created.id}):")
    print(f"  +{held.at - start:6.2f}s  API A (pid {doomed.pid}) POSTs {held.id} ({held.event['type']}); "
          f"the receiver holds it unanswered")
    print(f"  +{killed - start:6.2f}s  API A SIGKILLed (its delivery pending in the consumer group, unacked)")
    print(f"  +{got[1].at - start:6.2f}s  API B (pid {survivor.pid}) claims it after OVQ_WEBHOOK_CLAIM_IDLE_S=3 "
          f"and POSTs {got[1].id} again: signature verified (standardwebhooks), answered 200")
    print(f"  receiver: {len(got)} requests, {len({g.id for g in got})} webhook-id, 1 answered 2xx; "
          f"stream and retry set empty; log: attempt {mine[0]['attempt']} {mine[0]['outcome']}")


def test_a_background_response_s_end_arrives_signed_at_its_tenant_s_endpoint(tiers: Tiers,
                                                                             receiver: Receiver) -> None:
    live_api(tiers)
    alpha = sdk(tiers, ALPHA)
    created = alpha.responses.create(**RESPONSE)
    (got,) = arrivals(receiver, created.id)
    assert got.verified and got.status == 200
    event = OpenAI(api_key="unused", webhook_secret=receiver.secret).webhooks.unwrap(got.body, got.headers)
    # The tiny model runs into max_output_tokens: `incomplete`, stored before its event went.
    assert event.type == "response." + alpha.responses.retrieve(created.id).status and event.data.id == created.id
    # Seen by the operator: the ops page, the metrics, `ovq webhooks`.
    admin = {"Authorization": f"Bearer {ADMIN}"}
    page = httpx.get(f"http://127.0.0.1:{tiers.port}/ops/panel", headers=admin, timeout=30).text
    assert f'data-webhook="{got.id}"' in page
    metrics = httpx.get(f"http://127.0.0.1:{tiers.port}/metrics", headers=admin, timeout=30).text
    assert re.search(r'^ovq_webhook_deliveries_total\{outcome="delivered"\} [1-9]', metrics, re.M)
    cli = subprocess.run([sys.executable, "-m", "cli.main", "webhooks", "--json"], env=tiers.env, cwd=ROOT,
                         capture_output=True, timeout=60, check=True)
    listed = orjson.loads(cli.stdout)
    assert listed["counts"]["delivered"] >= 1 and got.id in {a["event"] for a in listed["recent"]}


def test_a_batch_s_end_arrives_as_batch_completed(tiers: Tiers, receiver: Receiver) -> None:
    live_api(tiers)
    tiers.start("batch-worker", "--api-url", f"http://127.0.0.1:{tiers.port}", "--name", "bw", name="bw",
                OVQ_BATCH_API_KEY=RUNNER)
    alpha = sdk(tiers, ALPHA)
    line = {"custom_id": "one", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}}
    uploaded = alpha.files.create(file=("in.jsonl", io.BytesIO(orjson.dumps(line) + b"\n")), purpose="batch")
    batch = alpha.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    (got,) = arrivals(receiver, batch.id)
    event = OpenAI(api_key="unused", webhook_secret=receiver.secret).webhooks.unwrap(got.body, got.headers)
    assert event.type == "batch.completed" and event.data.id == batch.id
    assert alpha.batches.retrieve(batch.id).status == "completed"


@pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")
def test_a_video_s_end_arrives_as_video_completed(tiers: Tiers, receiver: Receiver) -> None:
    live_api(tiers)
    tiers.worker(VIDEO, name="video")
    tiers.wait_served(TINY, VIDEO)
    video = sdk(tiers, ALPHA).videos.create(model=VIDEO, prompt="a cat", seconds="1", size="64x64",  # type: ignore[arg-type]
                                            extra_body={"frame_rate": 8})
    (got,) = arrivals(receiver, video.id)
    assert got.verified  # the standardwebhooks verifier's word
    assert (got.event["type"], got.event["data"]["id"]) == ("video.completed", video.id)
    assert sdk(tiers, ALPHA).videos.retrieve(video.id).status == "completed"  # stored before its event
