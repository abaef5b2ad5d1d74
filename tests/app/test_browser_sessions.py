"""Many browser sessions at once: eight users of the app together, as in a lecture hall.

A Streamlit server runs each session's script on a thread of one process, so sessions that
open pages running simulations at the same moment run those simulations concurrently. Eight
sessions (separate contexts of one headless Chromium, driven concurrently through Playwright's
async API) open the app; at the same moment each picks a different collective on the
Collectives page (eight uncached simulations at once); then, in rounds, all sessions together,
each opens every other page of the app (the sidebar links) from a start of its own, so that every
page runs in several sessions at once in each round and the sessions of each viewport open every
page between them. On every page of every session: no exception element,
no error message, and no error text ("Error", "already running", "Traceback").

Half the sessions use a 1280x720 viewport, half 1920x1080; the pages of the first two are kept
as screenshots under the test's ``tmp_path`` (and copied to ``$SIMDIST_SCREENSHOTS`` when set).
It skips, saying why, where Chromium, Playwright or Streamlit is missing (see ``_browser``).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time

import pytest
from _browser import (  # noqa: F401 - app_url and chromium_path are fixtures
    DONE,
    DRAWN,
    LAUNCH_ARGS,
    RUN_TIMEOUT_MS,
    SKELETON,
    app_url,
    chromium_path,
    slug,
)

# ruff: noqa: F811 - the test takes the imported fixtures as arguments

SESSIONS = 8
FIRST_OPEN_MS = 3 * RUN_TIMEOUT_MS
"""How long the eight sessions' first, simultaneous opening of the app may take: the server's first runs
import the app's libraries and fill its caches (50-53 s for every session on a quiet 2-core machine,
over 90 s with two busy processes beside it, for the same code as the day before)."""


def visited(session: int, k: int, pages: int) -> int:
    """The page session ``session`` opens in round ``k``: every other page from its own start, the
    starts spread so that each round opens every page (in one session or more) and the sessions of
    each viewport open every page between them."""
    return (session // 2 + (SESSIONS // 2) * (session % 2) + 2 * k) % pages


OPS = ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"]
VIEWPORTS = ({"width": 1280, "height": 720}, {"width": 1920, "height": 1080})
ERROR_TEXT = re.compile(r"\b(?!DeadlockError\b)\w*Error\b|already running|Traceback|cannot be nested")
"""What no page may show: an error's name (the Deadlock lab names the error it explains), or the old refusal."""

SETTLED = """([done, drawn, skeleton]) => {
    // The script run is over, no element is still loading (a skeleton stands in for it), and the main
    // section has kept the same elements and the same markup for a second.
    const status = document.querySelector('[data-testid="stStatusWidget"]');
    const main = document.querySelector('[data-testid="stMain"]');
    const count = document.querySelectorAll(drawn).length;
    const ready = document.querySelector(done) !== null && count > 0
        && !document.querySelector(skeleton)
        && !(status && status.getClientRects().length) && !(window.simdistArmed && !window.simdistRan);
    const look = count + ":" + (main ? main.innerHTML.length : 0), now = Date.now(), seen = window.simdistSeen;
    if (!ready || !seen || seen.look !== look) {
        window.simdistSeen = ready ? {look: look, since: now} : null;
        return false;
    }
    return now - seen.since >= 1000;
}"""

ARM = """() => {
    // Note when the next script run shows: a widget change reruns the page without reloading it. The run
    // shows as the script state "running", as an element marked stale or no longer stale, or, where the
    // browser took in the run's start and end at once, as content of the main section changing outside a
    // select box (which shows its new value at once, before the server has even started the run; its open
    // list hides the other elements by an attribute).
    window.simdistArmed = true;
    window.simdistRan = false;
    window.simdistSeen = null;
    const observer = new MutationObserver(records => {
        for (const r of records) {
            const el = r.target.nodeType === 1 ? r.target : r.target.parentElement;
            const running = r.attributeName === "data-test-script-state"
                ? r.oldValue === "running" || el.getAttribute(r.attributeName) === "running"
                : r.attributeName === "data-stale" || (r.type !== "attributes" && !!el
                    && !!el.closest('[data-testid="stMain"]') && !el.closest('[data-testid="stSelectbox"]'));
            if (running) {
                window.simdistRan = true;
                observer.disconnect();
                return;
            }
        }
    });
    observer.observe(document.body,
                     {subtree: true, childList: true, attributes: true, characterData: true, attributeOldValue: true});
}"""

