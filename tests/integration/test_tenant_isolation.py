"""Tenants see only their own (issue 37), with the real tiers and the official SDK: one API with a structured key
file (tenants alpha, beta, gamma, and the batch worker's own key), an admin key, a tiny worker and a batch worker.

Every route of the app that takes an object id is found from the app itself and called with beta's key on alpha's
objects: each answers 404 exactly as for an id that never existed, and alpha's objects are untouched. The resume
paths (a chat stream's Last-Event-ID, a background response's starting_after) and previous_response_id likewise.
"""
from __future__ import annotations

import io
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest
from openai import OpenAI

from api.app import create_app
from common.settings import Settings
from tests.conftest import MODELS, ROOT, Tiers
from tests.integration import sse

pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")]

TINY = "tiny-llama"
VIDEO = "tiny-ltx"
ALPHA, BETA, GAMMA, RUNNER, ADMIN = "sk-alpha-1", "sk-beta-1", "sk-gamma-1", "sk-runner-1", "adm-tenants"
KEYS = {"keys": [{"key": ALPHA, "tenant": "alpha"}, {"key": BETA, "tenant": "beta"},
                 {"key": GAMMA, "tenant": "gamma", "tokens_per_min": 10_000_000},
                 {"key": RUNNER, "tenant": "runner", "tokens_per_min": 10_000_000}]}
CHAT: dict[str, Any] = {"model": TINY, "messages": [{"role": "user", "content": "Tell me a long story."}],
                        "temperature": 0, "max_tokens": 200, "ignore_eos": True, "stream": True}
# The id each kind of object is named by in a route, and a well-formed id that never existed.
NEVER = {"response_id": "resp_0123456789abcdef0123456789abcdef", "file_id": "file-0123456789abcdef0123456789abcdef",
         "batch_id": "batch_0123456789abcdef0123456789abcdef", "video_id": "video_0123456789abcdef0123456789abcdef",
         "conversation_id": "conv_0123456789abcdef0123456789abcdef", "item_id": "msg_0123456789abcdef0123456789abcdef"}
SHARED_PARAMS = {"model"}  # route parameters that name no tenant's object: models are every tenant's


@pytest.fixture(scope="module")
def tiers(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiers]:
    work = tmp_path_factory.mktemp("tenants")
    (work / "keys.json").write_text(orjson.dumps(KEYS).decode())
    t = Tiers(redis_url, work, {TINY: {"path": str(MODELS / TINY), "cache_size": 0},
                                VIDEO: {"path": str(MODELS / VIDEO), "default_num_inference_steps": 2}},
              OVQ_API_KEY_FILE=str(work / "keys.json"), OVQ_ADMIN_KEYS=ADMIN, OVQ_ALLOWED_HOSTS="ovq.internal",
              OVQ_BATCH_SWEEP_S="0.5", OVQ_BATCH_LEASE_S="2")
    t.worker(TINY)
    t.worker(VIDEO, name="video")
    t.api()
    t.wait_served(TINY, VIDEO)
    t.start("batch-worker", "--api-url", f"http://127.0.0.1:{t.port}", "--name", "bw", name="bw",
            OVQ_BATCH_API_KEY=RUNNER)
    yield t
    t.stop()


def sdk(t: Tiers, key: str) -> OpenAI:
    return OpenAI(base_url=f"http://127.0.0.1:{t.port}/v1", api_key=key, max_retries=0, timeout=60)


def http(t: Tiers, key: str) -> httpx.Client:
    return httpx.Client(base_url=f"http://127.0.0.1:{t.port}", headers={"Authorization": f"Bearer {key}"},
                        timeout=60)


def wait_batch(client: OpenAI, batch_id: str) -> Any:
    deadline = time.monotonic() + 90
    while (batch := client.batches.retrieve(batch_id)).status not in ("completed", "failed", "cancelled"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)
    return batch


