"""Redis with a password, with the least-privilege ACL users of deploy/redis/users.acl, and over TLS."""
from __future__ import annotations

import io
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import orjson
import pytest
import redis
from openai import OpenAI

from common.keys import GROUP, Keys
from common.redis.client import sync_client
from common.redis.cluster import is_cluster
from common.redis.server import redis_binary
from tests.conftest import MODELS, ROOT, Tiers, free_port

TINY = "tiny-llama"
DEBIAN_REDIS = Path("/usr/bin/redis-server")


class Server:
    """A redis-server of the test's own, with the arguments it needs."""

    def __init__(self, work: Path, *args: str, binary: str | None = None) -> None:
        self.port = free_port()
        work.mkdir(parents=True, exist_ok=True)
        command = [binary or redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(work),
                   "--save", "", "--appendonly", "no", *args]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def wait(self, url: str, **kwargs: object) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                redis.Redis.from_url(url, **kwargs).ping()
                return
            except (redis.ConnectionError, redis.ResponseError):
                time.sleep(0.05)
        raise RuntimeError(self.process.stderr.read().decode() if self.process.poll() is not None else "no Redis")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


@pytest.fixture()
def servers() -> Iterator[list[Server]]:
    made: list[Server] = []
    yield made
    for server in made:
        server.stop()


