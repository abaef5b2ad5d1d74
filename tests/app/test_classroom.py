"""The visualizer's defaults (``.streamlit/config.toml``), checked on a real server and browser.

``streamlit run app.py``, started from the repository root as the README says (no flags but
a free port), listens on 127.0.0.1 only and sends no usage statistics: every request the
browser makes on every page goes to the app's own address (a classroom may be offline), and
its console shows no error.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _browser import APP, LAUNCH_ARGS, ROOT, START_TIMEOUT, free_port, healthy, page_links, terminate, wait_for_run
from _browser import chromium_path as chromium_path  # the fixture
from _net import listening_addresses as _listening_addresses

CONFIG = ROOT / ".streamlit" / "config.toml"


def test_the_config_binds_to_loopback_and_sends_no_statistics():
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    config = tomllib.loads(CONFIG.read_text())
    assert config["server"]["address"] == "127.0.0.1"
    assert config["server"]["showEmailPrompt"] is False
    assert config["browser"]["gatherUsageStats"] is False
    assert config["client"]["toolbarMode"] == "viewer"


@pytest.fixture
def readme_server(tmp_path):
    """``streamlit run app.py --server.port P`` from the repository root, with no settings from the environment."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMLIT_")}
    env["HOME"] = str(tmp_path)  # no ~/.streamlit of the person running the tests
    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", str(APP.name), "--server.port", str(port)],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"streamlit did not serve {url} (exit status {proc.poll()}):\n{log_path.read_text()}")
            time.sleep(0.5)
        yield port, url, log_path
    finally:
        terminate(proc)


@pytest.mark.timeout(240)
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads listening sockets from /proc/net (Linux)")
def test_the_app_listens_on_loopback_only_and_the_browser_stays_there(readme_server, chromium_path):
    from playwright.sync_api import sync_playwright

    port, url, log_path = readme_server
    assert _listening_addresses(port) == {"127.0.0.1"}, (_listening_addresses(port), log_path.read_text())
    assert "Email" not in log_path.read_text()
    requests, console_errors = [], []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path, headless=True, args=LAUNCH_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 720})
            page.on("request", lambda r: requests.append(r.url))
            page.on("response", lambda r: console_errors.append(f"{r.status} {r.url}") if r.status >= 400 else None)
            page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
            page.goto(url + "/", wait_until="domcontentloaded", timeout=60_000)
            wait_for_run(page)
            links = page_links(page, url)
            assert len(links) == 7, links  # every page of app.py
            for link in links[1:]:  # clicked, as a student moves between pages
                page.locator(f'[data-testid="stSidebarNav"] a[href="{link}"]').click()
                page.wait_for_url(link, timeout=60_000)
                wait_for_run(page)
        finally:
            browser.close()
    assert requests and all(
        r.startswith((url + "/", url.replace("http", "ws") + "/", "data:", "blob:")) for r in requests
    ), [r for r in requests if not r.startswith(url)]
    assert not console_errors, console_errors
