"""docs/testing-scripts.md, run as a reader would: its scripts written to a folder, each ``$ simdist ...`` command
of its console blocks run there, and what it prints compared with the text block that follows (the folder's path
shown as ``/path/to``, the time a search took left out); its pytest module run beside the scripts."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "testing-scripts.md"
FILE = re.compile(r"<!-- not run: (\S+\.py), [^>]*-->\n```python\n(.*?)```", re.DOTALL)
COMMAND = re.compile(r"```console\n\$ (.*?)\n```\n```text\n(.*?)```", re.DOTALL)


def _files() -> dict[str, str]:
    return dict(FILE.findall(PAGE.read_text()))


def _simdist() -> str:
    here = Path(sys.executable).parent / "simdist"
    if not here.exists():
        pytest.skip("the simdist console script is not installed (pip install -e .)")
    return str(here)


@pytest.mark.timeout(300)
def test_the_pages_commands_print_what_it_shows(tmp_path):
    files = _files()
    assert set(files) == {"race.py", "fixed.py", "test_race.py"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    commands = COMMAND.findall(PAGE.read_text())
    assert len(commands) == 4
    for command, shown in commands:
        words = shlex.split(command)
        assert words[0] == "simdist"
        done = subprocess.run(
            [_simdist(), *words[1:]], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            timeout=250,
        )  # fmt: skip
        printed = done.stdout.replace(str(tmp_path), "/path/to")
        printed = re.sub(r" \([\d.]+ s\)$", "", printed, flags=re.MULTILINE)
        assert printed == shown, f"$ {command}\nprinted:\n{printed}"
        assert done.returncode == (0 if "no failure" in shown or "finished in" in shown else 1), command


@pytest.mark.timeout(300)
def test_the_pages_pytest_module_finds_the_race_and_passes_the_fix(tmp_path):
    for name, text in _files().items():
        (tmp_path / name).write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "test_race.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=250,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 1 and "1 failed, 2 passed" in out, out + done.stderr
    assert "@world=4@script=race.py@test=test_race.py::test_the_race_is_found" in out, out
