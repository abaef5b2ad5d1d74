# mypy: disable-error-code="method-assign,attr-defined,assignment"
# (this module patches torch internals by design: every touch point of torch is here, with its version guards)
"""Unmodified ``torch.distributed`` code on simulated ranks: where the bridge touches torch's internals.

While any simulation runs (:func:`install` when the first starts, :func:`uninstall` when the last
ends; simulations may run at once on several threads):

- torch's process-group bookkeeping (``distributed_c10d._world``) becomes per thread, so
  each rank thread has its own default group and group registries (torch's thread
  isolation mode on), and autograd's device threads are off;
- on a rank thread, torch's rendezvous (``env://``, ``tcp://``, ``file://``, a given store)
  becomes a store shared by the ranks of its simulation (:func:`new_store`), and every
  group torch creates (``init_process_group``, ``new_group``, ``DeviceMesh``'s groups) is
  first created in simdist and then, in torch, as a :class:`~simdist.torch_bridge.group` bridge
  group, whatever backend the program names; ``get_backend()`` still answers the name the program gave
  (``"gloo"``, ``"nccl"``). Both hooks sit under torch's public functions, so a
  ``from torch.distributed import init_process_group`` made before the simulation works too;
- torch's own folder is library code for call sites, and warnings raised on rank threads
  point at the user's line; torch's ``[rankN]:`` exception hook is undone at the end;
- torch's profiler is shared by the ranks (:mod:`simdist.torch_bridge.profiler`).

So a rank's torch calls become simdist calls: scheduled, checked, traced and replayable.
Which torch releases this was tested on, and what differs between them, is in
:mod:`simdist.torch_bridge.versions`.
"""

from __future__ import annotations

import functools
import operator
import os
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

from . import factory, profiler, versions
from .group import STARTED_BY_RANK
from ..core._callsite import INSTALLED, is_library_file, skip_directory, user_call_site

__all__ = [
    "install",
    "uninstall",
    "new_store",
    "enter_rank",
    "leave_rank",
    "in_rank",
    "note_shared_state",
    "carry",
    "started_by_rank",
]

_OWN = ("pg_map", "pg_names", "pg_group_ranks", "pg_backend_config", "tags_to_pg", "pg_to_tag")
_state: dict[str, Any] = {}
_local = threading.local()  # .world: the rank's torch world; .store: its run's


# -- per-thread torch worlds ------------------------------------------------------------------------------


def _rank_world_class() -> type:
    from torch.distributed import distributed_c10d as c10d

    class RankWorld(c10d._World):
        """One rank's torch world: the registries torch keeps in module globals, owned by this object."""

        def __init__(self) -> None:
            super().__init__()
            self._own: dict[str, dict] = {k: {} for k in _OWN}
            self._count = 0

    for key in _OWN:
        setattr(RankWorld, key, property(_owned(key)))
    setattr(RankWorld, "group_count", property(operator.attrgetter("_count"), _set_count))
    return RankWorld


def _owned(key: str) -> Callable[[Any], dict]:
    """The getter of a rank world's own registry ``key``."""

    def get(world: Any) -> dict:
        return world._own[key]

    return get


def _set_count(world: Any, value: int) -> None:
    world._count = value


