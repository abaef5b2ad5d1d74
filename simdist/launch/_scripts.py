"""Code that was only text (pasted code, a submission) as a module a simulated rank's process can import.

(What a rank of a script runs is in :mod:`simdist.testing._script_ranks`.)
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["importable", "run_parts", "forget"]


def importable(parts: list[tuple[str, str]], folder: str, name: str) -> Any:
    """A module ``name`` made of source ``parts`` (``(source, file name)``, run in order in its namespace), importable
    by name from ``folder`` (put first on ``sys.path``): what a rank process imports to find a function of code that
    was only ever text (pasted code, a submission). Its lines keep their file names (``solution.py:12``)."""
    import importlib
    import sys

    path = os.path.join(folder, f"{name}.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"from simdist.launch._scripts import run_parts\nrun_parts(globals(), {parts!r})\n")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    importlib.invalidate_caches()
    return importlib.import_module(name)


def run_parts(namespace: dict, parts: list[tuple[str, str]]) -> None:
    """Run each ``(source, file name)`` of ``parts`` in ``namespace``; tracebacks quote their lines."""
    import linecache

    for source, filename in parts:
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        exec(compile(source, filename, "exec"), namespace)


def forget(folder: str, name: str) -> None:
    """Undo :func:`importable`: the module and its folder leave ``sys.modules`` and ``sys.path``."""
    import sys

    sys.modules.pop(name, None)
    while folder in sys.path:
        sys.path.remove(folder)
