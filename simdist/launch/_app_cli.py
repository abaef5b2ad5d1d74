"""``simdist app``: serves the visualizer, as ``streamlit run app.py`` does in a clone.

    simdist app                                   # http://localhost:8501, for this machine only
    simdist app --server.port 8502                # any option of `streamlit run`, passed on unchanged
    simdist app --server.address 0.0.0.0          # serve a class (docs/visualizer.md, "Serving a class")

A wheel installs the visualizer's ``app.py``, ``app_pages/`` and ``.streamlit/config.toml`` in
``simdist/app/``; in a checkout (``pip install -e .``) they are the repository root's. The command
runs ``python -m streamlit run <that app.py> [options]`` in the current folder (the app offers the
topology files found there) and needs the ``app`` extra: ``pip install 'simdist[app]'``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["APP_MODULES", "app_script", "main"]

APP_MODULES = {"streamlit": "streamlit", "plotly": "plotly", "code_editor": "streamlit-code-editor"}
"""What the visualizer imports from the ``app`` extra: module name -> distribution name."""

USAGE = """\
usage: simdist app [streamlit run options...]

Serve simdist's visualizer (Streamlit) at http://localhost:8501, for this machine only.
Options are those of 'streamlit run' (python -m streamlit run --help lists them).

examples:
  simdist app                                # http://localhost:8501, for this machine only
  simdist app --server.port 8502             # another port
  simdist app --server.address 0.0.0.0       # serve everyone on the network (a class)
"""


def app_script() -> Path:
    """The visualizer's ``app.py``: ``simdist/app/app.py`` of a wheel, else the checkout's root ``app.py``.

    Raises:
        FileNotFoundError: neither holds ``app.py`` beside its ``app_pages/``.
    """
    package = Path(__file__).resolve().parent.parent  # simdist/
    for folder in (package / "app", package.parent):
        if (folder / "app.py").is_file() and (folder / "app_pages").is_dir():
            return folder / "app.py"
    raise FileNotFoundError(
        f"the visualizer (app.py and app_pages/) is neither in {package / 'app'} nor in {package.parent}: "
        "reinstall simdist (pip install 'simdist[app]')"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``simdist app``'s arguments (without the word ``app``): serve the visualizer until stopped.

    On POSIX Streamlit replaces this process (Ctrl+C, SIGTERM and the exit status are its own), so
    the call returns only for ``--help`` or an error; elsewhere it returns Streamlit's exit status.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args in (["-h"], ["--help"]):
        sys.stdout.write(USAGE)
        return 0
    missing = [dist for module, dist in APP_MODULES.items() if importlib.util.find_spec(module) is None]
    if missing:
        sys.stderr.write(
            f"simdist app: error: the visualizer needs the app extra (not installed: {', '.join(missing)}); "
            "install it with: pip install 'simdist[app]'\n"
        )
        return 1
    try:
        script = app_script()
    except FileNotFoundError as err:
        sys.stderr.write(f"simdist app: error: {err}\n")
        return 1
    command = [sys.executable, "-m", "streamlit", "run", str(script), *args]
    if os.name == "posix":
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, command)
    return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main())
