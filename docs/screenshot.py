"""Retakes the README's screenshot of the visualizer (docs/app.png): the first page of
``streamlit run app.py``, as headless Chromium shows it once the page's script run is over.

    python3 docs/screenshot.py [--out docs/app.png] [--chromium /usr/bin/chromium]

Needs the app and test extras (streamlit, playwright) and a Chromium (Debian: ``apt-get
install chromium``; Playwright cannot download its own browsers here). The server runs on
a free port of 127.0.0.1 and is stopped when the script ends. tests/test_browser.py drives
the app the same way.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DONE = (
    '[data-testid="stApp"][data-test-connection-state="CONNECTED"]'
    ':is([data-test-script-state="notRunning"], [data-test-script-state="compilationError"])'
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "app.png")
    ap.add_argument(
        "--chromium", default=os.environ.get("SIMDIST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    )
    ap.add_argument("--width", type=int, default=1400)
    args = ap.parse_args()

    from playwright.sync_api import sync_playwright

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            str(ROOT / "app.py"),
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
            "--client.toolbarMode",
            "viewer",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"streamlit did not start on {url}")
            time.sleep(0.5)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=args.chromium,
                headless=True,
                args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
            )
            try:
                page = browser.new_page(viewport={"width": args.width, "height": 900})
                page.goto(url + "/", wait_until="domcontentloaded", timeout=60_000)
                page.wait_for_selector(DONE, state="attached", timeout=90_000)
                # "notRunning" can show for a moment before the first run: wait for something drawn too
                page.wait_for_selector('[data-testid="stMain"] [data-testid="stElementContainer"]', timeout=90_000)
                page.wait_for_selector(DONE, state="attached", timeout=90_000)
                page.wait_for_selector('[data-testid="stStatusWidget"]', state="hidden", timeout=90_000)
                page.wait_for_timeout(2_000)
                if page.locator('[data-testid="stException"]').count():
                    sys.exit("the first page shows an exception; no screenshot taken")
                height = page.evaluate("""() => Math.max(document.documentElement.scrollHeight,
                    ...[...document.querySelectorAll('[data-testid="stMain"]')].map(e => e.scrollHeight))""")
                page.set_viewport_size({"width": args.width, "height": max(900, min(int(height), 4000))})
                page.wait_for_timeout(500)
                args.out.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(args.out))
            finally:
                browser.close()
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
