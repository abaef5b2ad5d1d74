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

import json
import os
import shutil

import pytest
from _browser import RUN_TIMEOUT_MS, app_url, chromium_path  # noqa: F401 - fixtures
from _browser import full_page_screenshot as _full_page_screenshot
from _browser import page_links as _page_links
from _browser import slug as _slug
from _browser import wait_for_run as _wait_for_run

# ruff: noqa: F811 - the tests take the imported fixtures as arguments


@pytest.mark.timeout(180)
def test_every_page_renders_without_an_exception(app_url, chromium_path, tmp_path):
    from playwright.sync_api import sync_playwright

    shots = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=chromium_path,
            headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
        )
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
                    f"{url} shows an exception (screenshot {shot}):\n"
                    + "\n---\n".join(exceptions.all_inner_texts())
                    + ("\nbrowser errors:\n" + "\n".join(page_errors) if page_errors else "")
                )
        finally:
            browser.close()
            out = os.environ.get("SIMDIST_SCREENSHOTS")
            if out and shots:
                os.makedirs(out, exist_ok=True)
                for shot in shots:
                    shutil.copy(shot, out)
    assert shots and all(s.stat().st_size > 10_000 for s in shots), shots


@pytest.mark.timeout(180)
def test_traces_page_shows_an_uploaded_trace_of_a_script_at_its_own_lines(app_url, chromium_path, tmp_path):
    """The one widget AppTest cannot drive: a trace file uploaded through the browser, here the one
    ``simdist run --backend sim --trace`` wrote for a torchrun script."""
    from playwright.sync_api import sync_playwright

    from simdist.launch import run

    (tmp_path / "two_ranks.py").write_text(TWO_RANKS)
    good = tmp_path / "run.json"
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        args = ["--backend", "sim", "--nproc-per-node", "2", "--isolation", "threads", "--trace", str(good)]
        assert run.main([*args, "two_ranks.py"]) == 0
    finally:
        os.chdir(cwd)
    events = len(json.loads(good.read_text())["events"])
    bad = tmp_path / "not_a_trace.json"
    bad.write_text('{"hello": 1}')
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=chromium_path,
            headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(app_url + "/traces", wait_until="domcontentloaded", timeout=60_000)
            _wait_for_run(page)
            upload = page.locator('[data-testid="stFileUploaderDropzoneInput"]')
            upload.set_input_files(str(good))
            page.get_by_text(f"{events}", exact=True).wait_for(timeout=RUN_TIMEOUT_MS)
            _wait_for_run(page)
            assert page.locator('[data-testid="stException"]').count() == 0
            page.get_by_text("The program's lines that communicate").wait_for(timeout=RUN_TIMEOUT_MS)
            shown = page.locator('[data-testid="stDataFrame"]').inner_text(timeout=RUN_TIMEOUT_MS)
            page.screenshot(path=str(tmp_path / "uploaded.png"), full_page=True)
            assert page.get_by_text(str(tmp_path / "two_ranks.py:"), exact=False).count() >= 1, shown
            upload.set_input_files(str(bad))
            page.get_by_text("was left out: it is JSON but not a simdist trace", exact=False).wait_for(
                timeout=RUN_TIMEOUT_MS
            )
            assert page.locator('[data-testid="stException"]').count() == 0
        finally:
            browser.close()


TWO_RANKS = """\
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(3)
dist.all_reduce(t)
if dist.get_rank() == 0:
    dist.send(t, dst=1)
else:
    dist.recv(t, src=0)
dist.destroy_process_group()
"""
