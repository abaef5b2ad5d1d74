"""Run a test program, written once, on the simulator, on real socket processes or on torch's gloo.

``run(fn, nprocs, backend)`` returns the per-rank values of ``fn(rank, *args)``. Options
that only the simulator understands (``seed``, ``detail``, ``eager_limit``, ``leaks``, ...)
are ignored on the process backends (``"socket"``, ``"gloo"``), where the operating system
schedules the ranks. Their ranks are forked from the test process, so ``fn`` may be a
closure; a failing rank raises ``RankError`` (a ``DistError``) with its exception as the cause.
"""

from __future__ import annotations

from typing import Any, Callable

import simdist as dist

BACKENDS = ("sim", "socket", "gloo")
PROCESS_BACKENDS = ("socket", "gloo")
GPU_BACKENDS = ("nccl", "torch-nccl")  # tests/gpu only
SOCKET_TIMEOUT = 60.0  # seconds any one operation of a process backend may wait before the run fails


def run(fn: Callable, nprocs: int, backend: str = "sim", args: tuple = (), **sim_options: Any) -> list:
    """The values ``fn(rank, *args)`` returned on each of ``nprocs`` ranks of ``backend``."""
    if backend == "sim":
        return dist.simulate(fn, nprocs, args, **sim_options).values
    if backend in PROCESS_BACKENDS + GPU_BACKENDS:
        # CUDA does not survive fork(): once this process has used it, ranks start afresh ("spawn",
        # so ``fn`` must be a module-level function).
        import torch

        method = "spawn" if backend in GPU_BACKENDS or torch.cuda.is_initialized() else "fork"
        return dist.spawn(fn, args, nprocs, start_method=method, backend=backend, timeout=SOCKET_TIMEOUT)
    raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


def run_body(body: Callable[[int], Any], nprocs: int, backend: str = "sim", **sim_options: Any) -> list:
    """The values ``body(rank)`` returned between ``init_process_group`` and ``destroy_process_group``."""

    def fn(rank: int) -> Any:
        dist.init_process_group("gloo")
        out = body(rank)
        dist.destroy_process_group()
        return out

    return run(fn, nprocs, backend, **sim_options)


def seeds(backend: str, sim_seeds: Any) -> Any:
    """The simulator's seeds to loop over; one run on a process backend, where a seed chooses nothing."""
    return sim_seeds if backend == "sim" else (0,)
