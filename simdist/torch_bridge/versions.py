"""The torch releases the torch bridge supports, and what differs between them.

The bridge (:mod:`simdist.torch_bridge`) relies on torch internals. It supports torch
:data:`OLDEST` and newer; CI tests it on every release in :data:`TESTED` (the oldest supported,
the newest that installs on its machines, and the one in between that the main suite uses). The
table :data:`DIFFERENCES` lists every internal whose shape changed between the tested releases
(and in torch 2.15, newer than CI's machines install, tried by hand), and how the bridge copes;
everything else it touches is the same in all of them.

Whether a release can run the bridge is decided by the internals it needs (:data:`NEEDED`), not by
its number: a release newer than every tested one runs with one ``UserWarning`` when it has them
all, and is refused, naming what it lacks, when it does not. A release older than :data:`OLDEST` is
refused with the way forward; setting ``SIMDIST_TORCH_UNTESTED=1`` tries the bridge anyway.
"""

from __future__ import annotations

import functools
import inspect
import os
import warnings
from typing import Any, Callable

import torch

__all__ = [
    "OLDEST",
    "TESTED",
    "DIFFERENCES",
    "NEEDED",
    "UNTESTED_ENV",
    "unsupported",
    "warn_if_untested",
    "release",
    "supported_range",
]

OLDEST = (2, 11)
"""The oldest torch release the bridge supports (``pyproject.toml``'s lower bound for torch)."""

TESTED = ((2, 11), (2, 13), (2, 14))
"""(major, minor) releases of torch whose torch.distributed runs on simdist, tested in CI."""

UNTESTED_ENV = "SIMDIST_TORCH_UNTESTED"

DIFFERENCES = {
    # torch internal: {release: what it is there} -- and how the bridge copes
    "ProcessGroup.gather_single / gather_into_tensor": {
        (2, 11): "absent (dist.gather_into_tensor does not exist)",
        (2, 13): "absent (dist.gather_into_tensor does not exist)",
        (2, 14): "called by dist.gather_into_tensor",
    },  # the bridge group defines both names
    "_new_process_group_helper(..., enable_reconfigure=False)": {
        (2, 11): "no enable_reconfigure argument",
        (2, 13): "no enable_reconfigure argument",
        (2, 14): "enable_reconfigure keyword added",
    },  # the bridge's wrapper passes extra arguments through unchanged
    "BackendConfig('undefined') (init_process_group() without a backend)": {
        (2, 11): "cpu:gloo",
        (2, 13): "cpu:gloo",
        (2, 14): "the accelerator's backend: cuda:nccl on a rank with simulated GPUs",
    },  # the bridge records torch's own answer for the rank, whichever it is
    "ProcessGroup.register_pre_hook / register_post_hook / get_backend": {
        (2, 11): "absent",
        (2, 13): "absent",
        (2, 14): "added; torch's Python code does not call them on a Python group",
    },
    "ProcessGroup.all_gather_single (functional collectives' all_gather_single)": {
        (2, 11): "absent (C++ callers use _allgather_base)",
        (2, 13): "called by _functional_collectives.all_gather_single",
        (2, 14): "called by _functional_collectives.all_gather_single",
    },  # the bridge group defines every name
    "new_group(..., sort_ranks=True)": {
        (2, 11): "absent: torch sorts every group's ranks",
        (2, 13): "sort_ranks=False keeps the given order",
        (2, 14): "sort_ranks=False keeps the given order",
    },  # simdist's own groups keep their order; on torch's backends (gloo) an unsorted group needs sort_ranks
    "distributed_c10d._FR_SELF_RECORDING_BACKENDS": {
        (2, 11): "absent",
        (2, 13): "absent",
        (2, 14): "absent",
        (2, 15): "new: a group of any other backend gets torch's flight recorder, keyed by the C++ group name",
    },  # "simdist" joins the set: a Python group has no C++ name, and simdist records its own ops
    "torch's profiler, a record_function ended on another thread than it began on": {
        (2, 11): "kept only where the session records every thread (profile_all_threads)",
        (2, 13): "kept, marked asynchronous",
        (2, 14): "kept, marked asynchronous",
    },  # in a rank process on 2.11 the bridge turns profile_all_threads on, as gloo's workers are recorded too
    "ReduceOp.PREMUL_SUM": {
        (2, 11): "a plain RedOpType: the factor comes from dist._make_nccl_premul_sum(factor)",
        (2, 13): "callable: ReduceOp.PREMUL_SUM(factor), or dist._make_nccl_premul_sum(factor)",
        (2, 14): "callable: ReduceOp.PREMUL_SUM(factor), or dist._make_nccl_premul_sum(factor)",
    },  # the bridge reads the factor from the op's state, which both make
}
"""What differs between the tested releases, for every internal the bridge touches."""


