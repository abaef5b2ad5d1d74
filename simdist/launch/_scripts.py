"""What a simulated rank of a script (or of code that was only text) runs: functions a rank process can import.

The functions a rank process receives must be importable by name (they are pickled to it), so
they live here rather than in :mod:`simdist.run`, which may itself run as ``__main__``
(``python -m simdist.run``).
"""

from __future__ import annotations

import functools
import os
import runpy
from typing import Any

__all__ = ["exit_ok", "script_rank", "run_main", "spawned", "started", "by_name", "importable", "run_parts", "forget"]


def exit_ok(fn: Any, *args: Any) -> Any:
    """``fn(*args)``, where ``sys.exit(0)`` (or ``sys.exit()``) counts as returning ``None``, as for a process."""
    try:
        return fn(*args)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
        return None


def script_rank(rank: int, script: str, n: int, world: int, master: tuple[str, int], module: bool = False) -> None:
    """Simulated rank ``rank`` of a script run torchrun-style: the script itself, as ``__main__``, in a fresh namespace.

    Its environment is its own copy (the simulator's isolation, or the rank's own process), with
    torchrun's variables for it. With ``module``, ``script`` is a module's name, run as ``python -m`` runs it.
    """
    os.environ.update({
        "RANK": str(rank), "LOCAL_RANK": str(rank % n), "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(n), "GROUP_RANK": str(rank // n),
        "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world),
        "MASTER_ADDR": master[0], "MASTER_PORT": str(master[1]),
    })  # fmt: skip
    run_main(script, module, "__main__")


def run_main(script: str, module: bool, run_name: str) -> dict[str, Any]:
    """Run ``script`` (a path, or with ``module`` a module's name) as ``run_name``; ``sys.exit(0)`` counts as returning."""
    if module:
        return exit_ok(runpy.run_module, script, None, run_name, True)
    return exit_ok(runpy.run_path, script, None, run_name)


def spawned(rank: int, script: str | None, fn: Any, *args: Any) -> Any:
    """Simulated rank ``rank`` of the parent's spawn: ``fn(rank, *args)``.

    With ``script``, the rank first runs the script as ``__mp_main__`` and calls the ``fn`` of that
    fresh namespace, as the child processes of torch's 'spawn' start method do: its globals and
    the names it imports (``from torch.distributed import init_process_group``) are its own.
    Its environment is its own copy of the parent's at the spawn (the simulator's isolation).
    """
    if script is not None:
        fn = by_name(exit_ok(runpy.run_path, script, None, "__mp_main__"), fn, script)
    return exit_ok(fn, rank, *args)


def started(rank: int, mains: list, calls: list) -> Any:
    """Simulated rank ``rank`` of the parent's ``multiprocessing.Process`` ranks: its ``target(*args, **kwargs)``.

    With a script in ``mains[rank]``, the rank first runs it as ``__mp_main__`` and calls the
    target of that fresh namespace, as a child of the 'spawn' start method does.
    """
    target, args, kwargs = calls[rank]
    if target is None:
        return None
    if mains[rank] is not None:
        target = by_name(exit_ok(runpy.run_path, mains[rank], None, "__mp_main__"), target, mains[rank])
    return exit_ok(functools.partial(target, *args, **kwargs))


def by_name(namespace: dict[str, Any], fn: Any, script: str) -> Any:
    """``fn``'s namesake in ``namespace`` (a module-level function, or a class's), as unpickling finds it."""
    found: Any = namespace
    try:
        for part in fn.__qualname__.split("."):
            found = found[part] if isinstance(found, dict) else getattr(found, part)
    except (KeyError, AttributeError):
        raise RuntimeError(
            f"simdist: the function {fn.__qualname__!r} given to torch.multiprocessing.spawn is not defined when "
            f"{script} is imported, as each rank imports it (torch's 'spawn' start method): define it at module "
            "level, outside 'if __name__ == \"__main__\":'"
        ) from None
    return found


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
