"""How a script starts its ranks, while simdist runs ranks in this process: spawn, and ``multiprocessing.Process``.

``torch.multiprocessing.spawn`` and ``start_processes`` are replaced while installed (counted:
every simulation installs them, and ``simdist run --backend sim`` for a script that starts its
own ranks). Where they are called decides what they do:

- on a simulated rank: they raise, since a rank cannot start ranks of its own (simulations
  do not nest); the error says how to run such a script;
- on the thread that :func:`starting_ranks` was entered on (the parent of a script run by
  ``simdist run``): the given starter runs ``fn`` on ``nprocs`` simulated ranks, and the call
  returns ``None`` once they have finished, as torch's does with ``join=True``;
- on any other thread: torch's own functions run.

Inside :func:`starting_ranks`, a ``multiprocessing.Process`` (or ``torch.multiprocessing``'s, or
a context's) that the parent thread makes is a :class:`SimulatedProcess`: ``start()`` queues it,
and the first ``join()`` runs every queued process as one simulated rank each, in the order they
were started, as the "Writing distributed applications" programs start theirs. The parent's
``set_start_method``/``get_start_method`` record the start method without changing this process.
Processes made on other threads (a DataLoader's workers) are real.

Touch points, measured on torch 2.13: the attributes ``spawn`` and ``start_processes`` of
``torch.multiprocessing`` (``from torch.multiprocessing import spawn`` made after the
install sees the replacement; one made before keeps torch's function); ``Process``,
``set_start_method`` and ``get_start_method`` of ``multiprocessing`` and ``torch.multiprocessing``,
and ``Process`` of ``multiprocessing``'s context classes.
"""

from __future__ import annotations

import multiprocessing
import threading
from contextlib import contextmanager
from multiprocessing import context as mp_context
from typing import Any, Callable, Iterator

import torch.multiprocessing as tmp

from ..core._world import thread_world

__all__ = ["install", "uninstall", "starting_ranks", "SimulatedProcess"]

NAMES = ("spawn", "start_processes")
_lock = threading.Lock()
_users = 0
_saved: dict[str, Any] = {}
_starter: dict[str, Any] = {}  # "thread": the parent's id, "start": its spawn, "processes": run its Processes

# Where a Process class is found, and the start method its processes have (None: the parent's default).
_PROCESS_HOLDERS: tuple[tuple[Any, str | None], ...] = (
    (multiprocessing, None),
    (tmp, None),
    (mp_context.DefaultContext, None),
    (mp_context.SpawnContext, "spawn"),
    *(
        (getattr(mp_context, f"{m.capitalize()}Context"), m)
        for m in ("fork", "forkserver")
        if hasattr(mp_context, f"{m.capitalize()}Context")
    ),
)


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
def starting_ranks(
    start: Callable[[Callable, tuple, int, str], Any], processes: Callable[[list, str], Any]
) -> Iterator[None]:
    """Within the block, this thread's ranks are simulated.

    A spawn calls ``start(fn, args, nprocs, start_method)``, not torch's; the processes this thread
    starts run at the first ``join()`` as ``processes([(target, args, kwargs), ...], start_method)``.
    """
    install()
    _starter.update(thread=threading.get_ident(), start=start, processes=processes, queued=[], method=None)
    saved = [(holder, "Process", holder.__dict__["Process"]) for holder, _ in _PROCESS_HOLDERS]
    saved += [(module, name, module.__dict__[name]) for module in (multiprocessing, tmp) for name in _METHODS]
    for holder, method in _PROCESS_HOLDERS:
        make = _process_maker(holder.__dict__["Process"], method)
        setattr(holder, "Process", make if holder in (multiprocessing, tmp) else staticmethod(make))
    for module in (multiprocessing, tmp):
        setattr(module, "set_start_method", _method_setter(module.__dict__["set_start_method"]))
        setattr(module, "get_start_method", _method_getter(module.__dict__["get_start_method"]))
    try:
        yield
    finally:
        for holder, name, original in saved:
            setattr(holder, name, original)
        _starter.clear()
        uninstall()


_METHODS = ("set_start_method", "get_start_method")


def _on_parent() -> bool:
    return _starter.get("thread") == threading.get_ident()


def _process_maker(original: Any, method: str | None) -> Callable:
    def make(*args: Any, **kwargs: Any) -> Any:
        if not _on_parent():
            return original(*args, **kwargs)
        return SimulatedProcess(*args, start_method=method, **kwargs)

    make.__name__ = make.__qualname__ = "Process"
    return make


def _method_setter(original: Callable) -> Callable:
    def set_start_method(method: str | None, force: bool = False) -> None:
        if not _on_parent():
            return original(method, force)
        if _starter["method"] is not None and not force:
            raise RuntimeError("context has already been set")
        _starter["method"] = method

    return set_start_method


def _method_getter(original: Callable) -> Callable:
    def get_start_method(allow_none: bool = False) -> str | None:
        if not _on_parent():
            return original(allow_none)
        if _starter["method"] is None and not allow_none:
            _starter["method"] = multiprocessing.get_all_start_methods()[0]
        return _starter["method"]

    return get_start_method


class SimulatedProcess:
    """A ``multiprocessing.Process`` of the parent of a script run by ``simdist run --backend sim``: a simulated rank.

    ``start()`` queues it; the first ``join()`` of any queued process runs them all, each
    ``target(*args, **kwargs)`` on its own simulated rank (rank = order of ``start()``), and
    returns when every one has finished. ``exitcode`` is then 0; a failure of the simulation
    (a rank's exception, a deadlock) is raised by that ``join()``, with its report.
    """

    def __init__(
        self,
        group: Any = None,
        target: Callable | None = None,
        name: str | None = None,
        args: tuple = (),
        kwargs: dict | None = None,
        *,
        daemon: bool | None = None,
        start_method: str | None = None,
    ):
        if group is not None:
            raise ValueError("group must be None, as for multiprocessing.Process")
        self._target, self._args, self._kwargs = target, tuple(args), dict(kwargs or {})
        self.name, self.daemon, self.exitcode, self.pid = name or "SimulatedProcess", daemon, None, None
        self._method = start_method
        self._started = False

    def run(self) -> None:
        if self._target is not None:
            self._target(*self._args, **self._kwargs)

    def start(self) -> None:
        if self._started:
            raise AssertionError("cannot start a process twice")
        self._started = True
        _starter["queued"].append(self)

    def join(self, timeout: float | None = None) -> None:
        if not self._started:
            raise AssertionError("can only join a started process")
        queued, _starter["queued"] = _starter.get("queued", []), []
        if not queued:
            return
        default = _starter.get("method") or multiprocessing.get_all_start_methods()[0]
        method = next((p._method for p in queued if p._method), None) or default
        try:
            _starter["processes"]([(p._target, p._args, p._kwargs) for p in queued], method)
        except BaseException:
            for p in queued:
                p.exitcode = 1
            raise
        for p in queued:
            p.exitcode = 0

    def is_alive(self) -> bool:
        return self._started and self.exitcode is None

    def terminate(self) -> None:
        pass

    kill = close = terminate


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
