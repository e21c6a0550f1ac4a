"""The documentation site as a reader sees it: built strictly, served, opened in headless Chromium, searched."""

from __future__ import annotations

import functools
import http.server
import shutil
import subprocess
import sys
import threading

import pytest

from conftest import REPO

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
#: As a sandboxed root process on a machine without a network: no sandbox, GPU or background connections.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site built with mkdocs --strict, served on a loopback port for the module's tests."""
    pytest.importorskip("mkdocs", reason="the [docs] extra is not installed")
    folder = tmp_path_factory.mktemp("site")
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(folder)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("no Chromium here (Debian: apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


def test_the_site_renders_navigates_and_searches(site, browser):
    page = browser.new_page()
    failed = []
    # A request the browser dropped itself because the page moved on (net::ERR_ABORTED: the next page was asked
    # for before this one's search worker had loaded) is no failure of the site; any other is.
    page.on(
        "requestfailed",
        lambda request: None if "ERR_ABORTED" in (request.failure or "") else failed.append(request.url),
    )
    page.on("pageerror", lambda error: failed.append(str(error)))
    page.goto(site + "/")
    assert page.title().startswith("xarray-tfrecords")
    # Navigation: the sidebar leads to a guide, and the guide's own links work.
    page.get_by_role("link", name="What one sample is").first.click()
    page.wait_for_url("**/guides/samples/")
    assert page.locator("h1").inner_text().rstrip("¶") == "What one sample is"
    page.locator("article a[href$='splits/']").first.click()
    page.wait_for_url("**/guides/splits/")
    # Search, typed key by key as a reader types: Material sends the query to its worker on keyup (and re-reads the
    # box when the worker becomes ready or the box gains focus). page.fill sends no keyup: with the worker ready
    # first and the focus read before the text went in (a race lost under load), its query never reached the worker.
    page.locator("input.md-search__input").press_sequentially("shuffle")
    # The answer to the whole query, not to a prefix typed on the way: its links carry the query to highlight.
    page.wait_for_selector(".md-search-result__item a[href$='?h=shuffle']", timeout=60_000)
    assert int(page.locator(".md-search-result__meta").inner_text().split()[0]) >= 3
    page.locator(".md-search-result__item a").first.click()
    page.wait_for_load_state()
    assert page.url.startswith(site) and page.locator("h1").count() == 1
    # The API reference is rendered from the docstrings.
    page.goto(site + "/reference/api/")
    assert page.locator("h3#schemas.dataset.load_dataset, [id='schemas.dataset.load_dataset']").count() >= 1
    assert not failed, failed  # nothing fetched from outside the site, no script error