@pytest.fixture(scope="module")
def alphas(tiers: Tiers) -> dict[str, list[str]]:
    """Alpha's objects, by the route parameter that names them: a stored response, a background one (with its
    events), an uploaded file and a batch with its output file, a video, a conversation and its item."""
    a = sdk(tiers, ALPHA)
    video = a.videos.create_and_poll(model=VIDEO, prompt="a cat", size="64x64", seconds="1",  # type: ignore[arg-type]
                                     extra_body={"frame_rate": 8}, poll_interval_ms=100)
    assert video.status == "completed", video
    stored = a.responses.create(model=TINY, input="Say hi", max_output_tokens=16)
    background = a.responses.create(model=TINY, input="Say hi", max_output_tokens=16, background=True)
    deadline = time.monotonic() + 60
    while a.responses.retrieve(background.id).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    line = {"custom_id": "one", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}}
    uploaded = a.files.create(file=("in.jsonl", io.BytesIO(orjson.dumps(line) + b"\n")), purpose="batch")
    batch = wait_batch(a, a.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                           completion_window="24h").id)
    assert batch.status == "completed" and batch.output_file_id, batch
    conversation = a.conversations.create(items=[{"role": "user", "content": "Say hi"}])
    item = a.conversations.items.list(conversation.id).data[0]
    return {"response_id": [stored.id, background.id], "file_id": [uploaded.id, batch.output_file_id],
            "batch_id": [batch.id], "video_id": [video.id], "conversation_id": [conversation.id],
            "item_id": [item.id]}


def id_routes() -> list[tuple[str, str, str]]:
    """(method, path, id parameter) of every /v1 and /v3 route that takes a path parameter, read from the app."""
    app = create_app(Settings()).app  # type: ignore[attr-defined]

    def walk(routes: Any, prefix: str = "") -> Iterator[tuple[str, set[str]]]:
        for route in routes:
            if hasattr(route, "original_router"):  # FastAPI >= 0.116 keeps an included router whole
                yield from walk(route.original_router.routes, prefix + route.include_context.prefix)
            elif hasattr(route, "path"):
                yield prefix + route.path, getattr(route, "methods", None) or set()

    found = []
    for path, methods in walk(app.routes):
        params = re.findall(r"{(\w+)(?::\w+)?}", path)
        if not path.startswith(("/v1/", "/v3/")) or not params:
            continue
        for param in params:
            if param in SHARED_PARAMS:
                continue
            found += [(method, path, param) for method in sorted(methods - {"HEAD"})]
    return found


ROUTES = id_routes()


def test_the_id_routes_are_found_and_each_is_covered() -> None:
    """A new route taking an object id must name its kind in NEVER (and so be called below), or fail here."""
    assert len(ROUTES) >= 14, ROUTES  # responses 4, files 3, batches 2 (plus stream variants), on /v1 and /v3
    unknown = {(m, p, param) for m, p, param in ROUTES if param not in NEVER}
    assert not unknown, f"routes taking an id with no ownership test: give them an owner check and a case here: " \
                        f"{unknown}"


def variants(method: str, path: str) -> list[dict[str, Any]]:
    """How a route is called: a retrieve of a response also as a stream resumed after its first event."""
    if method == "GET" and path.endswith("/responses/{response_id}"):
        return [{}, {"params": {"stream": "true", "starting_after": "0"}}]
    if method == "GET" and path.endswith("/input_items"):
        return [{}, {"params": {"order": "asc", "limit": "1"}}]
    if method == "GET" and path.endswith("/conversations/{conversation_id}/items"):
        return [{}, {"params": {"order": "asc", "limit": "1"}}]
    if method == "POST" and path.endswith("/conversations/{conversation_id}"):  # a valid update
        return [{"json": {"metadata": {"by": "beta"}}}]
    if method == "POST" and path.endswith("/items"):  # valid items
        return [{"json": {"items": [{"role": "user", "content": "from beta"}]}}]
    return [{}]


def call(client: httpx.Client, method: str, path: str, param: str, object_id: str,
         alphas: dict[str, list[str]] | None = None, **kwargs: Any) -> httpx.Response:
    """The route with `param` as `object_id`, and any other id in it (an item's conversation) alpha's own."""
    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        return object_id if name == param or alphas is None else alphas[name][0]
    return client.request(method, re.sub(r"{(\w+)(?::\w+)?}", fill, path), **kwargs)


