"""The ops page in a real headless browser (the system's Chromium, driven by Playwright; never a downloaded
browser): it loads with no console error and nothing from elsewhere, its numbers agree with Redis during a load,
its buttons retry and purge dead letters and drain a worker, it fits a 1280 px laptop screen without a horizontal
scrollbar (the page and the queues table's box), and every rate names its window. Screenshots are saved and their
paths printed."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from openai import OpenAI

from common.jobs import Job, SamplingParams
from common.keys import GROUP, Keys
from common.redis.client import describe
from tests.conftest import MODEL, Tiers

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
STREAMS, TOKENS = 6, 96
LAPTOP = {"width": 1280, "height": 800}


def _installed() -> str | None:
    """Chromium from Debian and the Playwright package (its driver only); None when both are there, else why not."""
    if not os.path.exists(CHROMIUM) and shutil.which("apt-get") and os.geteuid() == 0:
        print("installing Debian's chromium for the ops page test", file=sys.stderr)
        subprocess.run(["apt-get", "install", "-y", "chromium"], capture_output=True, timeout=900)
    if not os.path.exists(CHROMIUM):
        return f"no {CHROMIUM} (apt-get install -y chromium) and it could not be installed here"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        print("installing the playwright package for the ops page test", file=sys.stderr)
        done = subprocess.run([sys.executable, "-m", "pip", "install", "playwright"], capture_output=True,
                              timeout=600)
        if done.returncode != 0:
            return "the playwright package is missing and could not be installed (pip install playwright)"
    return None


@pytest.fixture()
def browser() -> Iterator[Any]:
    why = _installed()
    if why:
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


class Load:
    """Concurrent streaming chats, each recording how it finished."""

    def __init__(self, base_url: str) -> None:
        self.client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=180)
        self.results: list[Any] = [None] * STREAMS
        self.threads = [threading.Thread(target=self._one, args=(i,), daemon=True) for i in range(STREAMS)]
        for thread in self.threads:
            thread.start()

    def _one(self, i: int) -> None:
        try:
            stream = self.client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"Count from {i}."}], max_tokens=TOKENS,
                stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
            self.results[i] = [c.usage.completion_tokens for c in stream if c.usage][-1]
        except Exception as exc:
            self.results[i] = f"{type(exc).__name__}: {exc}"

    def finished(self) -> list[Any]:
        for thread in self.threads:
            thread.join(180)
        return self.results


def redis_numbers(r: redis.Redis, keys: Keys, worker: str) -> tuple[int, int, int, int]:
    """(waiting, in flight, live workers, the worker's running jobs), read as an operator would by hand."""
    stream = keys.jobs(MODEL, "CPU")
    length, pending = r.xlen(stream), r.xpending(stream, GROUP)["pending"]
    live = r.zcount(keys.workers(MODEL, "CPU"), time.time() - 3, "+inf")
    return length - pending, pending, live, int(r.hget(keys.worker(worker), "running") or -1)


def page_numbers(page: Any, worker: str) -> tuple[int, int, int, int]:
    row = page.locator(f'tr[data-stream="{MODEL}:CPU"]')
    cells = [row.locator(f'[data-k="{k}"]').inner_text() for k in ("waiting", "in-flight", "workers")]
    running = page.locator(f'tr[data-worker="{worker}"] [data-k="running"]').inner_text()
    return (*(int(c) for c in cells), int(running))


def assert_fits(page: Any, when: str) -> None:
    """No horizontal scrollbar: neither the page nor the queues table's box is wider than what it shows."""
    widths = page.evaluate("""() => {
        const page = document.documentElement, queues = document.getElementById('streams-table');
        return {page: [page.scrollWidth, page.clientWidth], queues: [queues.scrollWidth, queues.clientWidth]};
    }""")
    for box, (scroll, client) in widths.items():
        assert scroll <= client, f"{when}: the {box} scrolls sideways at {LAPTOP['width']} px ({scroll} > {client})"


def rate_labels(page: Any) -> dict[str, str]:
    """Each rate's column header (or the chart's legend): what window it says it is over."""
    queues = [h.inner_text() for h in page.locator("#streams th").all()]
    workers = [h.inner_text() for h in page.locator("#workers th").all()]
    return {"queue tokens/s": next(h for h in queues if h.startswith("tokens/s\n")),
            "queue requests/s": next(h for h in queues if h.startswith("requests/s")),
            "chart": next(h for h in queues if h.startswith("tokens/s, requests/s")),
            "worker tokens/s": next(h for h in workers if h.startswith("tokens/s"))}


def next_refresh(page: Any) -> None:
    version = page.evaluate("() => Number(document.getElementById('panel').dataset.version || 0)")
    page.wait_for_function("v => Number(document.getElementById('panel').dataset.version || 0) > v", arg=version,
                           timeout=15_000)


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:.0f}s: {what}"
        time.sleep(0.25)


