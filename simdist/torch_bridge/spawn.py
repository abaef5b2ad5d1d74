"""``torch.multiprocessing.spawn`` and ``start_processes`` while simdist runs ranks in this process.

The two functions are replaced while installed (counted: every simulation installs them, and
``simdist run --backend sim`` for a script that starts its own ranks). Where they are called
decides what they do:

- on a simulated rank: they raise, since a rank cannot start ranks of its own (simulations
  do not nest); the error says how to run such a script;
- on the thread that :func:`starting_ranks` was entered on (the parent of a script run by
  ``simdist run``): the given starter runs ``fn`` on ``nprocs`` simulated ranks, and the call
  returns ``None`` once they have finished, as torch's does with ``join=True``;
- on any other thread: torch's own functions run.

Touch points, measured on torch 2.13: the attributes ``spawn`` and ``start_processes`` of
``torch.multiprocessing`` (``from torch.multiprocessing import spawn`` made after the
install sees the replacement; one made before keeps torch's function).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch.multiprocessing as tmp

from .._world import thread_world

__all__ = ["install", "uninstall", "starting_ranks"]

NAMES = ("spawn", "start_processes")
_lock = threading.Lock()
_users = 0
_saved: dict[str, Any] = {}
_starter: dict[str, Any] = {}  # "thread": the parent's thread id, "start": fn(fn, args, nprocs)


def install() -> None:
    """Replace ``torch.multiprocessing.spawn`` and ``start_processes`` (counted; undo with :func:`uninstall`)."""
    global _users
    with _lock:
        _users += 1
        if _users == 1:
            for name in NAMES:
                _saved[name] = getattr(tmp, name)
                setattr(tmp, name, _replacement(name))


def uninstall() -> None:
    global _users
    with _lock:
        _users -= 1
        if _users == 0:
            for name in NAMES:
                setattr(tmp, name, _saved.pop(name))


@contextmanager
def starting_ranks(start: Callable[[Callable, tuple, int, str], Any]) -> Iterator[None]:
    """Within the block, a spawn on this thread calls ``start(fn, args, nprocs, start_method)``, not torch's."""
    install()
    _starter.update(thread=threading.get_ident(), start=start)
    try:
        yield
    finally:
        _starter.clear()
        uninstall()


def _replacement(name: str) -> Callable:
    def replacement(
        fn: Callable,
        args: tuple = (),
        nprocs: int = 1,
        join: bool = True,
        daemon: bool = False,
        start_method: str = "spawn",
    ) -> Any:
        world = thread_world()
        if world is not None:
            raise RuntimeError(
                f"simdist: torch.multiprocessing.{name} was called on simulated rank {world.rank}; a simulated rank "
                "cannot start ranks of its own. Call it from the parent program instead: 'simdist run --backend "
                "sim --launch spawn script.py' runs the script once, as 'python script.py' would, and turns its "
                f"{name} into simulated ranks (or call simdist.spawn outside a simulation). Each rank of a spawn "
                "imports the script again, as torch's children do: start ranks under 'if __name__ == \"__main__\":'"
            )
        if _starter.get("thread") != threading.get_ident():
            return _saved[name](fn, args, nprocs, join, daemon, start_method)
        if not join:
            raise ValueError(
                f"simdist: torch.multiprocessing.{name}(join=False) cannot be simulated: simulated ranks run to "
                "completion inside the call; pass join=True"
            )
        _starter["start"](fn, tuple(args), nprocs, start_method)
        return None

    replacement.__name__ = replacement.__qualname__ = name
    replacement.__doc__ = (
        f"torch.multiprocessing.{name}, as simdist runs it: simulated ranks for the parent of "
        "'simdist run --backend sim', an error on a simulated rank, torch's elsewhere."
    )
    return replacement
