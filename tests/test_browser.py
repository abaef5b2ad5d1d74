"""The app in a real browser: ``streamlit run app.py`` served on 127.0.0.1, opened in headless
Chromium driven by Playwright (sync API).

Every page of the app (the links of the sidebar or top navigation of a multipage app; the
main page alone when there are none) is visited, left to finish its script run, checked for
an exception element, and kept as a full-page screenshot under the test's ``tmp_path``
(and copied to ``$SIMDIST_SCREENSHOTS`` when that is set).

The browser is Debian's ``chromium`` package (Playwright cannot download its own browsers
here); ``.ci/run`` installs it when missing. The test skips, saying why, only where Chromium
or Playwright is missing. ``$SIMDIST_CHROMIUM`` names another Chromium executable.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "app.py"

START_TIMEOUT = 90.0   # s for the server to answer (a cold import of torch + streamlit on a loaded machine)
RUN_TIMEOUT_MS = 90_000  # for one page's script run to finish
DONE = ('[data-testid="stApp"][data-test-connection-state="CONNECTED"]'
        ':is([data-test-script-state="notRunning"], [data-test-script-state="compilationError"])')
DRAWN = '[data-testid="stMain"] [data-testid="stElementContainer"]'
PAGE_LINKS = ('[data-testid="stSidebarNav"] a[href], a[data-testid="stSidebarNavLink"][href], '
              'a[data-testid="stTopNavLink"][href]')


def _chromium() -> str | None:
    for candidate in (os.environ.get("SIMDIST_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                      shutil.which("chromium-browser")):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def chromium_path() -> str:
    pytest.importorskip("streamlit", reason="the app extra (streamlit) is not installed")
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed (it is in the test extra: "
                                                      "bash install.sh)")
    path = _chromium()
    if path is None:
        pytest.skip("no Chromium at /usr/bin/chromium or on PATH (Debian: apt-get install chromium; .ci/run "
                    "installs it where it can; Playwright cannot download its own browsers here)")
    return path


@pytest.fixture(scope="module")
def app_url(chromium_path, tmp_path_factory):
    """``streamlit run app.py`` on a free port of 127.0.0.1; yields its URL; always terminated."""
    log_path = tmp_path_factory.mktemp("streamlit") / "server.log"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, STREAMLIT_BROWSER_GATHER_USAGE_STATS="false", PYTHONUNBUFFERED="1")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", str(APP), "--server.headless", "true",
             "--server.port", str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
             "--server.fileWatcherType", "none"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not _healthy(url):
            if proc.poll() is not None:
                pytest.fail(f"streamlit exited with {proc.returncode} before serving:\n{log_path.read_text()}")
            if time.monotonic() > deadline:
                pytest.fail(f"streamlit did not answer on {url} within {START_TIMEOUT:.0f} s:\n{log_path.read_text()}")
            time.sleep(0.5)
        yield url
    finally:
        _terminate(proc)


def _terminate(proc: subprocess.Popen) -> None:
    """Stops the server: SIGTERM, then SIGKILL after 15 s."""
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=15)


def _wait_for_run(page) -> None:
    """Waits until the page's script run is over and what it drew has settled.

    The script state can read "notRunning" for a moment before the first run starts, so the
    wait also needs something drawn in the main section and the same number of elements on
    two looks one second apart, each taken with the run over.
    """
    page.wait_for_selector(DONE, state="attached", timeout=RUN_TIMEOUT_MS)
    page.wait_for_selector(DRAWN, state="attached", timeout=RUN_TIMEOUT_MS)
    deadline = time.monotonic() + RUN_TIMEOUT_MS / 1000
    last = -1
    while time.monotonic() < deadline:
        page.wait_for_selector(DONE, state="attached", timeout=RUN_TIMEOUT_MS)
        page.wait_for_selector('[data-testid="stStatusWidget"]', state="hidden", timeout=RUN_TIMEOUT_MS)
        count = page.locator(DRAWN).count()
        if count == last:
            break
        last = count
        page.wait_for_timeout(1_000)
    try:  # plotly and dataframes draw after the run; a websocket keeps "networkidle" from being certain
        page.wait_for_load_state("networkidle", timeout=10_000)
    except Exception:
        pass
    page.wait_for_timeout(1_000)


def _page_links(page, base: str) -> list[str]:
    more = page.locator('[data-testid="stSidebarNavViewButton"]')
    if more.count() and more.first.is_visible() and "more" in (more.first.inner_text() or "").lower():
        more.first.click()  # the sidebar lists only the first pages until "View more" is clicked
        page.wait_for_timeout(500)
    hrefs = page.eval_on_selector_all(PAGE_LINKS, "els => els.map(e => e.href)")
    urls = []
    for href in hrefs:
        if href.startswith(base) and href not in urls:
            urls.append(href)
    return urls


def _full_page_screenshot(page, path: Path) -> None:
    """Streamlit scrolls inside its main section, not the document: grow the viewport to show it all."""
    height = page.evaluate("""() => Math.max(document.documentElement.scrollHeight,
        ...[...document.querySelectorAll('[data-testid="stMain"], [data-testid="stAppViewContainer"],'
                                         + ' [data-testid="stSidebarContent"]')].map(e => e.scrollHeight))""")
    size = page.viewport_size
    page.set_viewport_size({"width": size["width"], "height": max(size["height"], min(int(height) + 40, 8000))})
    page.wait_for_timeout(500)
    page.screenshot(path=str(path), full_page=True)
    page.set_viewport_size(size)


def _slug(url: str, base: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", url[len(base):].strip("/")) or "main"


@pytest.mark.timeout(180)
def test_every_page_renders_without_an_exception(app_url, chromium_path, tmp_path):
    from playwright.sync_api import sync_playwright

    shots = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path, headless=True,
                                     args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page_errors = []
            page.on("pageerror", lambda err: page_errors.append(str(err)))
            page.goto(app_url + "/", wait_until="domcontentloaded", timeout=60_000)
            _wait_for_run(page)
            urls = _page_links(page, app_url) or [page.url]
            for i, url in enumerate(urls):
                if i or page.url.rstrip("/") != url.rstrip("/"):
                    page.goto(url, wait_until="domcontentloaded", timeout=60_000)
                    _wait_for_run(page)
                shot = tmp_path / f"{i:02d}_{_slug(url, app_url)}.png"
                _full_page_screenshot(page, shot)
                shots.append(shot)
                exceptions = page.locator('[data-testid="stException"]')
                assert exceptions.count() == 0, (
                    f"{url} shows an exception (screenshot {shot}):\n" + "\n---\n".join(exceptions.all_inner_texts())
                    + ("\nbrowser errors:\n" + "\n".join(page_errors) if page_errors else ""))
        finally:
            browser.close()
            out = os.environ.get("SIMDIST_SCREENSHOTS")
            if out and shots:
                os.makedirs(out, exist_ok=True)
                for shot in shots:
                    shutil.copy(shot, out)
    assert shots and all(s.stat().st_size > 10_000 for s in shots), shots


@pytest.mark.timeout(180)
def test_traces_page_shows_an_uploaded_trace(app_url, chromium_path, tmp_path):
    """The one widget AppTest cannot drive: a simdist trace file uploaded through the browser."""
    from playwright.sync_api import sync_playwright

    import simdist as dist

    res = dist.simulate(_two_rank_all_reduce, 2, seed=0)
    good = tmp_path / "run.trace.json"
    good.write_text(res.trace.to_json())
    bad = tmp_path / "not_a_trace.json"
    bad.write_text('{"hello": 1}')
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path, headless=True,
                                     args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(app_url + "/traces", wait_until="domcontentloaded", timeout=60_000)
            _wait_for_run(page)
            upload = page.locator('[data-testid="stFileUploaderDropzoneInput"]')
            upload.set_input_files(str(good))
            page.get_by_text(f"{len(res.trace)}", exact=True).wait_for(timeout=RUN_TIMEOUT_MS)
            _wait_for_run(page)
            assert page.locator('[data-testid="stException"]').count() == 0
            page.screenshot(path=str(tmp_path / "uploaded.png"), full_page=True)
            upload.set_input_files(str(bad))
            page.get_by_text("was left out: it is JSON but not a simdist trace", exact=False).wait_for(
                timeout=RUN_TIMEOUT_MS)
            assert page.locator('[data-testid="stException"]').count() == 0
        finally:
            browser.close()


def _two_rank_all_reduce(rank):
    import torch

    import simdist as dist

    dist.init_process_group("gloo")
    t = torch.ones(3)
    dist.all_reduce(t)
    dist.destroy_process_group()
