"""``simulate``: run an SPMD function on simulated ranks."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
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
from ._isolation import pin_target
from ._options import STEPS_UP_TO, SimOptions
from ._report import leaks as find_leaks
from ._report import undestroyed
from ._state import Settings
from ._strategies import check_token, make_strategy
from ._threads import futexes_for

__all__ = ["SimResult", "simulate"]
__tracebackhide__ = True  # pytest shows a failure's frames in the user's code, not simdist's


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
        output: with ``capture_output``, what each rank wrote, by rank: ``(stdout text, stderr text)``;
            else ``None``.
    """

    values: list
    trace: Trace
    schedule: str
    choices: list[int] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)
    points: int = 0
    option_counts: list[int] = field(default_factory=list)
    output: list[tuple[str, str]] | None = None

    @property
    def time(self) -> float:
        """The run's virtual makespan in seconds."""
        return self.trace.duration()


def _check_args(fn: Any, nprocs: Any, args: Any) -> None:
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if isinstance(nprocs, bool) or not isinstance(nprocs, int):
        raise TypeError(f"nprocs={nprocs!r} must be an int (the number of ranks)")
    if nprocs < 1:
        raise ValueError(f"nprocs={nprocs!r} must be a positive integer (the number of ranks)")
    if not isinstance(args, tuple):
        raise TypeError(f"args must be a tuple, got {type(args).__name__}")


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
    options: SimOptions | None = None,
    **fields: Any,
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
        options: how the run goes, a :class:`SimOptions` (default: its defaults).
        fields: any field of :class:`SimOptions` as a keyword: it replaces that field of ``options``.
            The fields (from SimOptions):

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
    _check_args(fn, nprocs, args)
    opts = SimOptions.of(options, fields)
    if opts.isolation == "processes" and not hasattr(os, "pidfd_open"):
        raise ValueError("isolation='processes' needs Linux (memfd and pidfd); use isolation='threads' here")
    check_token(opts.schedule, nprocs, opts.script)
    if opts.pool is not None and opts.pool.closed:
        raise RuntimeError("pool: this RankPool is closed (make a new RankPool, or pass pool=None)")
    settings = _settings(opts, nprocs)
    processes = None
    if opts.isolation == "processes":
        from ._proxy import ProcessRanks

        processes = ProcessRanks(fn, args, settings)
        fn, args = processes.serve, ()
    with _collector_skips_older_objects(nprocs):  # (the engine's objects are made after the freeze too)
        engine = Engine(
            fn,
            args,
            settings,
            strategy=make_strategy(opts.strategy, opts.seed, opts.schedule),
            topology=as_topology(
                opts.topology.copy() if isinstance(opts.topology, Topology) else opts.topology, nprocs
            ),
            make_world=partial(SimWorld, check_buffers=opts.check_buffers),
            pool=opts.pool,
            hooks=processes,
        )
        try:
            return _result(engine, opts)
        finally:
            engine.release()


def _settings(opts: SimOptions, nprocs: int) -> Settings:
    """The settings of a run of ``nprocs`` ranks under ``opts``: each default decided for it."""
    return Settings(
        size=nprocs,
        detail=opts.detail,
        eager_limit=opts.eager_limit,
        record_steps=nprocs <= STEPS_UP_TO if opts.record_steps is None else opts.record_steps,
        prefix_output=opts.prefix_output,
        cpu_time=opts.cpu_time,
        cuda_as_cpu=_default_cuda_as_cpu() if opts.cuda_as_cpu is None else bool(opts.cuda_as_cpu),
        gpus_per_node=nprocs if opts.gpus_per_node is None else opts.gpus_per_node,
        timeout=opts.timeout,
        algorithms=() if opts.algorithms is None else tuple(dict(opts.algorithms).items()),
        pin_core=pin_target() if opts.pin_cpu else None,
        test=opts.test,
        script=opts.script,
        capture_output=opts.capture_output,
    )


def _signature() -> inspect.Signature:
    """``simulate``'s signature as ``help`` shows it: each field of :class:`SimOptions` a keyword of its own."""
    own = list(inspect.signature(simulate).parameters.values())[:-1]  # fn, nprocs, args, options (no **fields)
    fields = [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
        for f in dataclasses.fields(SimOptions)
    ]
    return inspect.signature(simulate).replace(parameters=[*own, *fields])


simulate.__signature__ = _signature()  # type: ignore[attr-defined]
_FIELDS_DOC = (SimOptions.__doc__ or "").split("    Attributes:\n", 1)[1].split("\n\n    Example:", 1)[0]
simulate.__doc__ = (simulate.__doc__ or "").replace(
    "            The fields (from SimOptions):\n", _FIELDS_DOC + "\n", 1
)


def _result(engine: Engine, opts: SimOptions) -> SimResult:
    """Run ``engine`` to the end: its ``SimResult``, or the run's error (leaks and buffer races checked)."""
    leaks = opts.leaks
    if opts.trace_file is not None:
        engine.stream_trace(opts.trace_file)
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
    found = find_leaks(engine.unmatched(), engine.unwaited)
    if found and leaks != "ignore":
        text = f"the simulation left {len(found)} leak(s) (replay token {token}):\n  " + "\n  ".join(found)
        if leaks == "error":
            raise DistError(text)._with_schedule(token)
        site = user_call_site()
        filename, _, line = site.rpartition(":")
        warnings.warn_explicit(text, LeakWarning, filename or site, int(line) if line.isdigit() else 0)
    kept = undestroyed(engine.ranks)
    if kept:
        found.append(f"ranks {kept}: the default process group was never destroyed (destroy_process_group)")
    output = None
    if opts.capture_output:
        output = [("".join(rs.output[0]), "".join(rs.output[1])) if rs.output else ("", "") for rs in engine.ranks]
    return SimResult(
        values, engine.trace, token, list(engine.choices), found, engine.points, list(engine.widths), output
    )
