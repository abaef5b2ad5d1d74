"""The documentation site: mkdocs builds it with --strict (every link and anchor found, the API
reference rendered), every ```python block of the README and of the docs pages runs on its own,
the blocks that state their output print it, and the landing page says what the README says.

A block that is not meant to run on its own is marked in the Markdown: fenced as
```python-fragment, or preceded by a line ``<!-- not run: the reason -->``. A block preceded by
``<!-- checked: prints what its comments say -->`` must print, line by line, the comments of its
``print(...)`` lines."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
INDEX = ROOT / "docs" / "index.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\S*)\n(.*?)^```", re.DOTALL | re.MULTILINE)
NOT_RUN = "<!-- not run:"
CHECKED = "<!-- checked: prints what its comments say -->"


@dataclass(frozen=True)
class Block:
    where: str  # file:line of its fence
    code: str
    checked: bool  # its print lines' comments are its output


def _marker_before(text: str, start: int) -> str:
    """The last non-blank line before offset ``start``."""
    lines = [line for line in text[:start].splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _python_blocks() -> tuple[list[Block], list[str]]:
    """The blocks to run (each distinct code once: the landing page repeats the README's), and the
    places of the blocks marked not run."""
    blocks: dict[str, Block] = {}
    not_run = []
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            if match.group(1) != "python":
                continue
            where = f"{page.relative_to(ROOT)}:{text[: match.start()].count(chr(10)) + 1}"
            marker = _marker_before(text, match.start())
            if marker.startswith(NOT_RUN):
                not_run.append(f"{where} {marker}")
                continue
            code = match.group(2)
            blocks.setdefault(code, Block(where, code, marker == CHECKED))
    return list(blocks.values()), not_run


BLOCKS, NOT_RUN_BLOCKS = _python_blocks()


def _commented_output(code: str) -> list[str]:
    return [line.split("#", 1)[1].strip() for line in code.splitlines() if line.strip().startswith("print(")]


def _run(code: str, tmp_path: Path, name: str = "block.py", timeout: float = 100) -> subprocess.CompletedProcess:
    script = tmp_path / name
    script.write_text(code)
    return subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.timeout(180)
def test_the_site_builds_with_strict(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        pytest.skip("mkdocs and mkdocstrings[python] are not installed (the test extra installs them)")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in ("simdist.spawn", "simdist.testing.explore", "simdist.sim.Topology", "backends.sim.simulate"):
        assert name in api, f"the API reference lacks {name}"


@pytest.mark.timeout(10)
def test_every_page_is_in_the_nav():
    config = (ROOT / "mkdocs.yml").read_text()
    missing = [
        p.name for p in sorted((ROOT / "docs").rglob("*.md")) if p.relative_to(ROOT / "docs").as_posix() not in config
    ]
    assert not missing, f"pages not in mkdocs.yml's nav: {missing}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.where)
def test_every_python_block_runs(block, tmp_path):
    proc = _run(block.code, tmp_path)
    assert proc.returncode == 0, f"{block.where} failed:\n{proc.stderr}"
    if block.checked:
        expected = _commented_output(block.code)
        assert expected, f"{block.where} is marked checked but prints nothing with a comment"
        assert proc.stdout.splitlines() == expected, f"{block.where} printed:\n{proc.stdout}"


@pytest.mark.timeout(10)
def test_a_block_not_run_says_why():
    unexplained = [m for m in NOT_RUN_BLOCKS if not re.search(r"<!-- not run: \w.{8,}-->$", m)]
    assert not unexplained, unexplained


@pytest.mark.timeout(120)
def test_the_deadlock_report_is_what_the_readme_shows(tmp_path):
    text = README.read_text()
    after = text[text.index("### A deadlock, reported") :]
    code = re.search(r"```python\n(.*?)```", after, re.DOTALL).group(1)
    shown = re.search(r"```text\n(.*?)```", after, re.DOTALL).group(1)
    proc = _run(code, tmp_path, name="deadlock.py")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.replace(str(tmp_path / "deadlock.py"), "/path/to/deadlock.py") == shown


@pytest.mark.timeout(10)
def test_the_landing_page_says_what_the_readme_says():
    """docs/index.md is the README with links relative to docs/: the same sections and code."""
    readme, index = README.read_text(), INDEX.read_text()
    assert FENCE.findall(readme) == FENCE.findall(index)
    headings = [line for line in readme.splitlines() if line.startswith("#")]
    assert headings == [line for line in index.splitlines() if line.startswith("#")]
    for command in ("bash install.sh && streamlit run app.py", "bash install.sh && python3 -m pytest"):
        assert command in readme and command in index
    assert len(readme.splitlines()) < 200