def test_the_ops_page_shows_what_redis_holds_and_steers_the_queue(
        tiers: Callable[..., Tiers], model_dir: Path, redis_client: redis.Redis, browser: Any,
        tmp_path: Path) -> None:
    t = tiers({MODEL: {"path": str(model_dir), "cache_size": 0, "max_num_seqs": 2}})
    t.api()
    worker_proc = t.worker(MODEL)
    t.wait_served(MODEL)
    keys = t.keys
    [worker] = [m.decode() for m in redis_client.zrange(keys.workers(MODEL, "CPU"), 0, -1)]
    poison = Job(model=MODEL, device="CPU", kind="completion", prompt="a", params=SamplingParams(max_tokens=2),
                 reply_to="nobody")
    letter = redis_client.xadd(keys.dead, {**poison.to_fields(), "reason": "delivered too often"}).decode()
    redis_client.xadd(keys.dead, {"job": b"{", "reason": b"unreadable"})

    origin = f"http://127.0.0.1:{t.port}"
    page = browser.new_page(viewport=LAPTOP)
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("request", lambda r: None if r.url.startswith(origin) else problems.append(f"request to {r.url}"))
    page.on("dialog", lambda d: d.accept())
    page.goto(f"{origin}/ops")
    assert page.title() == "ovq · operations"
    assert page.locator(f'tr[data-stream="{MODEL}:CPU"]').count() == 1
    # The queue's node: the Redis, or on a Cluster the master that owns the queue's slot.
    node = redis_client.get_node_from_key(keys.jobs(MODEL, "CPU")).name if keys.cluster else describe(t.redis_url)
    assert page.locator(f'tr[data-stream="{MODEL}:CPU"] [data-k="node"]').inner_text() == node
    assert page.locator('[data-k="dead-total"]').inner_text() == "2"

    # A job the worker refuses (its prompt is longer than the model's context): a failure with its error.
    refused = Job(model=MODEL, device="CPU", kind="completion", prompt=[1] * 9000, reply_to="nobody")
    redis_client.xadd(keys.jobs(MODEL, "CPU"), refused.to_fields())
    wait_for(lambda: redis_client.hget(keys.job(refused.id, MODEL), "status") == b"error", 30,
             "the long prompt refused")

    load = Load(t.base_url)
    agreed = None
    deadline = time.monotonic() + 90
    while agreed is None and time.monotonic() < deadline:
        # Redis read just before and just after the page is rendered: equal, the page had no other choice.
        before = redis_numbers(redis_client, keys, worker)
        page.reload()
        after = redis_numbers(redis_client, keys, worker)
        shown = page_numbers(page, worker)
        if before == shown == after and before[1] > 0:  # with jobs in flight
            agreed = shown
    assert agreed is not None, "the page's numbers never matched Redis during the load"
    failure = page.locator(f'tr[data-failed="{refused.id}"] .error').inner_text()
    stored = redis_client.hget(keys.job(refused.id, MODEL), "error").decode()
    assert failure == stored.split('"message":"')[1].split('"')[0]
    assert agreed[2] == 1 and agreed[1] <= 2
    assert_fits(page, "under load")
    screenshot = tmp_path / "ops-page.png"
    page.screenshot(path=str(screenshot), full_page=True)
    print(f"\nops page screenshot (under load, waiting/in flight/workers/running = {agreed}): {screenshot}")

    assert load.finished() == [TOKENS] * STREAMS
    # The workers' stats windows reach the page: every job done, a rate and first-token latencies.
    def stats_shown() -> bool:
        next_refresh(page)
        row = page.locator(f'tr[data-stream="{MODEL}:CPU"]')
        return int(row.locator('[data-k="done"]').inner_text()) >= STREAMS and \
            float(row.locator('[data-k="tokens-per-s"]').inner_text()) > 0
    wait_for(stats_shown, 30, "the jobs' stats on the page")
    assert "–" not in page.locator(f'tr[data-stream="{MODEL}:CPU"] [data-k="ttft"]').inner_text()
    assert_fits(page, "after the load, every number shown")
    labels = rate_labels(page)
    assert "last 1 min" in labels["queue tokens/s"] and "last 1 min" in labels["queue requests/s"], labels
    assert "last 5 min" in labels["chart"] and "per 10 s" in labels["chart"], labels
    assert "last 10 s" in labels["worker tokens/s"], labels
    after_load = tmp_path / "ops-page-after-load.png"
    page.screenshot(path=str(after_load), full_page=True)
    print(f"ops page screenshot (after the load: rates, latencies, the failure): {after_load}")

    page.locator(f'tr[data-dead="{letter}"] button').click()
    page.wait_for_selector("#flash:not([hidden])")
    assert "queued again" in page.locator("#flash").inner_text()
    wait_for(lambda: redis_client.hget(keys.job(poison.id, MODEL), "status") == b"done", 60, "the retried job ran")
    page.locator("#dead button.danger").click()
    wait_for(lambda: not redis_client.exists(keys.dead), 10, "dead letters purged")
    next_refresh(page)
    next_refresh(page)
    assert page.locator('[data-k="dead-total"]').inner_text() == "0"

    page.locator(f'tr[data-worker="{worker}"] form[action$="/drain"] button').click()  # beside it: sleep
    assert worker_proc.wait(60) == 0
    wait_for(lambda: (next_refresh(page), page.locator("#workers .empty").count())[1] == 1, 30,
             "the drained worker gone from the page")
    assert problems == []
