"""Every tutorial runs and prints exactly its saved output (``tutorials/NN_name.out``).

The simulator is deterministic, so a tutorial's output is too; a difference is either a
change in behaviour or a determinism bug. After an intended change (a tutorial edited, a
report reworded), regenerate the saved outputs with

    SIMDIST_UPDATE_TUTORIALS=1 python -m pytest tests/project/test_tutorials.py

and review the diff before committing it.
"""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = sorted((ROOT / "tutorials").glob("[0-9][0-9]_*.py"))


def test_tutorials_exist():
    names = [p.name for p in TUTORIALS]
    assert "01_collectives.py" in names and "02_deadlocks.py" in names, names


def run_tutorial(path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONIOENCODING="utf-8")  # PYTHONHASHSEED left random: output must not depend on it
    return subprocess.run(
        [sys.executable, str(path.relative_to(ROOT))],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=240,
    )


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_output(path: Path):
    proc = run_tutorial(path)
    assert proc.returncode == 0, f"{path.name} exited with {proc.returncode}:\n{proc.stderr}"
    expected_file = path.with_suffix(".out")
    if os.environ.get("SIMDIST_UPDATE_TUTORIALS"):
        expected_file.write_text(proc.stdout, encoding="utf-8")
    assert expected_file.exists(), f"no saved output {expected_file.name}; set SIMDIST_UPDATE_TUTORIALS=1 to write it"
    expected = expected_file.read_text(encoding="utf-8")
    if proc.stdout != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                proc.stdout.splitlines(keepends=True),
                fromfile=f"tutorials/{expected_file.name} (saved)",
                tofile=f"python tutorials/{path.name} (now)",
            )
        )
        pytest.fail(
            f"{path.name} printed something other than {expected_file.name}:\n{diff}\nstderr:\n{proc.stderr}",
            pytrace=False,
        )
