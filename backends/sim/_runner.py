"""``simulate``: run an SPMD function on simulated ranks."""

from __future__ import annotations

import contextlib
import gc
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

import torch

from simdist.core import user_call_site
from simdist.core import DistError, LeakWarning
from simdist.core import Topology, as_topology
from simdist.core import Trace

from ._buffers import unsettled_race
from ._engine import Engine
from ._group import SimWorld
from ._report import leaks as find_leaks
from ._report import undestroyed
from ._strategies import check_world, make_strategy
from ._threads import RankPool, futexes_for

__all__ = ["SimResult", "simulate", "DETAILS", "ISOLATIONS"]
__tracebackhide__ = True  # pytest shows a failure's frames in the user's code, not simdist's

DETAILS = ("messages", "collectives")
ISOLATIONS = ("threads", "processes")
STEPS_UP_TO = 64
"""The largest world whose runs record step snapshots unless told (``record_steps=None``)."""


@dataclass
class SimResult:
    """What a simulated run produced.

    Attributes:
        values: each rank's return value, by rank.
        trace: every message, collective and point-to-point operation (and each algorithm step, see
            ``record_steps``), in virtual time.
        schedule: the replay token (``simulate(..., schedule=result.schedule)`` reruns it exactly).
        choices: the scheduler's choices, in order.
        leaks: unmatched messages, never-waited works and groups never destroyed.
        points: the number of scheduling points the run passed.
        option_counts: how many options each choice had (``choices[i] < option_counts[i]``).
    """

    values: list
    trace: Trace
    schedule: str
    choices: list[int] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)
    points: int = 0
    option_counts: list[int] = field(default_factory=list)

    @property
    def time(self) -> float:
        """The run's virtual makespan in seconds."""
        return self.trace.duration()


def _check_args(fn, nprocs, args, detail, eager_limit, leaks, timeout, gpus_per_node):
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if isinstance(nprocs, bool) or not isinstance(nprocs, int):
        raise TypeError(f"nprocs={nprocs!r} must be an int (the number of ranks)")
    if nprocs < 1:
        raise ValueError(f"nprocs={nprocs!r} must be a positive integer (the number of ranks)")
    if not isinstance(args, tuple):
        raise TypeError(f"args must be a tuple, got {type(args).__name__}")
    if detail not in DETAILS:
        raise ValueError(f"detail={detail!r} is not a level of detail; expected one of {DETAILS}")
    if isinstance(eager_limit, bool) or not isinstance(eager_limit, int):
        raise TypeError(f"eager_limit={eager_limit!r} must be an int number of bytes")
    if eager_limit < 0:
        raise ValueError(f"eager_limit={eager_limit!r} must be a non-negative number of bytes")
    if leaks not in ("warn", "error", "ignore"):
        raise ValueError(f"leaks={leaks!r} must be 'warn', 'error' or 'ignore'")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout={timeout!r} must be a positive number of seconds or None")
    if gpus_per_node is not None and (
        isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or gpus_per_node < 1
    ):
        raise ValueError(f"gpus_per_node={gpus_per_node!r} must be a positive int (the GPUs each rank sees) or None")


LARGE_WORLD = 512
"""From this many ranks on, a run readies the process for that many threads: the cyclic garbage collector
skips the objects older than the run, and the ranks wait on futexes of the kernel's shared table
(``_threads.futexes_for``)."""


FULL_PASS_EVERY = 100
"""While a ``LARGE_WORLD`` run runs, the collector's full passes come after this many passes of its middle
generation at the least (Python's default: 10)."""


@contextlib.contextmanager
def _collector_skips_older_objects(nprocs: int) -> Iterator[None]:
    """While the block runs, the cyclic garbage collector leaves alone the objects that were alive before it.

    A run of thousands of ranks keeps hundreds of thousands of objects alive until its last rank
    ends, so the collector's full passes come often, and each rescanned every object of the
    process, torch's ~165,000 included (a fifth of a 4096-rank run's CPU time). Frozen
    (``gc.freeze``), those are skipped; everything the run creates is collected as usual. Young
    garbage is collected first, so only what was alive is frozen; a cycle among frozen objects that
    becomes garbage during the run is freed after it. Runs of fewer than ``LARGE_WORLD`` ranks (the
    many short runs of an exploration), a collector that the program disabled, and objects frozen
    already (the program's own ``gc.freeze``, or a simulation running meanwhile in another thread)
    are left as they are.
    """
    if nprocs < LARGE_WORLD or not gc.isenabled() or gc.get_freeze_count():
        yield
        return
    gc.collect(1)
    gc.freeze()
    young, middle, full = gc.get_threshold()
    gc.set_threshold(young, middle, max(full, FULL_PASS_EVERY))
    try:
        yield
    finally:
        gc.set_threshold(young, middle, full)
        gc.unfreeze()