class _WorldProxy:
    """Stands for ``distributed_c10d._world``: the calling rank thread's world, or the process's."""

    def __init__(self, fallback: Any):
        object.__setattr__(self, "_fallback", fallback)

    def __getattr__(self, name: str) -> Any:
        return getattr(getattr(_local, "world", None) or self._fallback, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(getattr(_local, "world", None) or self._fallback, name, value)


def in_rank() -> bool:
    """Whether the calling thread is a rank thread of a running simulation with the bridge installed."""
    return getattr(_local, "world", None) is not None


# -- threads a rank starts ----------------------------------------------------------------------------------

_CARRIERS: list[Callable[[], Callable[[], Callable[[], None]]]] = []


def carry(capture: Callable[[], Callable[[], Callable[[], None]]]) -> None:
    """Register what a thread a rank starts takes from the rank: ``capture()`` runs on the rank's thread as it
    starts the thread and returns ``enter``; the new thread calls ``enter()`` first, and the ``leave`` it returns
    last."""
    _CARRIERS.append(capture)


def started_by_rank() -> bool:
    """Whether the calling thread is one that a simulated rank started (it sees the rank's world)."""
    return getattr(threading.current_thread(), STARTED_BY_RANK, False)


def _thread_start(original: Callable) -> Callable:
    def start(self: threading.Thread) -> None:
        """``threading.Thread.start``; a thread a simulated rank starts (not simdist's own) runs in the rank's world:
        its torch world and process groups, its simulated GPUs, its environment and output (what :func:`carry`
        registered). What it calls of the rank's process groups is refused (the bridge's groups check
        :data:`STARTED_BY_RANK`)."""
        if in_rank() and not self.name.startswith("simdist"):
            world, store = _local.world, _local.store
            enters = [capture() for capture in _CARRIERS]
            run = self.run

            def run_in_rank() -> None:
                _local.world, _local.store = world, store
                leaves = [enter() for enter in enters]
                try:
                    run()
                finally:
                    for leave in reversed(leaves):
                        leave()
                    _local.world = _local.store = None

            self.run = run_in_rank  # type: ignore[method-assign]
            setattr(self, STARTED_BY_RANK, True)
        original(self)

    return start


# -- torch's hooks, on rank threads -------------------------------------------------------------------------


def _rendezvous(url: str, rank: int = -1, world_size: int = -1, **kwargs: Any) -> Any:
    """torch's ``rendezvous`` on a rank thread: the simulation's store, this rank, the simulated world size."""
    if not in_rank():
        yield from _state["rendezvous"](url, rank, world_size, **kwargs)
        return
    if started_by_rank():
        from .group import refuse_on_started_thread

        refuse_on_started_thread("torch.distributed.init_process_group")
    from .. import api

    _join_simdist(rank, world_size, kwargs.get("timeout"))
    if isinstance(_local.store, _Lazy):
        _local.store = _local.store.make()
    yield _local.store, api.get_rank(), api.get_world_size()


def _join_simdist(rank: int, world_size: int, timeout: Any) -> None:
    """Initialize the rank's simdist world (once); ``rank``/``world_size`` must match the simulation."""
    from .. import api

    if not api.is_initialized():
        api.init_process_group("sim", rank=rank, world_size=world_size, timeout=timeout)


def _new_process_group_helper(
    group_size: int, group_rank: Any, global_ranks: list, backend: Any, store: Any, *args: Any, **kwargs: Any
) -> Any:
    """torch's group factory on a rank thread: the simdist group first, then torch's bridge group over it."""
    if not in_rank():
        return _state["helper"](group_size, group_rank, global_ranks, backend, store, *args, **kwargs)
    if started_by_rank():
        from .group import refuse_on_started_thread

        refuse_on_started_thread("torch.distributed's making of a process group")
    versions.warn_if_untested()
    return factory.helper(
        _state["helper"], _join_simdist, group_size, group_rank, global_ranks, backend, store, *args, **kwargs
    )


# -- call sites, warnings and the exception hook ------------------------------------------------------------

_SIMULATED_NCCL = "Attempted to get default timeout for nccl backend, but NCCL support is not compiled"


def _showwarning(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
    """``warnings.showwarning`` during a simulation: a warning raised in library code on a rank shows the user's line."""
    if in_rank() and str(message).startswith(_SIMULATED_NCCL):
        return  # a GPU program's init_process_group("nccl") on a torch without NCCL: simulated, nothing to warn
    if in_rank() and (is_library_file(filename) or filename.startswith(INSTALLED)):
        site = user_call_site(skip=INSTALLED)
        path, _, number = site.rpartition(":")
        if path and number.isdigit():
            filename, lineno, line = path, int(number), None
    _state["showwarning"](message, category, filename, lineno, file, line)


def _compile(*args: Any, **kwargs: Any) -> Any:
    """``torch.compile``; on a rank thread, the bridge's groups are first hidden from the compiler (called, not traced)."""
    if in_rank():
        from .group import hide_from_compiler

        hide_from_compiler()
    return _state["compile"](*args, **kwargs)


def _ddp_logging_data(ddp: Any) -> dict:
    """DDP's logging data, naming on a rank thread the backend the program asked for."""
    return factory.ddp_logging_data(_state["ddp_logging_data"], in_rank, ddp)


_UNKNOWN_GROUP = ("is not registered", "Default process group has not been initialized",
                  "Invalid process group specified", "is not initialized in the world group map",
                  "group object, not rank")  # fmt: skip
"""torch's errors (and simdist's) for a process group this rank's torch world does not hold."""

SHARED_STATE_NOTE = (
    "simdist: the ranks are threads of one process here, so they share module state: a library that keeps a "
    "process group, or its own 'initialized' state, in a module or class (DeepSpeed's groups, accelerate's "
    "PartialState) hands one rank's to another, and torch does not know it on this rank. Run with --isolation "
    "processes (simdist run, simdist test; isolation='processes' in Python): each rank a process of its own, as "
    "under torchrun."
)


def note_shared_state(exc: BaseException) -> None:
    """On a rank thread: add :data:`SHARED_STATE_NOTE` to ``exc`` if torch raised it for a group this rank does not
    hold (ranks as threads only: a rank process has module state of its own)."""
    if in_rank() and isinstance(exc, (ValueError, RuntimeError)) and any(m in str(exc) for m in _UNKNOWN_GROUP):
        from ..core._errors import add_note

        add_note(exc, SHARED_STATE_NOTE)


# -- install / uninstall ----------------------------------------------------------------------------------


def install() -> None:
    """Make torch.distributed per rank thread and route it to simdist, for the simulations about to run."""
    import torch.distributed as tdist

    skip_directory(os.path.dirname(torch.__file__))
    _state.update(showwarning=warnings.showwarning, excepthook=sys.excepthook)
    warnings.showwarning = _showwarning
    profiler.install(in_rank)
    reason = versions.unsupported()
    if reason is not None:  # torch's entry points refuse on rank threads, saying why and what to do
        from torch.distributed import distributed_c10d as c10d

        entries = [(m, n) for m in (tdist, c10d) for n in _ENTRIES if hasattr(m, n)]
        _state["refused"] = [(m, n, getattr(m, n)) for m, n in entries]
        for m, n in entries:
            setattr(m, n, _refusing(getattr(m, n), reason))
        return
    from torch.distributed import distributed_c10d as c10d

    factory.register()
    from torch.nn.parallel import DistributedDataParallel as DDP

    _state.update(
        c10d=c10d,
        world=c10d._world,
        rendezvous=c10d.rendezvous,
        helper=c10d._new_process_group_helper,
        multithreading=torch._C._is_multithreading_enabled(),
        rank_world=_rank_world_class(),
        ddp_logging_data=DDP._get_ddp_logging_data,
        compile=torch.compile,
    )
    torch.compile = _compile
    DDP._get_ddp_logging_data = _ddp_logging_data
    _state["thread_start"] = threading.Thread.start
    threading.Thread.start = _thread_start(threading.Thread.start)  # type: ignore[method-assign]
    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    c10d._world = _WorldProxy(c10d._world)
    c10d.rendezvous = _rendezvous
    c10d._new_process_group_helper = _new_process_group_helper
    torch._C._set_multithreading_enabled(False)


def uninstall() -> None:
    """Undo :func:`install`."""
    if "showwarning" in _state:
        warnings.showwarning = _state["showwarning"]
        sys.excepthook = _state["excepthook"]
        profiler.uninstall()
    for module, name, original in _state.get("refused", ()):
        setattr(module, name, original)
    if "c10d" in _state:
        c10d = _state["c10d"]
        c10d._world = _state["world"]
        c10d.rendezvous = _state["rendezvous"]
        c10d._new_process_group_helper = _state["helper"]
        from torch.nn.parallel import DistributedDataParallel as DDP

        DDP._get_ddp_logging_data = _state["ddp_logging_data"]
        threading.Thread.start = _state["thread_start"]  # type: ignore[method-assign]
        torch.compile = _state["compile"]
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
        torch._C._set_multithreading_enabled(_state["multithreading"])
    _state.clear()


def new_store() -> Any:
    """A store for the ranks of one simulation to share (``None`` where torch.distributed cannot run on ranks)."""
    if "c10d" not in _state:
        return None
    import torch.distributed as tdist

    return tdist.HashStore()


class _Lazy:
    """A store made on first use (a rank process's client of its run's store)."""

    def __init__(self, make: Callable[[], Any]):
        self.make = make


def enter_rank(store: Any, make_store: Callable[[], Any] | None = None) -> None:
    """Give the calling rank thread its own torch world; ``store`` is its simulation's (:func:`new_store`), or
    ``make_store()`` makes it on first use."""
    if make_store is not None:
        store = _Lazy(make_store)
    _local.rank = True
    if "c10d" in _state:
        _local.world = _state["rank_world"]()
        _local.store = store


def leave_rank() -> None:
    """The calling rank thread leaves its run: its torch world goes, and so do the process groups it
    registered (thread-local in torch's isolation mode), so a thread reused by the next run starts clean."""
    c10d = torch._C._distributed_c10d
    if getattr(_local, "world", None) is not None and hasattr(c10d, "_unregister_all_process_groups"):
        c10d._unregister_all_process_groups()
    _local.world = _local.rank = _local.store = None


_ENTRIES = ("init_process_group", "rendezvous", "_new_process_group_helper")
"""torch's ways into a process group, refused on rank threads when this torch is not supported."""


def _refusing(original: Any, reason: str) -> Any:
    @functools.wraps(original)
    def refuse(*args: Any, **kwargs: Any) -> Any:
        if getattr(_local, "rank", None):
            raise RuntimeError(
                f"{reason}; torch.distributed code cannot run on simulated ranks with it "
                "(simdist's own API, `import simdist as dist`, still can)"
            )
        return original(*args, **kwargs)

    return refuse
