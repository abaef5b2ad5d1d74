# mypy: disable-error-code="attr-defined"
# (torch's c10d internals are reached by name: the versions they exist in are checked in .versions)
"""How torch's process groups become bridge groups: one factory for simulated ranks and real processes.

torch creates every process group (the default group of ``init_process_group``, ``new_group``,
``DeviceMesh``'s groups) in ``distributed_c10d._new_process_group_helper``. Where the bridge is
installed, :func:`helper` stands in for it: the group is created in simdist first (the rank's
default group, joined by the caller's ``join``, or ``simdist.new_group`` of the same ranks), then
in torch through the backend ``"simdist"`` (:func:`creator`), whose group forwards every op to the
simdist group. torch's registries then record the backend the program named (``"gloo"``,
``"nccl"``), so ``get_backend()`` answers as it would without simdist.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

__all__ = ["register", "helper", "creator", "ddp_logging_data", "group_timeout"]

_local = threading.local()  # .pending: ("default", None) or ("new", the simdist group), while torch creates a group
_registered = False


def register() -> None:
    """Register the torch backend ``"simdist"`` (once per process)."""
    global _registered
    if not _registered:
        import torch.distributed as tdist
        from torch.distributed import distributed_c10d as c10d

        tdist.Backend.register_backend("simdist", creator, extended_api=True, devices=["cpu", "cuda"])
        # torch 2.15 attaches its flight recorder to every group of a backend not in this set; it keys
        # entries by the C++ group name, which a Python group has not: simdist records its own ops.
        self_recording: set[str] = getattr(c10d, "_FR_SELF_RECORDING_BACKENDS", set())
        self_recording.add("simdist")
        _registered = True


def group_timeout(timeout: Any) -> Any:
    """The timeout of the simdist group for a torch group made with ``timeout`` (the program's, or torch's
    default where it gives none), at most ``$SIMDIST_TIMEOUT`` where the launcher set one (``simdist run
    --timeout``, ``simdist.spawn(timeout=)``). The simulator ignores it (its timeout is ``simulate``'s)."""
    if timeout is None or not os.environ.get("SIMDIST_TIMEOUT"):
        return timeout
    from ..core._checks import timeout_seconds
    from ..core._world import ProcessWorld

    return min(timeout_seconds(timeout, "timeout", positive=True), ProcessWorld.timeout_of(None))


def helper(
    original: Callable,
    join: Callable[[int, int, Any], None],
    group_size: int,
    group_rank: Any,
    global_ranks: list,
    backend: Any,
    store: Any,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """torch's group factory (``original``) with a simdist group first and torch's bridge group over it.

    ``join(rank, world_size, timeout)`` initializes the calling rank's simdist world for the
    default group (torch passes no ranks for it); every other group is ``simdist.new_group`` of
    the same ranks, in torch's order, with torch's timeout (:func:`group_timeout`), called on every
    rank as torch calls this.
    """
    from torch.distributed import distributed_c10d as c10d

    from .. import api

    if not global_ranks:  # the default group
        join(group_rank, group_size, kwargs.get("timeout"))
        _local.pending = ("default", None)
    else:
        timeout = group_timeout(kwargs.get("timeout"))
        _local.pending = ("new", api.new_group(list(global_ranks), timeout=timeout, sort_ranks=False))
    try:
        pg, pg_store = original(group_size, group_rank, global_ranks, "simdist", store, *args, **kwargs)
    finally:
        _local.pending = None
    if pg is not c10d.GroupMember.NON_GROUP_MEMBER:
        name = str(backend)
        c10d._world.pg_map[pg] = (name, pg_store)
        c10d._world.pg_backend_config[pg] = str(c10d.BackendConfig(c10d.Backend(name)))
        pg._set_backend_name(name)
    return pg, pg_store


def creator(opts: Any, backend_options: Any = None) -> Any:
    """torch's backend factory (extended API) for ``"simdist"``: a bridge group over the pending simdist group."""
    from .. import api
    from ..core._world import current_world
    from .group import bridge_classes

    pending = getattr(_local, "pending", None)
    if pending is None:
        raise RuntimeError(
            "simdist: the 'simdist' torch backend is created by simdist's bridge only: name the backend your "
            "program uses ('gloo', 'nccl') and run it with simdist (simdist.simulate, simdist run)"
        )
    world = current_world()
    group = (world.default_group if world is not None else None) if pending[0] == "default" else pending[1]
    if group is None or api.get_rank(group) < 0:
        raise RuntimeError(f"simdist: no simdist group for ranks {list(opts.global_ranks_in_group)}")
    return bridge_classes()[0](opts.group_rank, opts.group_size, group)


def ddp_logging_data(original: Callable, bridged: Callable[[], bool], ddp: Any) -> dict:
    """DDP's logging data naming the backend the program asked for, as torch's own groups do.

    DDP's C++ logger takes ``getBackendName()``, which a bridge group answers ``"simdist"``:
    answering ``"gloo"`` there would make the logger look for a real gloo backend. ``bridged()``
    says whether the calling thread's groups are bridge groups.
    """
    data = original(ddp)
    if bridged() and data.get("backend_name") == "simdist":
        import torch.distributed as tdist

        data["backend_name"] = name = tdist.get_backend(ddp.process_group)
        if name == "gloo":  # what the logger records for torch's gloo backend (2 threads by default)
            data.setdefault("gloo_socket_ifname", os.environ.get("GLOO_SOCKET_IFNAME", "N/A"))
            data.setdefault("gloo_device_transport", os.environ.get("GLOO_DEVICE_TRANSPORT", "N/A"))
            data.setdefault("gloo_num_threads", 2)
    return data