@pytest.mark.parametrize(("method", "path", "param"), ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
def test_another_tenants_object_is_a_404_exactly_like_a_missing_id(tiers: Tiers, alphas: dict[str, list[str]],
                                                                   method: str, path: str, param: str) -> None:
    beta = http(tiers, BETA)
    for object_id in alphas[param]:
        for kwargs in variants(method, path):
            missing = call(beta, method, path, param, NEVER[param], alphas, **kwargs)
            theirs = call(beta, method, path, param, object_id, alphas, **kwargs)
            assert missing.status_code == 404, missing.text
            assert theirs.status_code == 404, (object_id, theirs.text)
            assert theirs.json() == orjson.loads(missing.content.replace(NEVER[param].encode(), object_id.encode()))
            assert theirs.headers.get("content-type") == missing.headers.get("content-type")
    a = http(tiers, ALPHA)
    for object_id in alphas[param]:  # still there for alpha, whatever beta tried (delete and cancel included)
        reads = {"response_id": "/v1/responses/{}", "file_id": "/v1/files/{}", "batch_id": "/v1/batches/{}",
                 "video_id": "/v1/videos/{}", "conversation_id": "/v1/conversations/{}",
                 "item_id": f"/v1/conversations/{alphas['conversation_id'][0]}/items/{{}}"}
        assert a.get(reads[param].format(object_id)).status_code == 200


def test_lists_hold_only_your_own_and_the_admin_sees_all(tiers: Tiers, alphas: dict[str, list[str]]) -> None:
    b, a, admin = sdk(tiers, BETA), sdk(tiers, ALPHA), sdk(tiers, ADMIN)
    mine = b.files.create(file=("b.jsonl", io.BytesIO(b"{}\n")), purpose="batch")
    assert [f.id for f in b.files.list()] == [mine.id]
    assert [x.id for x in b.batches.list()] == []
    assert [v.id for v in b.videos.list()] == [] and alphas["video_id"] == [v.id for v in a.videos.list()]
    assert set(alphas["file_id"]) <= {f.id for f in a.files.list()} and mine.id not in {f.id for f in a.files.list()}
    assert alphas["batch_id"] == [x.id for x in a.batches.list()]
    everyone = {f.id for f in admin.files.list()}
    assert {mine.id, *alphas["file_id"]} <= everyone
    assert admin.batches.retrieve(alphas["batch_id"][0]).id == alphas["batch_id"][0]
    assert admin.responses.retrieve(alphas["response_id"][0]).id == alphas["response_id"][0]
    # A batch of another tenant's input file is refused as one of a file that does not exist.
    refusals = []
    for file_id in (alphas["file_id"][0], NEVER["file_id"]):
        with pytest.raises(openai.BadRequestError) as caught:
            b.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
        refusals.append(orjson.dumps(caught.value.body).replace(file_id.encode(), b"ID"))
    assert refusals[0] == refusals[1]
    assert b.files.delete(mine.id).deleted


def test_previous_response_id_of_another_tenant_is_not_found(tiers: Tiers, alphas: dict[str, list[str]]) -> None:
    b = sdk(tiers, BETA)
    errors = []
    for previous in (alphas["response_id"][0], NEVER["response_id"]):
        with pytest.raises(openai.NotFoundError) as caught:
            b.responses.create(model=TINY, input="and then?", previous_response_id=previous, max_output_tokens=16)
        errors.append(orjson.dumps(caught.value.body).replace(previous.encode(), b"ID"))
    assert errors[0] == errors[1]
    counts = []  # counting a chain's input tokens reads the chain: the same rule
    for previous in (alphas["response_id"][0], NEVER["response_id"]):
        with pytest.raises(openai.NotFoundError) as caught:
            b.responses.input_tokens.count(model=TINY, input="and then?", previous_response_id=previous)
        counts.append(orjson.dumps(caught.value.body).replace(previous.encode(), b"ID"))
    assert counts[0] == counts[1]
    compacts = []  # compacting a chain reads it: the same rule
    for previous in (alphas["response_id"][0], NEVER["response_id"]):
        with pytest.raises(openai.NotFoundError) as caught:
            b.responses.compact(model=TINY, input="and then?", previous_response_id=previous)
        compacts.append(orjson.dumps(caught.value.body).replace(previous.encode(), b"ID"))
    assert compacts[0] == compacts[1]
    a = sdk(tiers, ALPHA)  # alpha's chain goes on
    assert a.responses.input_tokens.count(model=TINY, input="and then?",
                                          previous_response_id=alphas["response_id"][0]).input_tokens > 0
    chained = a.responses.create(model=TINY, input="and then?", previous_response_id=alphas["response_id"][0],
                                 max_output_tokens=16)
    assert chained.previous_response_id == alphas["response_id"][0] and chained.output


def test_a_response_in_another_tenants_conversation_is_not_found(tiers: Tiers, alphas: dict[str, list[str]]) -> None:
    """Beta's response (or token count) with alpha's conversation: a 404 exactly like a conversation that never
    existed, and nothing added to alpha's."""
    b = sdk(tiers, BETA)
    for count in (False, True):
        errors = []
        for conversation in (alphas["conversation_id"][0], NEVER["conversation_id"]):
            with pytest.raises(openai.NotFoundError) as caught:
                if count:
                    b.responses.input_tokens.count(model=TINY, input="and then?", conversation=conversation)
                else:
                    b.responses.create(model=TINY, input="and then?", conversation=conversation, max_output_tokens=16)
            errors.append(orjson.dumps(caught.value.body).replace(conversation.encode(), b"ID"))
        assert errors[0] == errors[1]
    a = sdk(tiers, ALPHA)
    assert [item.id for item in a.conversations.items.list(alphas["conversation_id"][0])] == alphas["item_id"]
    assert a.conversations.retrieve(alphas["conversation_id"][0]).metadata == {}  # beta's update did not land


def resumable(client: httpx.Client, headers: dict[str, str], body: dict[str, Any] = CHAT) -> tuple[int, bytes, list]:
    """A streamed chat request: its status, its body when refused, else its events' (id, data) up to the third."""
    with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        if response.status_code != 200:
            return response.status_code, response.read(), []
        events, event_id = [], None
        for text in sse.lines(response):
            if text.startswith("id: "):
                event_id = text[4:]
            elif text.startswith("data: "):
                events.append((event_id, text[6:]))
                if len(events) >= 3:
                    break
        return 200, b"", events


def test_a_chat_stream_resumes_only_for_its_owner(tiers: Tiers) -> None:
    """Beta's request with alpha's Last-Event-ID (and X-Ovq-Resumable) is a 404 like an unknown job's; alpha
    resumes it and gets the rest."""
    a, b = http(tiers, ALPHA), http(tiers, BETA)
    status, _, events = resumable(a, {"X-Ovq-Resumable": "true"})
    assert status == 200 and events[-1][0], events
    last = events[-1][0]
    job = last.rsplit(":", 1)[0]
    refusals = []
    for given in (last, f"chat-0123456789abcdef0123456789abcdef:{last.rsplit(':', 1)[1]}"):
        status, body, _ = resumable(b, {"Last-Event-ID": given, "X-Ovq-Resumable": "true"})
        assert status == 404, body
        refusals.append(body.replace(given.rsplit(":", 1)[0].encode(), b"JOB"))
    assert refusals[0] == refusals[1]
    with a.stream("POST", "/v1/chat/completions", json=CHAT, headers={"Last-Event-ID": last}) as response:
        assert response.status_code == 200 and response.headers["x-request-id"] == job
        assert "data: [DONE]" in list(sse.lines(response))


def test_a_batch_runs_as_its_owner(tiers: Tiers) -> None:
    """Gamma's batch, run by a batch worker whose key is another tenant's (`runner`): its lines take from gamma's
    token quota, none from runner's, wait in fair order as gamma's, and its output file is gamma's."""
    g, r = sdk(tiers, GAMMA), tiers.redis()
    line = {"custom_id": "x", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}}
    uploaded = g.files.create(file=("g.jsonl", io.BytesIO(orjson.dumps(line) + b"\n")), purpose="batch")
    batch = wait_batch(g, g.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                           completion_window="24h").id)
    assert batch.status == "completed" and batch.request_counts.completed == 1, batch
    assert r.exists(tiers.keys.quota("gamma")) and not r.exists(tiers.keys.quota("runner"))
    # ... and it waited in fair order at the batch level as gamma's (its virtual finish time is gamma's).
    clock = r.hgetall(tiers.keys.fair_clock(TINY, "CPU", "batch"))
    assert b"f:gamma" in clock and b"f:runner" not in clock, clock
    assert g.files.content(batch.output_file_id).content  # gamma's to read
    with pytest.raises(openai.NotFoundError):
        sdk(tiers, BETA).files.content(batch.output_file_id)
    # Claiming to be a batch's line takes its run token, which only what reads Redis (a batch worker) knows.
    forged = http(tiers, BETA).post("/v1/chat/completions", json={**line["body"]},
                                    headers={"X-Ovq-Batch": f"{batch.id}:{'0' * 32}", "X-Ovq-Priority": "batch"})
    assert forged.status_code == 403 and forged.json()["error"]["code"] == "batch_not_runnable", forged.text


