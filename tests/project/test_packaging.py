"""The wheel installs the layout of DESIGN.md: ``backends/`` as ``simdist.backends`` and
``visualize/`` as ``simdist.visualize``, and no generic top-level ``backends`` or
``visualize`` on a user's ``sys.path``. Beside the package it installs one module, the pytest
plugin ``pytest_simdist``, which pytest finds by its entry point and loads without simdist.

The test builds the wheel from a copy of the checkout, installs it with ``--no-deps`` into
a fresh virtual environment that sees the site-packages of the Python running the tests
(so torch and numpy need not be installed again), and imports from it with the working directory outside the
repository, checking that every module comes from the wheel and not from the checkout.

The wheel also ships the visualizer (``app.py``, ``app_pages/`` and ``.streamlit/config.toml`` of the
root, as ``simdist/app/``) and one version, ``simdist.__version__``; ``simdist app`` from the fresh
venv serves the installed pages to a real Chromium.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

import pytest
from _browser import LAUNCH_ARGS, START_TIMEOUT, free_port, healthy, terminate, wait_for_run
from _browser import chromium_path as chromium_path  # the fixture
from _net import listening_addresses as _listening_addresses

if sys.version_info >= (3, 11):
    import tomllib
else:  # simdist's own dependency there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
SKIP = shutil.ignore_patterns(
    ".git",
    "build",
    "dist",
    "*.egg-info",
    ".venv",
    "__pycache__",
    ".hypothesis",
    ".pytest_cache",
    ".benchmarks",
    "*.whl",
)

CHECK = r"""
import importlib.util, json, sys
import pytest_simdist
out_plugin_alone = "simdist" not in sys.modules
import simdist, simdist.backends, simdist.backends.sim, simdist.visualize
out = {
    "plugin_alone": out_plugin_alone,
    "simdist": simdist.__file__,
    "simdist.backends": simdist.backends.__file__,
    "simdist.backends.sim": simdist.backends.sim.__file__,
    "simdist.visualize": simdist.visualize.__file__,
    "top_backends": importlib.util.find_spec("backends") is not None,
    "top_visualize": importlib.util.find_spec("visualize") is not None,
}
from importlib.metadata import entry_points
(plugin,) = [ep for ep in entry_points(group="pytest11") if ep.name == "simdist"]
out["plugin"] = [plugin.value, plugin.load().__file__]

def main(rank, world_size):
    simdist.init_process_group("gloo", rank=rank, world_size=world_size)
    import torch
    t = torch.tensor([rank + 1.0])
    simdist.all_reduce(t)
    simdist.destroy_process_group()
    return t.item()
