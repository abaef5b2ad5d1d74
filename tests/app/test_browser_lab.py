"""The Deadlock lab and the Traces page in a real browser at projector sizes (1280x720, 1920x1080).

What is measured is what a room sees: nothing wider than the window or its box, the
wait-for graph's texts at least 14 px and apart, the blocked lines of the program marked
where the report says, and uploaded traces of a real run shown on a wall clock with the
bad file named. Screenshots go to ``$SIMDIST_SCREENSHOTS`` when that is set (see
tests/app/test_browser.py, whose server and helpers, in tests/support/_browser.py, these tests share).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from _browser import LAUNCH_ARGS, RUN_TIMEOUT_MS, app_url, chromium_path, full_page_screenshot, wait_for_run  # noqa: F401

SIZES = [(1280, 720), (1920, 1080)]
LAUNCH = dict(headless=True, args=LAUNCH_ARGS)

OVERFLOW = """() => {
    const width = document.documentElement.clientWidth;
    const out = [];
    for (const e of document.querySelectorAll('[data-testid="stMain"] *')) {
        const r = e.getBoundingClientRect();
        if (r.width && r.right > width + 1) out.push(e.tagName + '.' + e.className + ' right=' + r.right);
    }
    for (const e of document.querySelectorAll('[data-testid="stMain"] pre, [data-testid="stMarkdown"] table')) {
        if (e.scrollWidth > e.clientWidth + 1) out.push('scrolls: ' + e.textContent.slice(0, 60));
    }
    return out;
}"""

GRAPH_TEXTS = """() => {
    const chart = document.querySelector('.st-key-wait_for .main-svg, [class*="st-key-wait_for"] .main-svg');
    const box = chart.getBoundingClientRect();
    return {box: [box.left, box.top, box.right, box.bottom],
            texts: [...chart.parentElement.parentElement.querySelectorAll('.annotation-text')]
                .filter(e => e.textContent.trim())
                .map(e => { const r = e.getBoundingClientRect();
                            return [e.textContent, parseFloat(getComputedStyle(e).fontSize),
                                    r.left, r.top, r.right, r.bottom]; })};
}"""

MARKED = """() => [...document.querySelectorAll('.st-key-program code > span')].map((e, i) => [
    i + 1, getComputedStyle(e).backgroundColor, getComputedStyle(e, '::after').content, e.textContent])"""


def _select(page, label: str) -> None:
    page.locator('[data-testid="stSelectbox"]').first.click()
    page.get_by_role("option", name=label, exact=True).click()
    wait_for_run(page)


@contextmanager
def _pages(executable: str, url: str, shots: list) -> Iterator:
    """Yields ``(width, height, page)`` for each of SIZES, the page at ``url`` with its run over;
    copies ``shots`` to ``$SIMDIST_SCREENSHOTS`` at the end."""
    from playwright.sync_api import sync_playwright

    def each(browser):
        for width, height in SIZES:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.goto(url, wait_until="domcontentloaded", timeout=60_000)
            wait_for_run(page)
            yield width, height, page
            page.close()

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, **LAUNCH)
        try:
            yield each(browser)
        finally:
            browser.close()
            out = os.environ.get("SIMDIST_SCREENSHOTS")
            if out:
                os.makedirs(out, exist_ok=True)
                for shot in shots:
                    shutil.copy(shot, out)


def _check_graph(graph: dict, where: str) -> None:
    left, top, right, bottom = graph["box"]
    texts = graph["texts"]
    assert texts, where
    for text, size, x0, y0, x1, y1 in texts:
        assert size >= 14, (where, text, size)
        assert left <= x0 and x1 <= right and top <= y0 and y1 <= bottom, (where, text, (x0, y0, x1, y1), graph["box"])
    for i, a in enumerate(texts):
        for b in texts[i + 1 :]:
            apart = a[4] <= b[2] or b[4] <= a[2] or a[5] <= b[3] or b[5] <= a[3]
            assert apart, (where, a, b)


@pytest.mark.timeout(420)
def test_deadlock_lab_reads_at_projector_sizes(app_url, chromium_path, tmp_path):  # noqa: F811
    from simdist import visualize as V

    shots: list = []
    with _pages(chromium_path, app_url + "/deadlocks", shots) as pages:
        for width, height, page in pages:
            for i, name in enumerate(V.SCENARIOS):
                if i:
                    _select(page, name)
                where = f"{name} at {width}x{height}"
                page.locator(".st-key-wait_for .annotation-text", has_text="rank 0").wait_for(timeout=RUN_TIMEOUT_MS)
                assert page.locator('[data-testid="stException"]').count() == 0, where
                assert page.evaluate(OVERFLOW) == [], where
                _check_graph(page.evaluate(GRAPH_TEXTS), where)
                report = page.locator('[data-testid="stCode"]').nth(1).inner_text()
                blocked: dict[int, list[int]] = {}
                for rank, op, line in re.findall(r"rank (\d+) is blocked in (\w+).* at program\.py:(\d+)", report):
                    blocked.setdefault(int(line), []).append(int(rank))
                assert blocked, (where, report)
                for number, background, after, text in page.evaluate(MARKED):
                    if number in blocked:
                        assert background == "rgb(255, 217, 217)", (where, number, background)
                        assert all(re.search(rf"\b{r}\b", after) for r in blocked[number]), (where, after)
                        assert "dist." in text, (where, number, text)
                    else:
                        assert after in ("none", "normal", ""), (where, number, after)
                slug = re.sub(r"[^a-z0-9]+", "_", name)
                shot = tmp_path / f"deadlock_{width}x{height}_{i}_{slug}.png"
                page.screenshot(path=str(shot))
                full = tmp_path / f"deadlock_{width}x{height}_{i}_{slug}_full.png"
                full_page_screenshot(page, full)
                shots += [shot, full]


def _two_ranks_trade(rank, world_size):
    import torch

    import simdist as dist

    dist.init_process_group("gloo")
    t = torch.ones(10)
    dist.all_reduce(t)
    if rank == 0:
        dist.send(t, dst=1)
        dist.recv(t, src=1)
    else:
        dist.recv(t, src=0)
        dist.send(t, dst=0)
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.timeout(300)
def test_traces_page_shows_a_real_run_on_a_wall_clock_and_names_a_bad_file(
    app_url,  # noqa: F811 - pytest fixtures imported from _browser
    chromium_path,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    import simdist as dist

    monkeypatch.setenv("SIMDIST_TRACE", str(tmp_path / "run"))
    dist.spawn(_two_ranks_trade, args=(2,), nprocs=2, backend="socket")
    files = sorted((tmp_path / "run").glob("rank*.trace.json"))
    sends = sum(len(dist.Trace.from_json(f.read_text()).of_kind("send")) for f in files)
    assert len(files) == 2 and sends == 2
    bad = tmp_path / "notes.json"
    bad.write_text('{"hello": 1}')
    shots: list = []
    with _pages(chromium_path, app_url + "/traces", shots) as pages:
        for width, height, page in pages:
            page.get_by_text("virtual time (µs, simulated)").wait_for(timeout=RUN_TIMEOUT_MS)
            upload = page.locator('[data-testid="stFileUploaderDropzoneInput"]')
            upload.set_input_files([str(files[0]), str(bad), str(files[1])])
            page.get_by_text("wall clock)").wait_for(timeout=RUN_TIMEOUT_MS)
            wait_for_run(page)
            warning = page.locator('[data-testid="stAlert"]').inner_text()
            assert "notes.json was left out" in warning and "not a simdist trace" in warning, warning
            metrics = dict(
                zip(
                    page.locator('[data-testid="stMetricLabel"]').all_inner_texts(),
                    page.locator('[data-testid="stMetricValue"]').all_inner_texts(),
                )
            )
            assert metrics["clock"] == "real" and metrics["messages"] == str(sends), metrics
            title = f"real run (wall-clock time): 2 ranks, 2 collectives, {sends} messages"
            assert page.get_by_text(title).count() == 1
            assert page.evaluate(OVERFLOW) == []
            shot = tmp_path / f"traces_{width}x{height}_real_run_and_a_bad_file.png"
            full_page_screenshot(page, shot)
            shots.append(shot)