STATE = """() => ({script: document.querySelector('[data-testid="stApp"]')?.getAttribute("data-test-script-state"),
    connection: document.querySelector('[data-testid="stApp"]')?.getAttribute("data-test-connection-state"),
    armed: !!window.simdistArmed, ran: !!window.simdistRan, seen: window.simdistSeen,
    status: document.querySelector('[data-testid="stStatusWidget"]')?.innerText})"""


async def settled(page, what: str, timeout_ms: float = RUN_TIMEOUT_MS) -> None:
    from playwright.async_api import TimeoutError as PlaywrightTimeout

    try:
        await page.wait_for_function(SETTLED, arg=[DONE, DRAWN, SKELETON], polling=250, timeout=timeout_ms)
    except PlaywrightTimeout:
        pytest.fail(f"{what}: the page did not settle within {timeout_ms / 1000:.0f} s; {await page.evaluate(STATE)}")


async def problems(page, where: str, errors: list[str]) -> list[str]:
    """What is wrong on ``page``: exception elements, error messages, error text, errors in the browser."""
    found = [
        f"{where}: exception: {text}" for text in await page.locator('[data-testid="stException"]').all_inner_texts()
    ]
    found += [
        f"{where}: error message: {text}"
        for text in await page.locator('[data-testid="stAlertContentError"]').all_inner_texts()
    ]
    text = await page.locator("body").inner_text()
    found += [
        f"{where}: shows {m.group(0)!r} in ...{text[max(0, m.start() - 80) : m.end() + 80]!r}..."
        for m in ERROR_TEXT.finditer(text)
    ]
    found += [f"{where}: browser error: {e}" for e in errors]
    errors.clear()
    return found


class Session:
    """One user: a browser context with one page."""

    def __init__(self, index: int, base: str, shots) -> None:
        self.index, self.base, self.shots = index, base, shots
        self.viewport = VIEWPORTS[index % 2]
        self.errors: list[str] = []
        self.found: list[str] = []
        self.looks = 0

    async def open(self, browser) -> list[str]:
        """Open the app (the Collectives page); the page links."""
        self.context = await browser.new_context(viewport=self.viewport)
        self.page = await self.context.new_page()
        self.page.on("pageerror", lambda err: self.errors.append(str(err)))
        await self.page.goto(self.base + "/", wait_until="domcontentloaded", timeout=RUN_TIMEOUT_MS)
        await settled(self.page, f"session {self.index}, opening the app", FIRST_OPEN_MS)
        hrefs = await self.page.eval_on_selector_all(
            '[data-testid="stSidebarNav"] a[href]', "els => els.map(e => e.href)"
        )
        return [h for i, h in enumerate(hrefs) if h.startswith(self.base) and h not in hrefs[:i]]

    async def pick(self, label: str, option: str | None = None) -> str:
        """Choose ``option`` (default: the first one not chosen) in the select box ``label``; wait for the rerun."""
        from playwright.async_api import expect

        box = self.page.get_by_role("combobox", name=label, exact=True)
        current = await box.input_value()
        await self.page.evaluate(ARM)
        await box.click()
        if option is None:
            names = await self.page.get_by_role("option").all_inner_texts()
            option = next(n.strip() for n in names if n.strip() != current)
        await self.page.get_by_role("option", name=option, exact=True).click()
        await expect(box).to_have_value(option, timeout=RUN_TIMEOUT_MS)
        await settled(self.page, f"session {self.index}, {label} {current!r} -> {option!r}")
        await self.check(f"collectives, {label} {option}")
        return option

    async def pick_collective(self, op: str) -> None:
        """Run a simulation no other session runs: collective ``op``, or another algorithm if ``op`` is shown already."""
        if await self.page.get_by_role("combobox", name="collective", exact=True).input_value() == op:
            await self.pick("algorithm")
        else:
            await self.pick("collective", op)

    async def visit(self, url: str) -> None:
        await self.page.goto(url, wait_until="domcontentloaded", timeout=RUN_TIMEOUT_MS)
        await settled(self.page, f"session {self.index}, {url}")
        await self.check(url[len(self.base) :] or "/")

    async def check(self, what: str) -> None:
        where = f"session {self.index} ({self.viewport['width']}x{self.viewport['height']}), {what}"
        self.found += await problems(self.page, where, self.errors)
        self.looks += 1
        if self.index < len(VIEWPORTS):
            name = f"session{self.index}_{self.viewport['width']}x{self.viewport['height']}_{self.looks:02d}"
            await self.page.screenshot(path=str(self.shots / f"{name}_{slug(self.page.url, self.base)}.png"))


