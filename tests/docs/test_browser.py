"""The site reads well in a real browser: headless Chromium at 1280 px renders the home page, a guide and a
reference page without horizontal scroll, and search answers with no network beyond the loopback server. The
screenshots go to `$CI_ARTIFACTS/screenshots`, else `build/screenshots`."""
from __future__ import annotations

import functools
import os
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
LAPTOP = {"width": 1280, "height": 800}
PAGES = {"home": "", "guide": "how-to/tenants/", "reference": "reference/settings/"}
SHOTS = Path(os.environ.get("CI_ARTIFACTS") or ROOT / "build") / "screenshots"


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def served(site) -> Iterator[str]:
    """The built site on a loopback port, as `mkdocs serve` or any static host would serve it."""
    assert site.returncode == 0, site.log[-2000:]
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site.path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()


@pytest.fixture()
def page() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no {CHROMIUM}: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            context = browser.new_context(viewport=LAPTOP)
            yield context.new_page()
        finally:
            browser.close()


def _offline(page: Any, base: str) -> list[str]:
    """Refuse every request that leaves the loopback server (fonts, CDNs): the site must work without them."""
    refused: list[str] = []

    def route(request_route: Any) -> None:
        url = request_route.request.url
        if url.startswith(base):
            request_route.continue_()
        else:
            refused.append(url)
            request_route.abort()

    page.route("**/*", route)
    return refused


def test_pages_fit_1280_px_and_search_works_offline(served: str, page: Any) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    refused = _offline(page, served)
    SHOTS.mkdir(parents=True, exist_ok=True)
    for name, path in PAGES.items():
        page.goto(served + path, wait_until="load")
        overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        page.screenshot(path=str(SHOTS / f"docs-{name}.png"), full_page=False)
        assert overflow <= 0, f"{path or 'home'} scrolls sideways by {overflow} px at 1280 px"
        assert page.locator("article h1").count() == 1, f"{path or 'home'} has no title"
    page.goto(served, wait_until="load")
    search = page.locator("input.md-search__input")  # in the header at this width
    first = page.locator(".md-search-result__item a").first
    for _ in range(12):  # the search worker loads its index in the background: typing before it is ready finds nothing
        search.click()
        search.fill("")
        search.type("fencing")
        try:
            first.wait_for(timeout=5_000)
            break
        except PlaywrightTimeout:
            continue
    page.screenshot(path=str(SHOTS / "docs-search.png"))
    assert "durability" in first.get_attribute("href")
    assert not refused, f"the site asked the network for: {refused}"