def test_objects_stored_before_owners_are_the_admins_only(tiers: Tiers, alphas: dict[str, list[str]]) -> None:
    a, admin, r = http(tiers, ALPHA), http(tiers, ADMIN), tiers.redis()
    stored = a.post("/v1/responses", json={"model": TINY, "input": "hi", "max_output_tokens": 16}).json()
    r.hdel(tiers.keys.response(stored["id"]), "owner")  # as a response stored by an older ovq
    assert a.get(f"/v1/responses/{stored['id']}").status_code == 404
    assert admin.get(f"/v1/responses/{stored['id']}").status_code == 200


def test_the_ops_page_and_the_cli_say_whose_each_object_is(tiers: Tiers, alphas: dict[str, list[str]]) -> None:
    panel = httpx.get(f"http://127.0.0.1:{tiers.port}/ops/panel", auth=("admin", ADMIN), timeout=30).text
    for object_id in (alphas["batch_id"][0], alphas["file_id"][0], alphas["response_id"][1]):
        row = re.search(rf'data-\w+="{object_id}">.*?</tr>', panel, re.S)
        assert row and '<td data-k="owner">alpha</td>' in row.group(0), object_id
    for listing, object_id in (("files", alphas["file_id"][0]), ("batches", alphas["batch_id"][0]),
                               ("background", alphas["response_id"][1])):
        out = subprocess.run([sys.executable, "-m", "cli.main", "jobs", listing, "--json"], env=tiers.env,
                             capture_output=True, check=True, cwd=ROOT).stdout
        assert {x["id"]: x["owner"] for x in orjson.loads(out)}[object_id] == "alpha", listing


