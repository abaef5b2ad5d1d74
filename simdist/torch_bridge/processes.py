# mypy: disable-error-code="method-assign,attr-defined"
# (this module replaces torch internals by design; the versions they exist in are checked in .versions)
"""Unmodified ``torch.distributed`` code on real processes joined by a simdist backend.

``simdist run --backend socket script.py`` starts each rank with ``$SIMDIST_TORCH_BACKEND=socket``,
and the rank calls :func:`install_from_env` before it runs the script. From then on every group
torch creates in this process (``init_process_group``, ``new_group``, ``DeviceMesh``'s groups) is
a simdist group of that backend seen through a bridge group (:mod:`.factory`), whatever backend the
program names: torch's collectives become simdist's, checked across ranks before data moves (a
float32/int32 mismatch is a ``CollectiveMismatchError`` naming both ranks' lines) and reported
with every rank's last state when they hang. ``get_backend()`` still answers the name the program
gave.

torch's own rendezvous is left alone: rank 0's ``init_process_group`` serves torch's ``TCPStore``
at ``MASTER_ADDR:MASTER_PORT`` as under torchrun, while simdist's groups meet in simdist's store
(``$SIMDIST_STORE``, served by the launcher). Timeouts: the timeout torch gives each group (the
program's, or torch's default), at most ``$SIMDIST_TIMEOUT`` (``simdist run --timeout``) where set.

A rank that starts processes of its own (``torch.multiprocessing.spawn``, ``start_processes``, or
``multiprocessing.Process``) passes the bridge on: the children join a job of their own, whose
store their rank 0 serves.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from multiprocessing.process import BaseProcess

import torch

from ..core._callsite import skip_directory
from . import factory, profiler, versions

__all__ = ["TORCH_BACKEND_ENV", "BRIDGED_BACKENDS", "install", "install_from_env", "installed"]

TORCH_BACKEND_ENV = "SIMDIST_TORCH_BACKEND"
"""The simdist backend that a rank's ``torch.distributed`` groups are made of (set by ``simdist run``)."""

BRIDGED_BACKENDS = ("socket",)
"""simdist's process backends that torch programs can run on through the bridge."""

_state: dict[str, Any] = {}


def installed() -> str | None:
    """The simdist backend this process's torch groups are made of, or ``None`` where the bridge is not installed."""
    return _state.get("backend")


def install_from_env() -> None:
    """:func:`install` the backend ``$SIMDIST_TORCH_BACKEND`` names, if it names one."""
    backend = os.environ.get(TORCH_BACKEND_ENV)
    if backend:
        install(backend)


def install(backend: str = "socket") -> None:
    """Make every process group torch creates in this process a group of simdist's ``backend``.

    Raises:
        ValueError: ``backend`` is not one of :data:`BRIDGED_BACKENDS`.
        RuntimeError: this torch lacks what the bridge needs (the reason says what, and what to do).
    """
    if backend not in BRIDGED_BACKENDS:
        raise ValueError(
            f"{TORCH_BACKEND_ENV}={backend!r}: torch programs run on simdist's {', '.join(BRIDGED_BACKENDS)} "
            "backend only (other backends run them on torch's own engine)"
        )
    if _state:
        return
    reason = versions.unsupported()
    if reason is not None:
        raise RuntimeError(f"simdist: torch.distributed programs cannot run on simdist's {backend} backend: {reason}")
    versions.warn_if_untested()
    from torch.distributed import distributed_c10d as c10d
    from torch.nn.parallel import DistributedDataParallel as DDP

    skip_directory(os.path.dirname(torch.__file__))  # call sites name the program's lines, not torch's
    factory.register()
    profiler.install_in_process()
    original, logging_data = c10d._new_process_group_helper, DDP._get_ddp_logging_data
    _state.update(backend=backend, start=BaseProcess.start, children=[])

    def new_process_group_helper(*args: Any, **kwargs: Any) -> Any:
        return factory.helper(original, _join, *args, **kwargs)

    c10d._new_process_group_helper = new_process_group_helper
    DDP._get_ddp_logging_data = lambda ddp: factory.ddp_logging_data(logging_data, _bridged, ddp)
    setattr(BaseProcess, "start", _start)


def _bridged() -> bool:
    return bool(_state)


def _join(rank: int, world_size: int, timeout: Any) -> None:
    """Join this process's simdist world as ``rank`` of ``world_size`` (once), at the store ``$SIMDIST_STORE`` names.

    ``env://`` finds the store there but asks for ``MASTER_ADDR`` too, which a program whose torch
    rendezvous is a ``file://`` store (torch's own tests) does not set: the store is then named as ``tcp://``.
    """
    from ..core import STORE_ENV

    from .. import api

    if not api.is_initialized():
        store = os.environ.get(STORE_ENV)
        init_method = f"tcp://{store}" if store and "MASTER_ADDR" not in os.environ else None
        api.init_process_group(
            _state["backend"],
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=factory.group_timeout(timeout),
        )


# -- ranks that start ranks: processes started by a bridged process ---------------------------------------


def _child(backend: str, store: str, target: Callable, args: tuple, kwargs: dict) -> Any:
    """A process started by a bridged one: its own job's store, the bridge, then its ``target``."""
    from ..core import SERVED_ENV, STORE_ENV

    os.environ[STORE_ENV] = store
    os.environ.pop(SERVED_ENV, None)
    install(backend)
    return target(*args, **kwargs)


def _start(process: BaseProcess) -> None:
    """``multiprocessing``'s ``Process.start``, the process running :func:`_child` around its target.

    Whatever starts the process (``torch.multiprocessing.spawn``, ``start_processes``, a
    ``multiprocessing.Process`` of the program), its torch groups are the bridge's. The processes
    started while others of this process run are one job, with a store of their own on a free
    loopback port that their rank 0 serves; once they have all ended, the next ones get a new one.
    """
    from ..core import free_port

    if process._target is not None and process._target is not _child:
        children = _state["children"]
        if not children or not any(c.is_alive() for c in children):
            children.clear()
            _state["store"] = f"127.0.0.1:{free_port()}"
        children.append(process)
        process._args = (_state["backend"], _state["store"], process._target, process._args, process._kwargs)
        process._target, process._kwargs = _child, {}
    _state["start"](process)