def _default_cuda_as_cpu() -> bool:
    """Simulate GPUs where CUDA is unavailable, or where the caller's own GPUs are simulated already."""
    from simdist import torch_bridge

    return torch_bridge.cuda.gpu_count() is not None or not torch.cuda.is_available()


def simulate(
    fn: Callable,
    nprocs: int,
    args: tuple = (),
    *,
    seed: int | None = None,
    strategy: Any = None,
    schedule: Any = None,
    detail: str = "messages",
    topology: Any = None,
    eager_limit: int = 0,
    timeout: float | None = None,
    record_steps: bool | None = None,
    prefix_output: bool = False,
    cpu_time: bool = False,
    cuda_as_cpu: bool | None = None,
    gpus_per_node: int | None = None,
    leaks: str = "warn",
    algorithms: dict[str, str] | None = None,
    pin_cpu: bool = True,
    test: str | None = None,
    check_buffers: bool = False,
    pool: RankPool | None = None,
    trace_file: Any = None,
    isolation: str = "threads",
) -> SimResult:
    """Run ``fn(rank, *args)`` on ``nprocs`` simulated ranks; return values, trace and replay token.

    Every rank is a thread and exactly one runs at a time; ``strategy`` (seeded by
    ``seed``, default ``'random'`` with seed 0) picks the next rank at each scheduling
    point, or ``schedule`` (a replay token or a list of choices) replays a run.

    Several threads may simulate at once (a Streamlit server's sessions): their ranks take
    turns at scheduling points, and each run gives what it gives alone (values, schedule,
    trace, errors). A rank that calls ``simulate`` raises: simulations do not nest.

    A run of ``LARGE_WORLD`` (512) ranks or more readies the process for its threads: while it
    runs, the cyclic garbage collector skips the objects alive before it (``gc.freeze``, undone
    after), and on Linux 6.16+ the process moves to the kernel's shared futex table for good.

    Args:
        fn: the program of one rank, called as ``fn(rank, *args)`` on every rank's thread.
        nprocs: the number of ranks (the world size).
        args: the arguments after ``rank``.
        seed: the seed of the strategy (default 0): another seed, another interleaving.
        strategy: ``'random'`` (default), ``'round_robin'``, ``'pct'`` or a ``Strategy``.
        schedule: a replay token (``SimResult.schedule`` or an error's ``.schedule``) or a
            list of scheduler choices: replays that run exactly. A token that records its
            world size (``@world=N``) replays only at that size.
        detail: ``'messages'`` runs each collective's algorithm message by message;
            ``'collectives'`` completes each collective in one step once every member has
            arrived, charging the algorithm's alpha-beta cost (for thousands of ranks).
        topology: ``None`` (``'switch'``), a name from ``simdist.TOPOLOGIES``, a networkx graph, a Topology,
            or a topology file (a ``.json`` path, as ``simdist calibrate`` writes). Besides links' latency
            and bandwidth a Topology may charge reductions (``gamma``), bandwidth shared by a rank or a
            host, page faults of new buffers (``fresh_memory`` from ``fresh_from`` bytes), copies that
            stage list arguments (``memcpy``) and a fixed start of every collective (``call_overhead``,
            ``check_overhead`` per round of the socket backend's cross-rank check); all off by default
            (formulas in :mod:`simdist.core._topology`).
        eager_limit: sends of at most this many bytes complete at once (buffered); larger
            ones wait for their receive, as on real transports. 0: every send waits.
        timeout: real seconds after which a run that does not finish raises ``DistTimeoutError``
            once its rank threads are stopped (as after Ctrl-C while waiting here); a rank stuck in C
            code is named in the error and no longer holds up other simulations of the process.
        record_steps: record the leading values of each algorithm step's buffer in the trace
            (``'step'``/``'received'`` events, which the visualizer's step views show). Default
            ``None``: at worlds up to ``STEPS_UP_TO`` (64) ranks; a collective at message detail
            makes about two per message, so at thousands of ranks they would cost more than the
            messages. ``True`` records them at any size.
        prefix_output: prefix each line a rank prints with ``[rank N]``.
        cpu_time: add each rank's measured CPU time to its virtual clock (not deterministic).
        cuda_as_cpu: give each rank simulated GPUs backed by the CPU: ``torch.cuda`` answers for them
            and tensors moved to them stay on the CPU (default: when CUDA is unavailable, or when the
            calling thread's GPUs are simulated, as in a script's parent under simdist run). What is
            mapped is listed in docs/gpu-scripts.md.
        gpus_per_node: how many simulated GPUs each rank sees (``torch.cuda.device_count()``);
            default ``nprocs``, one node holding every rank.
        leaks: ``'warn'`` (a ``LeakWarning``), ``'error'`` or ``'ignore'`` for what the run leaves behind.
        algorithms: the default algorithm per collective (``{"all_reduce": "ring"}``) for
            every group of the run; a call's ``algorithm=`` still wins.
        pin_cpu: run the rank threads on one CPU core (only one runs at a time, and
            hand-offs within a core are several times faster than across cores).
        test: the pytest node id of the test this run belongs to (``simdist.testing`` passes
            it): the replay token records it (``@test=...``), and ``pytest --simdist-replay``
            refuses the token in any other test.
        check_buffers: raise ``BufferRaceError`` when a rank writes to the buffer of its own
            ``isend``/``irecv`` (also in ``batch_isend_irecv`` and through torch) before the
            operation completed, under every schedule. It copies each such buffer when the
            operation is posted (see BENCHMARKS.md for the cost); ``simdist.testing`` turns it on.
        pool: a ``RankPool`` whose threads run the ranks, parked between runs (``simdist.testing``
            passes one per exploration: no thread is started per run); default: a new thread per
            rank, ended before this returns. A run on a pooled thread starts as on a new thread
            (generators, environment, world, grad mode), except for the user's own thread-local data.
        trace_file: a path: write the trace there as the run goes (simdist JSON, as ``Trace.to_json``,
            finished also when the run fails), keeping in memory only events that may still change;
            ``SimResult.trace`` then reads the file when its events are asked for. For long runs at
            thousands of ranks.
        isolation: ``'threads'`` (default): every rank a thread of this process, with its generators,
            ``os.environ`` and stdout kept apart by simdist. ``'processes'``: every rank a process of its own
            (forked from a server that imported torch once), with its own modules, ``atexit``, ``sys.argv``,
            signal handlers and crashes, as under torchrun; ``fn`` and ``args`` are pickled to it (``fn``
            defined at module level, as for multiprocessing's spawn). The same arguments give the same
            values, trace and replay token in both modes. Linux only.

    Returns:
        A ``SimResult``: ``values`` (each rank's return value, by rank), ``trace``, ``schedule``
        (the replay token), ``choices``, ``leaks``, ``points``, ``option_counts``, and
        ``time`` (the virtual makespan). The same arguments give the same result every time.

    Raises:
        DeadlockError, CollectiveMismatchError, RankError, DistTimeoutError, BufferRaceError:
            each with ``.schedule``, the replay token of the failing run. A rank's own
            exception arrives as ``RankError`` (its ``rank``; the exception as ``__cause__``).
        DistError: with ``leaks='error'``, what the run left behind.
        TypeError, ValueError: a bad argument, named with its value.

    Example:
        >>> import simdist, torch
        >>> def fn(rank, n):
        ...     simdist.init_process_group("gloo")
        ...     t = torch.full((n,), rank + 1)
        ...     simdist.all_reduce(t)
        ...     simdist.destroy_process_group()
        ...     return t.tolist()
        >>> res = simdist.simulate(fn, 3, args=(4,), topology="switch")
        >>> res.values
        [[6, 6, 6, 6], [6, 6, 6, 6], [6, 6, 6, 6]]
        >>> simdist.simulate(fn, 3, args=(4,), schedule=res.schedule).values == res.values
        True
        >>> res.schedule
        'random:0@world=3'
    """
    _check_args(fn, nprocs, args, detail, eager_limit, leaks, timeout, gpus_per_node)
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation={isolation!r} is not a kind of rank; expected one of {ISOLATIONS}")
    if isolation == "processes" and not hasattr(os, "pidfd_open"):
        raise ValueError("isolation='processes' needs Linux (memfd and pidfd); use isolation='threads' here")
    if test is not None and (not isinstance(test, str) or not test):
        raise ValueError(f"test={test!r} must be a pytest node id (a non-empty str) or None")
    check_world(schedule, nprocs)
    if not isinstance(check_buffers, bool):
        raise TypeError(f"check_buffers={check_buffers!r} must be a bool")
    if record_steps is not None and not isinstance(record_steps, bool):
        raise TypeError(f"record_steps={record_steps!r} must be True, False or None (on up to {STEPS_UP_TO} ranks)")
    if pool is not None and not isinstance(pool, RankPool):
        raise TypeError(f"pool={pool!r} must be a simdist.backends.sim.RankPool or None")
    if pool is not None and pool.closed:
        raise RuntimeError("pool: this RankPool is closed (make a new RankPool, or pass pool=None)")
    if algorithms is not None:
        from simdist import algorithms as registry

        if not isinstance(algorithms, dict):
            raise TypeError(
                f"algorithms must be a dict of collective name -> algorithm name, got {type(algorithms).__name__}"
            )
        for op, name in algorithms.items():
            registry.get(op, name)
    processes = None
    if isolation == "processes":
        from ._proxy import ProcessRanks

        processes = ProcessRanks(fn, args, nprocs)
        fn, args = processes.serve, ()
    with _collector_skips_older_objects(nprocs):  # (the engine's objects are made after the freeze too)
        engine = Engine(
            fn,
            args,
            nprocs,
            strategy=make_strategy(strategy, seed, schedule),
            topology=as_topology(topology.copy() if isinstance(topology, Topology) else topology, nprocs),
            detail=detail,
            eager_limit=eager_limit,
            record_steps=nprocs <= STEPS_UP_TO if record_steps is None else record_steps,
            prefix_output=prefix_output,
            cpu_time=cpu_time,
            cuda_as_cpu=_default_cuda_as_cpu() if cuda_as_cpu is None else bool(cuda_as_cpu),
            gpus_per_node=nprocs if gpus_per_node is None else gpus_per_node,
            timeout=timeout,
            make_world=partial(SimWorld, check_buffers=check_buffers),
            algorithms=algorithms,
            pin_cpu=pin_cpu,
            test=test,
            pool=pool,
            isolation=processes,
        )
        try:
            return _result(engine, leaks, trace_file)
        finally:
            engine.release()