out["values"] = simdist.spawn(main, args=(4,), nprocs=4, backend="sim")
print(json.dumps(out))
"""


def _run(cmd: list, cwd: Path, timeout: float = 240, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PIP_REQUIRE_VIRTUALENV")}
    env.update(extra_env or {})
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def _build_wheel(src: Path, out: Path) -> Path:
    """Build with the installed setuptools (offline, fast); fall back to an isolated build."""
    base = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-w", out]
    try:
        _run([*base, "--no-build-isolation", src], cwd=src.parent)
    except AssertionError:
        _run([*base, src], cwd=src.parent)
    wheels = sorted(out.glob("simdist-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def _purelib(py: Path) -> Path:
    """``py``'s site-packages."""
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(
        subprocess.run([str(py), "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    )


def _see_our_dependencies(py: Path) -> None:
    """Put this interpreter's site-packages (torch, numpy, ...) after ``py``'s own, by a ``.pth`` file.

    ``--system-site-packages`` would show the base Python's packages, which lack torch when
    the tests run in a virtual environment. Directories named in a ``.pth`` file are added
    to ``sys.path`` without running their own ``.pth`` files, so an editable install of
    simdist here does not reach the new environment.
    """
    ours = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    Path(_purelib(py), "simdist-test-dependencies.pth").write_text("".join(f"{d}\n" for d in ours))


@dataclass
class Installed:
    src: Path  # the copy of the checkout the wheel was built from
    wheel: Path
    venv: Path
    python: Path


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheel built from a copy of the checkout and installed (plain, not editable) in a fresh venv."""
    tmp = tmp_path_factory.mktemp("packaging")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=SKIP)
    wheel = _build_wheel(src, tmp / "wheels")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=tmp)
    py = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    _see_our_dependencies(py)
    _run([py, "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check", wheel], cwd=tmp)
    return Installed(src, wheel, venv, py)


@pytest.mark.timeout(300)
def test_wheel_installs_the_package_layout(installed: Installed, tmp_path: Path):
    wheel, venv, py = installed.wheel, installed.venv, installed.python

    # The wheel holds one top-level package, the plugin module and its metadata, nothing else.
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    tops = sorted({n.split("/", 1)[0] for n in names})
    assert len(tops) == 3 and tops[:2] == ["pytest_simdist.py", "simdist"], tops
    assert tops[2].startswith("simdist-") and tops[2].endswith(".dist-info"), tops
    for required in (
        "simdist/__init__.py",
        "simdist/py.typed",
        "simdist/backends/__init__.py",
        "simdist/backends/sim/__init__.py",
        "simdist/visualize/__init__.py",
        "simdist/algorithms/__init__.py",
    ):
        assert required in names, f"{required} missing from {wheel.name}"

    work = tmp_path / "elsewhere"
    work.mkdir()
    proc = _run([py, "-c", CHECK], cwd=work)
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    site = venv.resolve()
    for mod in ("simdist", "simdist.backends", "simdist.backends.sim", "simdist.visualize"):
        path = Path(found[mod]).resolve()
        assert site in path.parents, f"{mod} imported from {path}, not from the wheel installed in {site}"
    assert not found["top_backends"], "a top-level 'backends' module is importable"
    assert not found["top_visualize"], "a top-level 'visualize' module is importable"
    assert found["values"] == [10.0] * 4
    assert found["plugin_alone"], "importing the pytest plugin imported simdist"
    assert found["plugin"][0] == "pytest_simdist" and site in Path(found["plugin"][1]).resolve().parents, found[
        "plugin"
    ]


PROBE = r"""
import json, os
from pathlib import Path

import simdist
import simdist.backends.nccl
import simdist.visualize


def test_probe():
    paths = {m.__name__: m.__file__ for m in (simdist, simdist.backends, simdist.backends.nccl, simdist.visualize)}
    Path(os.environ["SIMDIST_LAYOUT_PROBE"]).write_text(json.dumps(paths))
"""


@pytest.mark.timeout(300)
def test_checkout_imports_as_installed_wherever_pytest_starts(installed: Installed, tmp_path: Path):
    """With the wheel installed (not editable), pytest started in the checkout imports the whole package from one
    tree: the checkout's ``simdist/`` with its ``backends/`` and ``visualize/`` folders at the root, or the wheel.

    This is how ``tests/gpu/run.sh`` runs on a GPU machine; ``./simdist`` has no ``backends/`` of its own.
    """
    src, py = installed.src, installed.python
    probe = src / "tests" / "test_layout_probe.py"
    probe.write_text(PROBE)
    site = installed.venv.resolve()
    for start in (src, src / "tests", src / "tests" / "gpu"):
        out = tmp_path / f"probe-{start.name}.json"
        env_probe = {"SIMDIST_LAYOUT_PROBE": str(out)}
        _run(
            [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.relpath(probe, start)],
            cwd=start,
            extra_env=env_probe,
        )
        found = {name: Path(path).resolve() for name, path in json.loads(out.read_text()).items()}
        if site in found["simdist"].parents:  # the wheel: every module from it
            for name, path in found.items():
                assert site in path.parents, f"from {start}: simdist from the wheel, {name} from {path}"
        else:
            assert found["simdist"] == (src / "simdist" / "__init__.py").resolve(), (start, found)
            assert found["simdist.backends"] == (src / "backends" / "__init__.py").resolve(), (start, found)
            assert found["simdist.backends.nccl"] == (src / "backends" / "nccl" / "__init__.py").resolve(), found
            assert found["simdist.visualize"] == (src / "visualize" / "__init__.py").resolve(), (start, found)
    # From the root, as run.sh starts it, the GPU suite collects (it skips without a GPU, it does not fail).
    proc = _run([py, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests/gpu"], cwd=src)
    assert re.search(r"^\d+ tests collected", proc.stdout, re.M) and "rror" not in proc.stdout, proc.stdout


APP_FILES = {"app.py", ".streamlit/config.toml", *(f"app_pages/{p.name}" for p in (ROOT / "app_pages").glob("*.py"))}
"""The visualizer's files, as the wheel holds them under ``simdist/app/``."""


@pytest.mark.timeout(300)
def test_wheel_ships_the_app_and_one_version(installed: Installed):
    import simdist

    with zipfile.ZipFile(installed.wheel) as zf:
        names = zf.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        version = HeaderParser().parsestr(zf.read(metadata).decode())["Version"]
    assert {n.removeprefix("simdist/app/") for n in names if n.startswith("simdist/app/")} == APP_FILES, names
    for name in APP_FILES:
        assert (_purelib(installed.python) / "simdist" / "app" / name).is_file(), name

    # One version: pyproject reads simdist.__version__ (its [project] has none of its own).
    assert version == simdist.__version__, (version, simdist.__version__)
    assert metadata == f"simdist-{version}.dist-info/METADATA", metadata
    assert installed.wheel.name.startswith(f"simdist-{version}-"), installed.wheel.name
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"], project
    cli = _run([installed.python.with_name("simdist"), "--version"], cwd=installed.venv)
    assert cli.stdout == f"simdist {version}\n", cli.stdout


@pytest.mark.timeout(300)
def test_wheel_carries_the_mit_license(installed: Installed):
    """The LICENSE file (MIT, as pyproject says) is in the repository and in the wheel's metadata."""
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n") and 'THE SOFTWARE IS PROVIDED "AS IS"' in text
    with zipfile.ZipFile(installed.wheel) as zf:
        names = zf.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        headers = HeaderParser().parsestr(zf.read(metadata).decode())
        shipped = [n for n in names if ".dist-info/" in n and n.rsplit("/", 1)[-1] == "LICENSE"]
        assert len(shipped) == 1 and zf.read(shipped[0]).decode() == text, names
    assert "MIT" in (headers["License"] or "") + (headers["License-Expression"] or ""), dict(headers)


@pytest.mark.slow
@pytest.mark.timeout(480)
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads the server's sockets from /proc (Linux)")
def test_simdist_app_serves_the_installed_visualizer(installed: Installed, chromium_path: str, tmp_path: Path):
    """``simdist app`` in the fresh venv, started outside the checkout, serves the wheel's pages on 127.0.0.1 only.

    No ``--server.address``: the address comes from the wheel's ``simdist/app/.streamlit/config.toml``.
    """
    from playwright.sync_api import sync_playwright

    work = tmp_path / "elsewhere"
    work.mkdir()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STREAMLIT_", "PYTHONPATH", "PYTHONHOME"))}
    env["HOME"] = str(tmp_path)  # no ~/.streamlit of the person running the tests
    log_path = tmp_path / "server.log"
    command = [
        str(installed.python.with_name("simdist")),
        "app",
        "--server.headless",
        "true",
        "--server.port",
        str(port),
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"simdist app did not serve {url} (exit status {proc.poll()}):\n{log_path.read_text()}")
            time.sleep(0.5)
        served = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        script = Path(next(a for a in served if a.endswith(b"app.py")).decode()).resolve()
        assert script == (_purelib(installed.python) / "simdist" / "app" / "app.py").resolve(), served
        assert _listening_addresses(port) == {"127.0.0.1"}, (_listening_addresses(port), log_path.read_text())
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium_path, headless=True, args=LAUNCH_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 720})
                page.goto(url + "/", wait_until="domcontentloaded", timeout=60_000)
                wait_for_run(page)
                assert page.title() == "simdist visualizer", page.title()
                assert page.locator("h1", has_text="Collectives, step by step").count() == 1
                assert page.locator('[data-testid="stException"]').count() == 0, log_path.read_text()
            finally:
                browser.close()
    finally:
        terminate(proc)
    assert not healthy(url), f"the server still answers on {url} after simdist app was stopped"


def test_simdist_app_names_the_extra_it_misses(monkeypatch, capsys):
    from simdist.launch import _app_cli

    assert _app_cli.app_script() == ROOT / "app.py"  # a checkout serves its own app.py
    real = _app_cli.importlib.util.find_spec
    monkeypatch.setattr(_app_cli.importlib.util, "find_spec", lambda name: None if name == "plotly" else real(name))
    assert _app_cli.main(["--server.port", "8502"]) == 1
    err = capsys.readouterr().err
    assert "(not installed: plotly)" in err and "pip install 'simdist[app]'" in err, err
    assert _app_cli.main(["--help"]) == 0 and "usage: simdist app" in capsys.readouterr().out


@pytest.mark.timeout(300)
def test_the_gpu_suite_runs_from_a_python_without_pytest_xdist(tmp_path: Path):
    """``bash tests/gpu/run.sh`` with a python that has what the script says it needs and no pytest-xdist (here,
    xdist's plugin blocked): the suite collects and runs (it skips without a GPU) and the script exits 0."""
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=SKIP)
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=tmp_path)
    _see_our_dependencies(venv / "bin" / "python")
    out = tmp_path / "out"
    env = {"PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", "PYTEST_ADDOPTS": "-p no:xdist"}
    proc = _run(["bash", "tests/gpu/run.sh", out], cwd=src, timeout=240, extra_env=env)
    log = (out / "gpu-tests.log").read_text()
    assert "unrecognized arguments" not in log and "INTERNALERROR" not in log, log[-3000:]
    assert re.search(r"^=+ \d+ (passed|skipped)", log, re.M), log[-3000:]
    assert proc.returncode == 0, proc.stdout[-3000:]
