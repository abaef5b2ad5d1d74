"""Launching SPMD functions: ``spawn`` and ``enumerate_schedules`` (``simulate`` is the simulator's own)."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:
    from simdist.backends.sim import SimResult

__all__ = ["spawn", "enumerate_schedules"]


def spawn(
    fn: Callable,
    args: tuple = (),
    nprocs: int = 1,
    join: bool = True,
    daemon: bool = False,
    start_method: str | None = None,
    *,
    backend: str = "sim",
    **options: Any,
) -> list:
    """Run ``fn(rank, *args)`` on ``nprocs`` ranks, as ``torch.multiprocessing.spawn``; return their values.

    ``backend="sim"`` runs the ranks on the simulator (``options`` go to :func:`simulate`);
    a process backend (``"socket"``, ``"gloo"``, ``"nccl"``, ``"torch-nccl"``, ``"mpi"``) runs
    one process per rank on this machine, with torchrun's environment.
    ``join``, ``daemon`` and ``start_method`` are torch's; simulated ranks are threads that
    always run to completion inside ``spawn``, so ``join=False`` is refused. For process
    backends ``start_method=None`` picks ``forkserver`` where it exists, else ``spawn``.
    Unlike torch's, it returns the ranks' return values.
    The backend is looked up in the registry and its world type starts the ranks
    (``World.spawn``); a backend that cannot start them raises ``ValueError``.

    Args:
        fn: the program of one rank, called as ``fn(rank, *args)``; for process backends it
            must be picklable (a module-level function) unless ``start_method="fork"``.
        args: the arguments after ``rank``.
        nprocs: the number of ranks.
        join: must be ``True`` (the default).
        daemon: torch's; for process backends, whether the rank processes are daemons.
        start_method: torch's; for process backends, the ``multiprocessing`` start method.
        backend: ``"sim"`` (default), or a process backend's name.
        options: for ``"sim"``, :func:`simulate`'s: ``options=`` a :class:`simdist.SimOptions`, or any of
            its fields as a keyword (``seed``, ``topology``, ...); for process backends only ``timeout``
            (seconds).

    Returns:
        Each rank's return value, by rank (``simulate(...).values`` for ``"sim"``).

    Raises:
        ValueError: ``join=False``, an unknown backend, or one that cannot launch ranks.
        TypeError: an option the process backend does not take.
        RankError: the first rank that failed, its exception as ``__cause__``.
        DeadlockError, CollectiveMismatchError: on the simulator, as :func:`simulate` raises them.

    Example:
        >>> import simdist, torch
        >>> def fn(rank, world_size):
        ...     simdist.init_process_group("gloo", rank=rank, world_size=world_size)
        ...     t = torch.tensor([rank])
        ...     simdist.all_reduce(t, op=simdist.ReduceOp.MAX)
        ...     return int(t)
        >>> simdist.spawn(fn, args=(4,), nprocs=4, backend="sim")
        [3, 3, 3, 3]
    """
    if not join:
        raise ValueError("join=False is not supported: spawn returns once every rank has finished")
    from ..core._registry import backend_spec

    # ValueError naming the registered backends, or saying the target is no World subclass
    world_type = backend_spec(backend).load()
    return world_type.spawn(fn, args, nprocs, daemon=daemon, start_method=start_method, backend=backend, **options)


def enumerate_schedules(
    fn: Callable, nprocs: int, args: tuple = (), *, max_runs: int = 1000, **options: Any
) -> Iterator["SimResult"]:
    """Yield the ``SimResult`` of every distinct schedule of a small program (depth-first).

    Each run replays a prefix of choices and records how many options each choice
    point had; the next run bumps the last choice that has an untried option. There is
    no partial-order reduction: the count grows fast with ranks and operations (two
    senders racing to one any-source receive: 112 schedules at 3 ranks). After
    ``max_runs`` runs it stops with a ``UserWarning`` saying the search is incomplete.
    The first failing schedule raises its error (with its token).
    """
    from simdist.backends.sim import next_schedule
    from simdist.backends.sim import simulate as run

    if options.get("schedule") is not None or options.get("strategy") is not None:
        raise ValueError("enumerate_schedules chooses the schedules itself; do not pass schedule or strategy")
    prefix: list[int] | None = []
    for _ in range(max_runs):
        res = run(fn, nprocs, args, schedule=list(prefix or ()), **options)
        yield res
        prefix = next_schedule(res.choices, res.option_counts)
        if prefix is None:
            return
    warnings.warn(
        f"enumerate_schedules stopped after max_runs={max_runs} runs; some schedules were not tried",
        stacklevel=2,
    )