def serve_and_chat(t: Tiers, api_url: str, worker_url: str) -> None:
    """One streamed and one unary chat (a tenant's), and a stream closed early (its cancel must reach the worker)."""
    t.api(REDIS_URL=api_url)
    t.worker(TINY, REDIS_URL=worker_url)
    t.wait_served(TINY)
    client = OpenAI(base_url=t.base_url, api_key="unused", max_retries=0, timeout=60)
    hi = [{"role": "user", "content": "hi"}]
    # The tiny model samples at temperature 1 over 512 tokens: without ignore_eos its first token is sometimes EOS.
    once = {"ignore_eos": True}
    # With a tenant (`user`): parked for fair shares and taken by the worker's fair read (common/fairness.py).
    assert client.chat.completions.create(model=TINY, messages=hi, max_tokens=3, user="tenant-a",
                                          extra_body=once).usage.completion_tokens == 3
    streamed = list(client.chat.completions.create(model=TINY, messages=hi, max_tokens=3, stream=True,
                                                   stream_options={"include_usage": True}, extra_body=once))
    assert streamed[-1].usage.completion_tokens == 3
    stream = client.chat.completions.create(model=TINY, messages=hi, max_tokens=1900, stream=True,
                                            extra_body={"ignore_eos": True})
    next(iter(stream))
    stream.close()
    r = sync_client(t.redis_url)
    stream_key = Keys(t.prefix, cluster=is_cluster(t.redis_url)).jobs(TINY, "CPU")
    deadline = time.monotonic() + 20
    while r.xpending(stream_key, GROUP)["pending"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert r.xpending(stream_key, GROUP)["pending"] == 0
    logs = "".join(t.log(p) for p in t.procs)
    assert "NOPERM" not in logs and "Traceback" not in logs, logs[-3000:]


def tiny() -> dict[str, dict]:
    return {TINY: {"path": str(MODELS / TINY), "cache_size": 0}}


def test_the_tiers_run_with_the_documented_least_privilege_acl_users(tiers: Callable[..., Tiers], tmp_path: Path,
                                                                     servers: list[Server]) -> None:
    acl = (ROOT / "deploy" / "redis" / "users.acl").read_text()
    acl = acl.replace("~ovq:*", "~ovqacl:*").replace("&ovq:*", "&ovqacl:*").replace("~ovq-batches", "~ovqacl-batches")
    acl += "user admin on >admin-pw ~* &* +@all\n"  # the test's own view of Redis
    (tmp_path / "users.acl").write_text(acl)
    server = Server(tmp_path / "acl", "--aclfile", str(tmp_path / "users.acl"))
    servers.append(server)
    base = f"127.0.0.1:{server.port}/0"
    server.wait(f"redis://admin:admin-pw@{base}")
    t = tiers(tiny(), url=f"redis://admin:admin-pw@{base}", OVQ_KEY_PREFIX="ovqacl")
    t.prefix = "ovqacl"
    serve_and_chat(t, f"redis://ovq-api:change-me-api@{base}", f"redis://ovq-worker:change-me-worker@{base}")
    admin = redis.Redis.from_url(f"redis://admin:admin-pw@{base}")
    run_a_batch(t, f"redis://ovq-batch:change-me-batch@{base}", admin)
    ops = httpx.get(t.base_url.rsplit("/v3", 1)[0] + "/ops/data", timeout=30)
    assert ops.status_code == 200, (ops.text, denied(admin))
    operator = {**t.env, "REDIS_URL": f"redis://ovq-operator:change-me-operator@{base}"}
    for command in (["status", "--json"], ["dead", "list"], ["jobs", "batches", "--json"], ["jobs", "files", "--json"]):
        done = subprocess.run([sys.executable, "-m", "cli.main", *command], env=operator, cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and "permission" not in done.stderr.lower(), (done.stderr, denied(admin))
    assert denied(admin) == [], denied(admin)


def denied(admin: redis.Redis) -> list[tuple[str, str, str]]:
    """What the ACL refused: (user, command, key or channel)."""
    return [(e["username"], e["client-info"]["cmd"], e["object"]) for e in admin.acl_log()]


def run_a_batch(t: Tiers, batch_url: str, admin: redis.Redis) -> None:
    """A three-line batch through the Batch API: the API's user stores the file and queues the batch on rq, the
    batch worker's user runs it."""
    t.start("batch-worker", "--api-url", f"http://127.0.0.1:{t.port}", name="batch", REDIS_URL=batch_url)
    client = OpenAI(base_url=t.base_url, api_key="unused", max_retries=0, timeout=60)
    lines = [{"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": TINY, "messages": [{"role": "user", "content": f"Count to {i}"}], "max_tokens": 3}}
             for i in range(3)]
    data = b"".join(orjson.dumps(x) + b"\n" for x in lines)
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    deadline = time.monotonic() + 90
    while batch.status not in ("completed", "failed", "expired", "cancelled") and time.monotonic() < deadline:
        time.sleep(0.2)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed", (batch, denied(admin), [t.log(p)[-2000:] for p in t.procs])
    assert batch.request_counts is not None and batch.request_counts.completed == 3
    assert len(client.files.content(batch.output_file_id).content.splitlines()) == 3  # type: ignore[arg-type]
    logs = "".join(t.log(p) for p in t.procs)
    assert "NOPERM" not in logs and "Traceback" not in logs, logs[-3000:]


def test_a_wrong_password_is_one_line_and_an_exit(tiers: Callable[..., Tiers], tmp_path: Path,
                                                  servers: list[Server]) -> None:
    server = Server(tmp_path / "auth", "--requirepass", "s3cret")
    servers.append(server)
    url = f"redis://:s3cret@127.0.0.1:{server.port}/0"
    server.wait(url)
    t = tiers(tiny(), url=url)
    serve_and_chat(t, url, url)
    wrong = t.worker(TINY, name="wrong", REDIS_URL=url.replace("s3cret", "wrong"), OVQ_REDIS_WAIT_S="2")
    assert wrong.wait(60) == 1
    last = t.log(wrong).strip().splitlines()[-1]
    assert "s3cret" not in t.log(wrong) and "wrong@" not in t.log(wrong)
    assert last.startswith("ovq worker: Redis at 127.0.0.1") and "unreachable" in last, last


@pytest.mark.skipif(not DEBIAN_REDIS.exists() or shutil.which("openssl") is None,
                    reason="needs a TLS-capable redis-server (Debian's redis-server package) and openssl")
def test_the_tiers_run_over_tls(tiers: Callable[..., Tiers], tmp_path: Path, servers: list[Server]) -> None:
    certs = tmp_path / "certs"
    certs.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-keyout", str(certs / "key.pem"), "-out", str(certs / "cert.pem")], check=True,
                   capture_output=True)
    tls_port = free_port()
    server = Server(tmp_path / "tls", "--tls-port", str(tls_port), "--tls-cert-file", str(certs / "cert.pem"),
                    "--tls-key-file", str(certs / "key.pem"), "--tls-ca-cert-file", str(certs / "cert.pem"),
                    "--tls-auth-clients", "no", binary=str(DEBIAN_REDIS))
    servers.append(server)
    url = f"rediss://127.0.0.1:{tls_port}/0?ssl_ca_certs={certs / 'cert.pem'}"
    try:
        server.wait(url)
    except RuntimeError as exc:
        if "TLS" in str(exc) or server.process.poll() is not None:
            pytest.skip(f"this redis-server has no TLS: {str(exc)[:200]}")
        raise
    t = tiers(tiny(), url=url)
    serve_and_chat(t, url, url)
    assert httpx.get(t.base_url.rsplit("/v3", 1)[0] + "/health").json()["redis"] is True
