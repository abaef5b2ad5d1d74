"""What a simulated rank of a script runs: the script as ``__main__`` (torchrun's way), or a function the script
gave ``torch.multiprocessing.spawn`` or a ``multiprocessing.Process`` (its own ranks).

The functions a rank process receives must be importable by name (they are pickled to it), so they live in a
module of their own rather than in the launcher, which may itself run as ``__main__`` (``python -m simdist.run``).
"""

from __future__ import annotations

import functools
import os
import runpy
from typing import Any

__all__ = ["by_name", "exit_ok", "run_main", "script_rank", "spawned", "started"]


def exit_ok(fn: Any, *args: Any) -> Any:
    """``fn(*args)``, where ``sys.exit(0)`` (or ``sys.exit()``) counts as returning ``None``, as for a process."""
    try:
        return fn(*args)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
        return None


def script_rank(rank: int, script: str, n: int, world: int, master: tuple[str, int], module: bool = False) -> int:
    """Simulated rank ``rank`` of a script run torchrun-style: its exit status (0) once the script itself, run as
    ``__main__`` in a fresh namespace, has returned or called ``sys.exit(0)``.

    Its environment is its own copy (the simulator's isolation, or the rank's own process), with
    torchrun's variables for it. With ``module``, ``script`` is a module's name, run as ``python -m`` runs it.
    Another exit status leaves as ``SystemExit``, as any exception does.
    """
    os.environ.update({
        "RANK": str(rank), "LOCAL_RANK": str(rank % n), "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(n), "GROUP_RANK": str(rank // n),
        "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world),
        "MASTER_ADDR": master[0], "MASTER_PORT": str(master[1]),
    })  # fmt: skip
    run_main(script, module, "__main__")
    return 0


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
