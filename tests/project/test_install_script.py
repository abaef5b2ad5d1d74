"""install.sh takes torch's CPU build from the CPU index, and pip's own index when that one does not answer.

Each case runs the repository's install.sh, unchanged, in a fresh virtual environment and in a
scratch folder where it sits beside a one-file project (so its last step, the editable install of
the project with its extras, takes no time). pip sees only two package indexes served on
127.0.0.1, each holding a small stand-in wheel named torch 2.13.0 (``+cpu`` on the CPU index), so
the test can tell which index served it. CI's own ``bash install.sh`` installs the real torch the
same way; the line install.sh prints says where it came from.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _wheels import write_wheel

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.timeout(240), pytest.mark.skipif(not shutil.which("bash"), reason="install.sh needs bash")]

BACKEND = '''"""A build backend for a project of no files: its wheel holds only its metadata."""
import sys
sys.path.insert(0, {tests!r})
from _wheels import write_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return write_wheel(wheel_directory, "scratch", "0", {{}}).name


build_editable = build_wheel
'''

PYPROJECT = """[build-system]
requires = []
build-backend = "backend"
backend-path = ["."]

[project]
name = "scratch"
version = "0"
"""


def stand_in_index(root: Path, version: str) -> Path:
    """A PEP 503 index under ``root`` holding one wheel, a torch ``version`` whose ``__version__`` says so."""
    page = root / "simple" / "torch"
    page.mkdir(parents=True)
    wheel = write_wheel(root, "torch", version, {"torch/__init__.py": f"__version__ = {version!r}\n"})
    page.joinpath("index.html").write_text(f'<html><body><a href="../../{wheel.name}">{wheel.name}</a></body></html>\n')
    return root


@contextlib.contextmanager
def served(folder: Path):
    """``folder`` served over HTTP on 127.0.0.1; yields its URL."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(folder), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def silent_index():
    """A URL whose server accepts connections and never answers (a hung index); yields it."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)  # connections complete in the backlog; nothing is ever read or written
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/simple"


@pytest.fixture
def indexes(tmp_path):
    """(the CPU index's URL, pip's own index's URL), each with its stand-in torch."""
    with (
        served(stand_in_index(tmp_path / "cpu", "2.13.0+cpu")) as cpu,
        served(stand_in_index(tmp_path / "default", "2.13.0")) as default,
    ):
        yield f"{cpu}/simple", f"{default}/simple"


def prepare(tmp_path: Path, default_index: str, cpu_index: str) -> tuple[Path, dict]:
    """A scratch project holding install.sh and a fresh venv; (install.sh's path, the environment to run it in)."""
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ROOT / "install.sh", project / "install.sh")
    project.joinpath("pyproject.toml").write_text(PYPROJECT)
    project.joinpath("backend.py").write_text(
        BACKEND.format(tests=str(Path(__file__).resolve().parents[1] / "support"))
    )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        PIP_CONFIG_FILE=os.devnull,  # no machine-wide index, wheel folder or constraint
        PIP_INDEX_URL=default_index,
        PIP_CACHE_DIR=str(tmp_path / "cache"),
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        SIMDIST_TORCH_INDEX=cpu_index,
    )
    return project / "install.sh", env


def install(script: Path, env: dict) -> tuple[subprocess.CompletedProcess, str, float]:
    """Run ``script`` (install.sh) in ``env``; (the run, the torch version it left in the venv, seconds taken)."""
    start = time.monotonic()
    run = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=200)
    seconds = time.monotonic() - start
    assert run.returncode == 0, run.stdout + run.stderr
    version = subprocess.run(
        ["python", "-c", "import torch; print(torch.__version__)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    return run, version, seconds


def test_the_cpu_build_comes_from_the_cpu_index(tmp_path, indexes):
    cpu, default = indexes
    run, version, _ = install(*prepare(tmp_path, default, cpu))
    assert version == "2.13.0+cpu"
    assert f"install.sh: torch 2.13.0+cpu (the CPU build) from {cpu.removesuffix('/simple')}/" in run.stdout, run.stdout
    assert f"asking the CPU index {cpu}" in run.stdout
    assert "trying pip's own index" not in run.stderr


@pytest.mark.parametrize("unreachable", ["refused", "invalid", "silent"])
def test_without_the_cpu_index_torch_comes_from_pips_own(tmp_path, indexes, unreachable):
    _, default = indexes
    with contextlib.ExitStack() as stack:
        if unreachable == "refused":
            with socket.socket() as s:  # a port nobody listens on
                s.bind(("127.0.0.1", 0))
                cpu = f"http://127.0.0.1:{s.getsockname()[1]}/simple"
        elif unreachable == "invalid":
            cpu = "http://simdist-no-such-index.invalid/simple"  # .invalid never resolves (RFC 2606)
        else:
            cpu = stack.enter_context(silent_index())
        run, version, seconds = install(*prepare(tmp_path, default, cpu))
    assert version == "2.13.0"
    assert f"the CPU index {cpu} did not serve torch==2.13.0; trying pip's own index" in run.stderr, run.stderr
    assert "install.sh: torch 2.13.0 (not the CPU build: on Linux, with CUDA's packages) from " in run.stdout
    assert "asking pip's own index (the CPU index did not answer)" in run.stdout
    if unreachable == "silent":
        assert seconds < 90, f"a hung CPU index held install.sh for {seconds:.0f} s (10 s a try, one retry)"


def test_install_sh_leaves_a_new_enough_torch_alone(tmp_path, indexes):
    cpu, default = indexes
    script, env = prepare(tmp_path, default, cpu)
    install(script, env)
    again, version, _ = install(script, env)
    assert version == "2.13.0+cpu"
    assert "install.sh: torch" not in again.stdout + again.stderr  # torch is there: neither index was asked