def _c10d() -> Any:
    from torch.distributed import distributed_c10d

    return distributed_c10d


def _parameters(fn: Any) -> list[str]:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return []


_WORLD_REGISTRIES = ("pg_map", "pg_names", "pg_group_ranks", "pg_backend_config", "tags_to_pg", "pg_to_tag")

NEEDED: tuple[tuple[str, Callable[[], bool]], ...] = (
    (
        "torch.distributed.distributed_c10d._World with its registries",
        lambda: all(hasattr(getattr(_c10d(), "_World", None), k) for k in (*_WORLD_REGISTRIES, "group_count")),
    ),
    (
        "torch.distributed.distributed_c10d._new_process_group_helper(group_size, group_rank, "
        "global_ranks_in_group, backend, store, ...)",
        lambda: (
            _parameters(getattr(_c10d(), "_new_process_group_helper", None))[:5]
            == ["group_size", "group_rank", "global_ranks_in_group", "backend", "store"]
        ),
    ),
    ("torch.distributed.distributed_c10d.rendezvous", lambda: hasattr(_c10d(), "rendezvous")),
    (
        "torch.distributed.Backend.register_backend(name, func, extended_api, devices)",
        lambda: {"extended_api", "devices"} <= set(_parameters(torch.distributed.Backend.register_backend)),
    ),
    (
        "torch._C._distributed_c10d._set_thread_isolation_mode",
        lambda: hasattr(torch._C._distributed_c10d, "_set_thread_isolation_mode"),
    ),
    (
        "torch.nn.parallel.DistributedDataParallel._get_ddp_logging_data",
        lambda: hasattr(torch.nn.parallel.DistributedDataParallel, "_get_ddp_logging_data"),
    ),
)
"""What the bridge needs of torch, each with the check that this torch has it."""


def release() -> tuple[int, int]:
    """The installed torch's (major, minor)."""
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def supported_range() -> str:
    """The supported releases in words: ``"torch 2.11 and newer (tested on 2.11, 2.13, 2.14)"``."""
    tested = ", ".join(f"{a}.{b}" for a, b in TESTED)
    return f"torch {OLDEST[0]}.{OLDEST[1]} and newer (tested on {tested})"


@functools.cache
def _missing() -> str | None:
    import torch.distributed as tdist

    if not tdist.is_available():
        return f"torch {torch.__version__} was built without torch.distributed"
    lacking = [name for name, present in NEEDED if not present()]
    return f"torch {torch.__version__} lacks {'; '.join(lacking)}" if lacking else None


def unsupported() -> str | None:
    """``None`` if torch.distributed code can run on simdist with this torch, else why not (and what to do)."""
    missing = _missing()
    if missing is not None:
        return f"{missing}, which simdist's torch.distributed bridge needs ({supported_range()})"
    if release() >= OLDEST or os.environ.get(UNTESTED_ENV) == "1":
        return None
    return (
        f"simdist's torch.distributed bridge supports {supported_range()}, not torch {torch.__version__}: "
        f"install a supported release (pip install 'torch>={OLDEST[0]}.{OLDEST[1]}'), or set {UNTESTED_ENV}=1 "
        "to try this torch anyway"
    )


_warned: list[str] = []


def warn_if_untested() -> None:
    """One ``UserWarning`` per process when this torch is newer than every tested release."""
    if release() <= max(TESTED) or _warned:
        return
    newest = ".".join(map(str, max(TESTED)))
    _warned.append(torch.__version__)
    warnings.warn(
        f"simdist's torch.distributed bridge was tested up to torch {newest}; torch {torch.__version__} has "
        "everything it needs, so it runs, untested",
        UserWarning,
        stacklevel=3,
    )
