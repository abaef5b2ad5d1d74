"""The tree's gates: ruff's rules (``[tool.ruff.lint]`` in pyproject.toml) find nothing, ``ruff format`` would
change nothing, and mypy's errors per file of the installed layout never exceed ``tests/typing_baseline.json`` (simdist's core and
``simdist.algorithms``: none at all).

To shrink the baseline after fixing type errors: ``python tests/project/test_gates.py --write``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASELINE = Path(__file__).resolve().parents[1] / "typing_baseline.json"
CLEAN = ("simdist/algorithms/", "simdist/api/", "simdist/testing/")
"""Parts of the installed layout that must have no type error (besides simdist's own top-level modules)."""
_ERROR = re.compile(r"^(?P<path>(?:simdist/[^:]+|pytest_simdist)\.py):\d+: error: ")

pytestmark = pytest.mark.timeout(300)


def installed_layout(into: Path) -> Path:
    """A copy of what pip installs (``backends/`` and ``visualize/`` inside ``simdist/``, the plugin beside it): its root."""
    pkg = into / "simdist"
    into.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "pytest_simdist.py", into)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "simdist", pkg, ignore=ignore)
    shutil.copytree(ROOT / "backends", pkg / "backends", ignore=ignore)
    shutil.copytree(ROOT / "visualize", pkg / "visualize", ignore=ignore)
    return into


def type_errors(workdir: Path) -> Counter:
    """mypy's error count per file of the installed layout (paths like ``simdist/backends/sim/_engine.py``)."""
    root = installed_layout(workdir / "layout")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "-p",
            "simdist",
            "-m",
            "pytest_simdist",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(workdir / "cache"),
            "--no-error-summary",
            "--show-error-codes",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    found = Counter(m["path"] for line in proc.stdout.splitlines() if (m := _ERROR.match(line)))
    if proc.returncode not in (0, 1) or (proc.returncode == 1) != bool(found):  # 1: errors found; 2: it failed
        raise RuntimeError(f"mypy did not run (exit {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return found


def must_be_clean(path: str) -> bool:
    """Whether ``path`` (installed layout) belongs to the parts that may have no type error at all."""
    top_level = path.count("/") <= 1  # simdist/_ddp.py or pytest_simdist.py, not simdist/backends/...
    return top_level or path.startswith(CLEAN)


def _ruff(*args: str) -> subprocess.CompletedProcess:
    """``ruff ARGS --no-cache .`` run on the repository."""
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--no-cache", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("args", [("check",), ("format", "--check")], ids=["check", "format"])
def test_ruff_finds_nothing(args):
    proc = _ruff(*args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]


def test_type_errors_only_go_down(tmp_path):
    baseline = json.loads(BASELINE.read_text())
    found = type_errors(tmp_path)
    grown = {p: (n, baseline.get(p, 0)) for p, n in sorted(found.items()) if n > baseline.get(p, 0)}
    assert not grown, f"more mypy errors than tests/typing_baseline.json allows (found, allowed): {grown}"
    dirty = {p: n for p, n in found.items() if must_be_clean(p) and n}
    allowed = {p: n for p, n in baseline.items() if must_be_clean(p) and n}
    assert set(dirty) <= set(allowed), f"new type errors where none are allowed: {dirty}"


def test_the_layout_is_what_pip_installs(tmp_path):
    """The copy checked has the modules of the wheel: the backends and the visualizer inside the package."""
    root = installed_layout(tmp_path)
    for module in (
        "simdist/api/_setup.py",
        "simdist/backends/sim/_engine.py",
        "simdist/visualize/__init__.py",
        "simdist/algorithms/_args.py",
        "simdist/py.typed",
    ):
        assert (root / module).is_file(), module


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        counts = type_errors(Path(tmp))
    BASELINE.write_text(json.dumps(dict(sorted(counts.items())), indent=1) + "\n")
    print(f"{sum(counts.values())} errors in {len(counts)} files written to {BASELINE}")
