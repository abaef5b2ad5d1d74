"""Notes on errors (the shrunk schedule, the scheduling decisions, a stuck rank) work on every supported Python.

``BaseException.add_note`` exists from Python 3.11 on; simdist supports 3.10, where
``simdist.core._errors.add_note`` keeps the notes in ``__notes__`` and a ``DistError`` prints them
after its message. The 3.10 path is run on a real Python 3.10 where one is installed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from simdist.core._errors import DeadlockError, DistError, add_note

pytestmark = pytest.mark.timeout(60)

ERRORS = Path(__file__).resolve().parents[2] / "simdist" / "core" / "_errors.py"

# Loads simdist/core/_errors.py alone (it imports nothing of simdist, and needs no torch) and prints what notes do.
ON_OTHER_PYTHON = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("errors", sys.argv[1])
errors = importlib.util.module_from_spec(spec)
spec.loader.exec_module(errors)
err = errors.DeadlockError("rank 1 failed")
err.schedule = "choices:0,1@world=2"
errors.add_note(err, "schedule shrunk")
errors.add_note(err, "decisions: rank 1 ran first")
other = KeyboardInterrupt()
errors.add_note(other, "ranks stuck: 0")
print(json.dumps({"version": list(sys.version_info[:2]), "notes": err.__notes__, "str": str(err),
                  "other": other.__notes__}))
"""


def python_3_10() -> str | None:
    """A Python 3.10 interpreter that runs (on PATH, or one of pyenv's), or ``None``."""
    candidates = [
        shutil.which("python3.10"),
        *sorted(map(str, Path.home().glob(".pyenv/versions/3.10*/bin/python3.10"))),
    ]
    for exe in filter(None, candidates):
        try:
            proc = subprocess.run(
                [exe, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True, timeout=30
            )
        except OSError:
            continue
        if proc.returncode == 0 and proc.stdout.strip() == "(3, 10)":
            return exe
    return None


PYTHON_3_10 = python_3_10()


def test_notes_are_kept_in_order_and_on_any_exception():
    err = DeadlockError("rank 1 failed")
    add_note(err, "first")
    add_note(err, "second")
    assert err.__notes__ == ["first", "second"]
    interrupt = KeyboardInterrupt()
    add_note(interrupt, "ranks stuck: 0")
    assert interrupt.__notes__ == ["ranks stuck: 0"]
    assert isinstance(err, DistError)


@pytest.mark.skipif(PYTHON_3_10 is None, reason="no Python 3.10 interpreter here (PATH, ~/.pyenv)")
def test_notes_on_python_3_10():
    assert PYTHON_3_10 is not None
    proc = subprocess.run([PYTHON_3_10, "-c", ON_OTHER_PYTHON, str(ERRORS)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["version"] == [3, 10]
    assert out["notes"] == ["schedule shrunk", "decisions: rank 1 ran first"]
    assert out["other"] == ["ranks stuck: 0"]
    # 3.10's traceback prints no notes, so the message carries them, after the replay token.
    assert out["str"] == (
        "rank 1 failed\nreplay token: choices:0,1@world=2\nschedule shrunk\ndecisions: rank 1 ran first"
    ), out["str"]


def test_a_dist_error_on_this_python_prints_notes_once():
    """From 3.11 on, the traceback prints the notes: the message does not repeat them."""
    err = DeadlockError("rank 1 failed")
    add_note(err, "schedule shrunk")
    if sys.version_info >= (3, 11):
        assert "schedule shrunk" not in str(err)
    else:
        assert str(err).endswith("schedule shrunk")