async def drive(chromium: str, base: str, shots) -> tuple[list[str], list[str]]:
    """Every session through the app together; what was wrong, and the pages visited."""
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=chromium, headless=True, args=LAUNCH_ARGS)
        try:
            sessions = [Session(i, base, shots) for i in range(SESSIONS)]
            links = await asyncio.gather(*(s.open(browser) for s in sessions))
            urls = links[0]
            assert urls and all(sorted(u) == sorted(urls) for u in links), links
            await asyncio.gather(*(s.pick_collective(OPS[s.index % len(OPS)]) for s in sessions))
            plan = [[visited(s, k, len(urls)) for s in range(SESSIONS)] for k in range((len(urls) + 1) // 2)]
            assert all(set(opened) == set(range(len(urls))) for opened in plan), plan  # every page each round
            for i in range(len(VIEWPORTS)):  # and every page at each viewport
                assert {p for opened in plan for p in opened[i :: len(VIEWPORTS)]} == set(range(len(urls))), plan
            for opened in plan:
                await asyncio.gather(*(s.visit(urls[opened[s.index]]) for s in sessions))
            return [p for s in sessions for p in s.found], urls
        finally:
            await browser.close()


@pytest.mark.timeout(900)
def test_eight_sessions_use_every_page_at_once(app_url, chromium_path, tmp_path):
    pytest.importorskip("playwright.async_api", reason="playwright is not installed (bash install.sh)")
    found, urls = asyncio.run(drive(chromium_path, app_url, tmp_path))
    shots = sorted(tmp_path.glob("*.png"))
    out = os.environ.get("SIMDIST_SCREENSHOTS")
    if out:
        os.makedirs(out, exist_ok=True)
        for shot in shots:
            shutil.copy(shot, out)
    assert not found, "\n".join(found[:20])
    assert len(urls) >= 5, urls  # the app's pages
    assert len(shots) == len(VIEWPORTS) * ((len(urls) + 1) // 2 + 1)


EDITOR = 'iframe[title="code_editor.code_editor"]'
"""The Exercises page's code editor (a component in a frame of its own)."""


async def write(page, code: str) -> None:
    """Put ``code`` in the Exercises page's editor as a student's paste would (no key is typed: no auto-indent)."""
    editor = page.frame_locator(EDITOR)
    await editor.locator(".ace_content").click()
    await page.keyboard.press("Control+A")
    await page.keyboard.insert_text(code)


async def written(page) -> str:
    """What the Exercises page's editor holds."""
    frame = page.frame_locator(EDITOR)
    return await frame.locator(".ace_editor").evaluate("e => e.env.editor.getValue()")


async def holding(page, code: str, what: str) -> None:
    """Wait until the Exercises page's editor holds ``code``.

    Choosing an exercise changes the select box at once, but the editor of the exercise chosen replaces the one
    shown only when the server's rerun arrives, which on a loaded machine may come seconds after the page looked
    settled: code written before then goes into the editor about to be replaced."""
    seen, deadline = None, time.monotonic() + RUN_TIMEOUT_MS / 1000
    while time.monotonic() < deadline:
        try:
            seen = await asyncio.wait_for(written(page), 5)
        except Exception as error:  # the editor's frame is being replaced
            seen = f"<not readable: {type(error).__name__}>"
        if seen == code:
            return
        await asyncio.sleep(0.25)
    pytest.fail(
        f"{what}: the editor did not come to hold {code[:60]!r}... within {RUN_TIMEOUT_MS / 1000:.0f} s; "
        f"it holds {str(seen)[:60]!r}..."
    )


async def submit_together(chromium: str, base: str, shots) -> list[str]:
    """Eight sessions on the Exercises page, each with an exercise's model solution typed in, press Submit at the
    same moment; what was wrong."""
    from playwright.async_api import async_playwright

    from simdist.exercises import load_all

    shipped = load_all()
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=chromium, headless=True, args=LAUNCH_ARGS)
        try:
            sessions = [Session(i, base, shots) for i in range(SESSIONS)]

            async def ready(s: Session) -> None:
                exercise = shipped[s.index % len(shipped)]
                s.context = await browser.new_context(viewport=s.viewport)
                s.page = await s.context.new_page()
                s.page.on("pageerror", lambda err: s.errors.append(str(err)))
                await s.page.goto(base + "/exercises", wait_until="domcontentloaded", timeout=RUN_TIMEOUT_MS)
                await settled(s.page, f"session {s.index}, opening Exercises", FIRST_OPEN_MS)
                if exercise is not shipped[0]:
                    await s.pick("exercise", exercise.title)
                await holding(s.page, exercise.starter.strip() + "\n", f"session {s.index}, {exercise.name}")
                await write(s.page, exercise.solution)

            async def submit(s: Session) -> None:
                exercise = shipped[s.index % len(shipped)]
                await holding(s.page, exercise.solution, f"session {s.index}, {exercise.name} written")
                await s.page.evaluate(ARM)
                await s.page.frame_locator(EDITOR).get_by_text("Submit").click()  # the editor's own button
                await settled(s.page, f"session {s.index}, grading", FIRST_OPEN_MS)
                passed = await s.page.locator('[data-testid="stAlertContentSuccess"]').all_inner_texts()
                if not any(text.startswith("Passed: passed") for text in passed):
                    held = await written(s.page) == exercise.solution
                    s.found.append(
                        f"session {s.index}: no passing verdict for {exercise.name} (its editor "
                        f"{'holds' if held else 'no longer holds'} the solution)"
                    )
                await s.check("exercises, submitted")

            await asyncio.gather(*(ready(s) for s in sessions))
            await asyncio.gather(*(submit(s) for s in sessions))
            return [p for s in sessions for p in s.found]
        finally:
            await browser.close()


@pytest.mark.timeout(900)
def test_eight_sessions_submit_exercises_at_the_same_moment(app_url, chromium_path, tmp_path):
    """Each session's model solution is graded (in bubblewrap's sandbox) while the seven others' are, and passes."""
    pytest.importorskip("playwright.async_api", reason="playwright is not installed (bash install.sh)")
    from simdist.visualize import bubblewrap

    if bubblewrap() is None:
        pytest.skip("bubblewrap is not installed here (apt-get install bubblewrap): the page takes no submissions")
    found = asyncio.run(submit_together(chromium_path, app_url, tmp_path))
    assert not found, "\n".join(found[:20])


async def edit_and_come_back(chromium: str, base: str, shots) -> dict:
    """One student types in the editor, leaves it, opens another exercise and comes back: what the editor shows."""
    from playwright.async_api import async_playwright

    from simdist.exercises import load_all

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=chromium, headless=True, args=LAUNCH_ARGS)
        try:
            s = Session(0, base, shots)
            s.context = await browser.new_context(viewport=s.viewport)
            s.page = await s.context.new_page()
            await s.page.goto(base + "/exercises", wait_until="domcontentloaded", timeout=RUN_TIMEOUT_MS)
            await settled(s.page, "opening Exercises", FIRST_OPEN_MS)
            draft = "import torch\n\n\ndef my_all_reduce(tensor):\n    pass  # my draft\n"
            await write(s.page, draft)
            rows = await s.page.frame_locator(EDITOR).locator(".ace_editor").evaluate(ROWS)
            await s.page.get_by_role("heading", name="Exercises").click()  # the editor loses the focus: sent
            await settled(s.page, "leaving the editor")
            shipped = {e.title: e for e in load_all()}
            await s.pick("exercise", "Binomial-tree broadcast")
            other = shipped["Binomial-tree broadcast"].starter.strip() + "\n"
            await holding(s.page, other, "the second exercise's starter")
            await s.pick("exercise", "Ring all-reduce from send and recv")
            await holding(s.page, draft, "the draft, back at the first exercise")  # fails the test if not kept
            return {"rows": rows, "other": other, "back": await written(s.page), "draft": draft}
        finally:
            await browser.close()


ROWS = """e => {  // each shown line's number and the vertical offset of its number from its text, in pixels
    const lines = [...e.querySelectorAll('.ace_text-layer .ace_line')].map(l => l.getBoundingClientRect().top);
    const cells = [...e.querySelectorAll('.ace_gutter-cell')];
    return cells.map(c => [c.textContent.trim(), Math.min(...lines.map(t => Math.abs(t - c.getBoundingClientRect().top)))]);
}"""


@pytest.mark.timeout(300)
def test_the_editor_numbers_each_line_beside_it_and_keeps_a_draft_across_exercises(app_url, chromium_path, tmp_path):
    pytest.importorskip("playwright.async_api", reason="playwright is not installed (bash install.sh)")
    seen = asyncio.run(edit_and_come_back(chromium_path, app_url, tmp_path))
    assert [n for n, _ in seen["rows"]] == [str(i) for i in range(1, 7)], seen["rows"]  # five lines and the last
    assert all(offset < 1 for _, offset in seen["rows"]), seen["rows"]  # each number level with its line
    assert seen["other"].startswith("import torch\nimport simdist") and "tree_broadcast" in seen["other"]
    assert seen["back"] == seen["draft"]
