"""Which torch releases the torch bridge runs on (simdist/torch_bridge/versions.py), each case in a fresh interpreter.

The policy: torch ``OLDEST`` and newer is supported and CI tests the releases in ``TESTED``; a
release newer than every tested one runs with one warning when it has every internal the bridge
needs and is refused, naming what it lacks, when it does not; an older one is refused with the
way forward. The release is faked by replacing ``versions.release`` before anything runs.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(180), pytest.mark.torch_release]

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """\
import os, sys, warnings
warnings.simplefilter("always")  # every warning is printed: "one warning" must be one
import torch, torch.distributed as dist
import simdist
from simdist.torch_bridge import versions

versions.release = lambda: {release}
{patch}

def ring(rank):
    dist.init_process_group("gloo")
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    sub = dist.new_group([0, 1])
    dist.all_reduce(t, group=sub)
    dist.destroy_process_group()
    return t.item()

def main():
    how = sys.argv[1]
    try:
        if how == "sim":
            print("values", simdist.simulate(ring, 2).values, simdist.simulate(ring, 2).values)
        else:
            print("values", simdist.spawn(ring, nprocs=2, backend="socket", start_method="fork"))
    except simdist.RankError as err:
        print("refused:", err.__cause__)

if __name__ == "__main__":
    main()
"""


def _run(tmp_path: Path, release: tuple[int, int], how: str, patch: str = "", env: dict | None = None):
    script = tmp_path / "program.py"
    script.write_text(PROGRAM.format(release=release, patch=textwrap.dedent(patch)))
    proc = subprocess.run(
        [sys.executable, str(script), how],
        capture_output=True,
        text=True,
        timeout=150,
        cwd=tmp_path,
        env={**_clean_env(), **(env or {})},
    )
    return proc


def _clean_env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k not in ("SIMDIST_TORCH_UNTESTED",)}


@pytest.mark.parametrize("how", ["sim", "socket"])
def test_a_release_newer_than_tested_runs_with_one_warning(tmp_path: Path, how: str) -> None:
    proc = _run(tmp_path, (2, 99), how)
    assert proc.returncode == 0, proc.stderr
    assert "values [3.0, 3.0]" in proc.stdout or "values [6.0, 6.0]" in proc.stdout, proc.stdout + proc.stderr
    # one warning per process: the simulator runs in this one; the socket backend's ranks are two processes
    warnings = proc.stderr.count("was tested up to torch 2.14; torch")
    assert warnings == (1 if how == "sim" else 2), proc.stderr
    assert "has everything it needs, so it runs, untested" in proc.stderr


@pytest.mark.parametrize("how", ["sim", "socket"])
def test_a_newer_release_without_what_the_bridge_needs_is_refused_naming_it(tmp_path: Path, how: str) -> None:
    patch = """
    versions.NEEDED = versions.NEEDED + (("torch.distributed.imaginary_internal", lambda: False),)
    """
    proc = _run(tmp_path, (2, 99), how, patch)
    out = proc.stdout + proc.stderr
    assert "refused:" in proc.stdout, out
    assert "lacks torch.distributed.imaginary_internal" in out and "torch 2.11 and newer" in out, out


@pytest.mark.parametrize("how", ["sim", "socket"])
def test_a_release_older_than_supported_is_refused_with_the_way_forward(tmp_path: Path, how: str) -> None:
    proc = _run(tmp_path, (2, 10), how)
    out = proc.stdout + proc.stderr
    assert "refused:" in proc.stdout, out
    assert "supports torch 2.11 and newer" in out and "pip install 'torch>=2.11'" in out, out
    assert "SIMDIST_TORCH_UNTESTED=1" in out


def test_an_older_release_runs_when_asked_to_try(tmp_path: Path) -> None:
    proc = _run(tmp_path, (2, 10), "sim", env={"SIMDIST_TORCH_UNTESTED": "1"})
    assert proc.returncode == 0 and "values" in proc.stdout, proc.stdout + proc.stderr


def test_the_supported_range_is_declared_once() -> None:
    tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11")
    from simdist.torch_bridge import versions

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = project["tool"]["simdist"]["torch-bridge-versions"]
    assert declared == [f"{a}.{b}" for a, b in versions.TESTED]
    assert versions.OLDEST == min(versions.TESTED)
    lower = [d for d in project["project"]["dependencies"] if d.startswith("torch")]
    assert lower == [f"torch>={versions.OLDEST[0]}.{versions.OLDEST[1]}"]  # the oldest tested is the lower bound
    ci = (ROOT / ".ci" / "run").read_text() + (ROOT / "install.sh").read_text()
    for a, b in versions.TESTED:
        assert f"{a}.{b}." in ci, f"CI does not test torch {a}.{b}"
    assert versions.unsupported() is None  # the torch installed here is supported
