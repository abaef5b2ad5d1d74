"""What the browser tests share: the app served on 127.0.0.1, Chromium, and waiting for a page.

``app_url`` runs ``streamlit run app.py`` on a free port of 127.0.0.1 (one server per test
module); ``chromium_path`` finds Debian's ``chromium`` (Playwright cannot download its own
browsers here; ``.ci/run`` installs it when missing; ``$SIMDIST_CHROMIUM`` names another),
and both skip, saying why, where Chromium, Playwright or Streamlit is missing. The helpers
drive Playwright's sync API.
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

__all__ = [
    "APP",
    "DONE",
    "DRAWN",
    "LAUNCH_ARGS",
    "PAGE_LINKS",
    "ROOT",
    "RUN_TIMEOUT_MS",
    "SKELETON",
    "START_TIMEOUT",
    "app_url",
    "chromium",
    "chromium_path",
    "free_port",
    "full_page_screenshot",
    "healthy",
    "page_links",
    "slug",
    "wait_for_run",
]

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app.py"

START_TIMEOUT = 90.0  # s for the server to answer (a cold import of torch + streamlit on a loaded machine)
RUN_TIMEOUT_MS = 90_000  # for one page's script run to finish
DONE = (
    '[data-testid="stApp"][data-test-connection-state="CONNECTED"]'
    ':is([data-test-script-state="notRunning"], [data-test-script-state="compilationError"])'
)
DRAWN = '[data-testid="stMain"] [data-testid="stElementContainer"]'
SKELETON = '[data-testid="stSkeleton"]'  # what stands in for an element whose code is still loading
LAUNCH_ARGS = ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"]
PAGE_LINKS = (
    '[data-testid="stSidebarNav"] a[href], a[data-testid="stSidebarNavLink"][href], a[data-testid="stTopNavLink"][href]'
)


def chromium() -> str | None:
    for candidate in (
        os.environ.get("SIMDIST_CHROMIUM"),
        "/usr/bin/chromium",
        shutil.which("chromium"),
        shutil.which("chromium-browser"),
    ):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def chromium_path() -> str:
    pytest.importorskip("streamlit", reason="the app extra (streamlit) is not installed")
    pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (it is in the test extra: bash install.sh)"
    )
    path = chromium()
    if path is None:
        pytest.skip(
            "no Chromium at /usr/bin/chromium or on PATH (Debian: apt-get install chromium; .ci/run "
            "installs it where it can; Playwright cannot download its own browsers here)"
        )
    return path


@pytest.fixture(scope="module")
def app_url(chromium_path, tmp_path_factory):
    """``streamlit run app.py`` on a free port of 127.0.0.1; yields its URL; always terminated."""
    log_path = tmp_path_factory.mktemp("streamlit") / "server.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, STREAMLIT_BROWSER_GATHER_USAGE_STATS="false", PYTHONUNBUFFERED="1")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "streamlit",
                "run",
                str(APP),
                "--server.headless",
                "true",
                "--server.port",
                str(port),
                "--server.address",
                "127.0.0.1",
                "--browser.gatherUsageStats",
                "false",
                "--server.fileWatcherType",
                "none",
            ],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not healthy(url):
            if proc.poll() is not None:
                pytest.fail(f"streamlit exited with {proc.returncode} before serving:\n{log_path.read_text()}")
            if time.monotonic() > deadline:
                pytest.fail(f"streamlit did not answer on {url} within {START_TIMEOUT:.0f} s:\n{log_path.read_text()}")
            time.sleep(0.5)
        yield url
    finally:
        terminate(proc)


def terminate(proc: subprocess.Popen) -> None:
    """Stops the server: SIGTERM, then SIGKILL after 15 s."""
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=15)


def wait_for_run(page) -> None:
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
        page.wait_for_selector(SKELETON, state="detached", timeout=RUN_TIMEOUT_MS)  # elements still loading
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


def page_links(page, base: str) -> list[str]:
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


def full_page_screenshot(page, path: Path) -> None:
    """Streamlit scrolls inside its main section, not the document: grow the viewport to show it all."""
    height = page.evaluate("""() => Math.max(document.documentElement.scrollHeight,
        ...[...document.querySelectorAll('[data-testid="stMain"], [data-testid="stAppViewContainer"],'
                                         + ' [data-testid="stSidebarContent"]')].map(e => e.scrollHeight))""")
    size = page.viewport_size
    page.set_viewport_size({"width": size["width"], "height": max(size["height"], min(int(height) + 40, 8000))})
    page.wait_for_timeout(500)
    page.screenshot(path=str(path), full_page=True)
    page.set_viewport_size(size)


def slug(url: str, base: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", url[len(base) :].strip("/")) or "main"