def _result(engine: Engine, leaks: str, trace_file: Any) -> SimResult:
    """Run ``engine`` to the end: its ``SimResult``, or the run's error (leaks and buffer races checked)."""
    if trace_file is not None:
        engine.stream_trace(trace_file)
    if engine.size >= LARGE_WORLD:
        futexes_for(engine.size)
    try:
        values = engine.run()
    finally:
        token = engine.token()
        engine.trace.meta["schedule"] = token
        engine.trace.close()
    race = unsettled_race(rs.world for rs in engine.ranks)
    if race is not None:
        race.choices = list(engine.choices)
        raise race._with_schedule(token)
    found = find_leaks(engine)
    if found and leaks != "ignore":
        text = f"the simulation left {len(found)} leak(s) (replay token {token}):\n  " + "\n  ".join(found)
        if leaks == "error":
            raise DistError(text)._with_schedule(token)
        site = user_call_site()
        filename, _, line = site.rpartition(":")
        warnings.warn_explicit(text, LeakWarning, filename or site, int(line) if line.isdigit() else 0)
    kept = undestroyed(engine)
    if kept:
        found.append(f"ranks {kept}: the default process group was never destroyed (destroy_process_group)")
    return SimResult(values, engine.trace, token, list(engine.choices), found, engine.points, list(engine.widths))