def test_a_loopback_api_answers_only_its_own_host_names(tiers: Tiers) -> None:
    """DNS rebinding: `Host: evil.example` is refused on /v1, /v3 (the generation path too) and /ops alike."""
    base, auth = f"http://127.0.0.1:{tiers.port}", {"Authorization": f"Bearer {ALPHA}"}
    for host in ("evil.example", f"evil.example:{tiers.port}"):
        for method, path in (("GET", "/v1/models"), ("POST", "/v3/chat/completions"), ("GET", "/ops")):
            body = {**CHAT, "stream": False, "max_tokens": 2} if method == "POST" else None
            refused = httpx.request(method, base + path, json=body, headers={**auth, "Host": host}, timeout=30)
            assert refused.status_code == 403 and refused.json()["error"]["code"] == "host_not_allowed", refused.text
    for host in (f"localhost:{tiers.port}", f"127.0.0.1:{tiers.port}", "ovq.internal"):  # and the allowed name
        assert httpx.get(base + "/v1/models", headers={**auth, "Host": host}, timeout=30).status_code == 200, host


def test_operator_actions_refuse_cross_site_requests(tiers: Tiers) -> None:
    """A page elsewhere cannot make the browser purge the dead letters, even with the admin's credentials."""
    url, admin = f"http://127.0.0.1:{tiers.port}/ops/dead/purge", ("admin", ADMIN)
    for headers in ({"Sec-Fetch-Site": "cross-site", "Origin": "http://evil.example"},
                    {"Sec-Fetch-Site": "same-site"}, {"Origin": "http://evil.example"}, {"Origin": "null"}):
        refused = httpx.post(url, auth=admin, headers=headers, timeout=30)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "cross_site_request", headers
    for headers in ({"Sec-Fetch-Site": "same-origin"}, {"Origin": f"http://127.0.0.1:{tiers.port}"}, {}):
        assert httpx.post(url, auth=admin, headers=headers, timeout=30).status_code == 303, headers
