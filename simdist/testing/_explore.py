"""``explore``: run a program under many schedules; a failure comes back with its smallest schedule."""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from pytest_simdist import OPTIONS
from simdist.core._callsite import trace_user_code
from simdist.core._errors import DistError

from ._check import check_argument
from ._explain import note_decisions
from ._program import Program
from ._run import current_test, replay_worlds, run_program, warn_leaks
from ._shrink import minimize, shrunk_failure

__all__ = ["ExploreSummary", "Plan", "explore", "explore_program", "explore_script", "minimize", "run_seed", "spmd"]
__tracebackhide__ = True  # pytest shows a failure's frames in the user's code, not simdist's

DEFAULT_RUNS = 100


@dataclass(frozen=True)
class ExploreSummary:
    """What :func:`explore` tried when every run passed."""

    runs: int
    interleavings: int  # distinct choice sequences among the runs
    strategy: str
    complete: bool  # exhaustive search that tried every schedule within its bound (up to equivalence)
    distinct: int | None = None  # exhaustive search: runs that were not reorderings of independent steps of another
    preemption_bound: int | None = None

    def __str__(self) -> str:
        within = "" if self.preemption_bound is None else f" with up to {self.preemption_bound} preemptions"
        done = f", every schedule{within}" if self.complete else ""
        classes = "" if self.distinct is None else f" ({self.distinct} not equivalent)"
        return f"{self.runs} runs ({self.strategy}{done}), {self.interleavings} distinct interleavings{classes}, no failure"


STRATEGIES = ("pct", "random", "exhaustive")


@dataclass(frozen=True)
class Plan:
    """How an exploration searches, checked when made: :func:`explore`'s arguments of the same names.

    ``max_runs`` ``None`` is 100, or ``pytest --simdist-max-schedules N``; ``progress`` ``None`` draws the
    progress line when stderr is a terminal.
    """

    strategy: str = "pct"
    max_runs: int | None = None
    depth: int = 3
    seed: int | None = None
    progress: bool | None = None
    preemption_bound: int | None = None
    reduction: bool = True

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy={self.strategy!r}: expected 'pct', 'random' or 'exhaustive'")
        if isinstance(self.depth, bool) or not isinstance(self.depth, int) or self.depth < 1:
            raise ValueError(f"depth={self.depth!r} must be a positive int")
        bound = self.preemption_bound
        if bound is not None and (
            self.strategy != "exhaustive" or isinstance(bound, bool) or not isinstance(bound, int) or bound < 0
        ):
            raise ValueError(
                f"preemption_bound={bound!r}: expected None or a non-negative int, with strategy='exhaustive'"
            )
        if not isinstance(self.reduction, bool):
            raise TypeError(f"reduction={self.reduction!r}: expected True or False")
        seed = self.seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"seed={seed!r} must be a non-negative int (or None for 0)")
        runs = self.max_runs
        if runs is not None and (isinstance(runs, bool) or not isinstance(runs, int) or runs < 1):
            raise ValueError(f"max_runs={runs!r} must be a positive int")

    @property
    def runs(self) -> int:
        """The most runs: ``max_runs``, or ``pytest --simdist-max-schedules``, or 100."""
        return self.max_runs or OPTIONS["max_schedules"] or DEFAULT_RUNS

    @property
    def show(self) -> bool:
        """Whether to draw the progress line on stderr."""
        return sys.stderr.isatty() if self.progress is None else bool(self.progress)


def run_seed(seed: int, i: int) -> int:
    """The strategy seed of run ``i`` of an exploration with ``seed``: 32 bits from ``numpy.random.SeedSequence``.

    Runs of one exploration, and the explorations of nearby seeds, draw unrelated seeds.
    """
    return int(np.random.SeedSequence(seed, spawn_key=(i,)).generate_state(1)[0])


def explore(
    fn: Callable,
    nprocs: int,
    *,
    args: tuple = (),
    strategy: str = "pct",
    max_runs: int | None = None,
    depth: int = 3,
    seed: int | None = None,
    progress: bool | None = None,
    preemption_bound: int | None = None,
    reduction: bool = True,
    check: Callable | None = None,
    **options: Any,
) -> ExploreSummary:
    """Run ``fn(rank, *args)`` on ``nprocs`` ranks under up to ``max_runs`` schedules: an :class:`ExploreSummary`.

    ``strategy`` is ``'pct'`` (priority change points of depth ``depth``: finds bugs
    that need ``depth - 1`` ill-timed preemptions with known probability),
    ``'random'`` or ``'exhaustive'``: every schedule with up to ``preemption_bound``
    preemptions (choices other than 0; ``None``: no bound), fewest first, skipping those
    that only reorder independent steps of a schedule already run (``reduction``; it sees
    only what passes through simdist, not Python state the ranks share); see
    :mod:`simdist.testing._search`. The summary's ``complete`` says whether the bound was
    covered; when ``max_runs`` cuts the search short a ``UserWarning`` says so.
    Run ``i`` uses seed :func:`run_seed` ``(seed, i)`` (``seed`` default 0), so runs and
    explorations with other seeds do not repeat each other's schedules. ``check``, if
    given, is called as ``check(values)`` (each rank's return value) after each run; if it
    raises or returns ``False`` the run fails with :class:`CheckError`. On the first failure
    the schedule is shrunk to a minimal one that fails the same way (:func:`minimize`),
    replayed once, and the error is raised with ``.schedule`` set to the minimal token
    (replay it with :func:`simdist.testing.replay`). Never-waited works and unmatched
    messages give one ``LeakWarning`` per exploration (``leaks='ignore'`` or ``'error'``
    as for :func:`simdist.simulate`).
    ``progress`` (default: when stderr is a terminal) draws a progress line on stderr.
    ``max_runs`` defaults to 100, or ``pytest --simdist-max-schedules N``. ``options``
    go to :func:`simdist.simulate` (``detail``, ``topology``, ``eager_limit``, ``isolation``: by default ``pytest
    --simdist-isolation``'s, else ``'threads'``, ...). When the
    minimal schedule has at most a few preemptions, a note on the error lists them
    (:func:`simdist.testing.explain`). The runs before a failure and the shrinking replays
    record no step snapshots unless ``record_steps`` is given (no one reads their traces);
    the error raised comes from replaying the minimal schedule with ``options`` as given.

    Args:
        fn: the program of one rank, called as ``fn(rank, *args)``.
        nprocs: the number of ranks.
        args: the arguments after ``rank``.
        strategy: ``'pct'`` (default), ``'random'`` or ``'exhaustive'``.
        max_runs: the most runs (default 100, or ``--simdist-max-schedules``).
        depth: PCT's depth (a positive int).
        seed: the exploration's seed (a non-negative int; ``None`` is 0).
        progress: draw a progress line on stderr (default: when stderr is a terminal).
        preemption_bound: with ``'exhaustive'``, the most non-zero choices per schedule.
        reduction: with ``'exhaustive'``, skip reorderings of independent steps.
        check: ``check(values)`` after each run; raising or returning ``False`` fails it.
        options: :func:`simdist.simulate`'s keyword arguments (``detail``, ``topology``, ...).

    Returns:
        An :class:`ExploreSummary` (``runs``, ``interleavings``, ``complete``, ...) when every
        run passed.

    Raises:
        DeadlockError, CollectiveMismatchError, RankError, CheckError, ...: the first failure,
            shrunk to its minimal schedule (``.schedule``) and replayed once.
        NondeterminismError: the failure did not repeat when replayed.
        ValueError: a bad ``strategy``, ``depth``, ``max_runs``, ``seed`` or
            ``preemption_bound``.
        TypeError: ``reduction`` is not a bool, or ``check`` not callable.

    Example:
        >>> import simdist, torch
        >>> import simdist.testing as sdt
        >>> def in_order(rank):                 # wrongly expects rank 1's message first
        ...     simdist.init_process_group("gloo")
        ...     t = torch.tensor([rank])
        ...     if rank > 0:
        ...         simdist.send(t, dst=0)
        ...     else:
        ...         got = [simdist.recv(t) for _ in range(simdist.get_world_size() - 1)]
        ...         assert got == sorted(got), f"rank {got[0]} came first"
        >>> try:
        ...     sdt.explore(in_order, 3, max_runs=20)
        ... except simdist.RankError as err:
        ...     print(err.__cause__, "| minimal schedule:", err.schedule)
        rank 2 came first | minimal schedule: choices:0,1@world=3...
        >>> print(sdt.explore(in_order, 2, strategy="exhaustive"))       # one sender: no race
        4 runs (exhaustive, every schedule), 4 distinct interleavings (2 not equivalent), no failure
    """
    plan = Plan(strategy, max_runs, depth, seed, progress, preemption_bound, reduction)
    check_argument(check)
    options.setdefault("test", current_test())
    options.setdefault("check_buffers", True)
    options.setdefault("isolation", OPTIONS.get("isolation") or "threads")
    return explore_program(Program(fn, nprocs, args, options, check), plan)


def explore_program(program: Program, plan: Plan) -> ExploreSummary:
    """:func:`explore` of ``program`` as ``plan`` says: its summary, or its first failure, shrunk and replayed.

    The runs share a pool of rank threads and the process-wide stand-ins; what a run leaks is warned about
    once (``leaks='warn'``, the default).
    """
    if OPTIONS["replay"] is not None:  # pytest --simdist-replay: exactly that interleaving
        run_program(program)
        return ExploreSummary(1, 1, "replay", False)
    leaks = program.options.get("leaks", "warn")
    program = program.with_options(leaks="ignore" if leaks == "warn" else leaks)  # warned once, not once per run
    from simdist.backends.sim import RankPool, held

    given = program.options.get("pool")
    with RankPool() if given is None else contextlib.nullcontext(given) as pool, held():
        program = program.with_options(pool=pool)  # the runs reuse their rank threads and the stand-ins
        if plan.strategy == "exhaustive":
            from ._search import exhaustive

            runs, distinct, complete = exhaustive(program, plan, warn_leaks=leaks == "warn")
            return ExploreSummary(runs, runs, plan.strategy, complete, distinct, plan.preemption_bound)
        return _sample(program, plan, warn=leaks == "warn")


def _sample(program: Program, plan: Plan, warn: bool) -> ExploreSummary:
    """Runs of ``program`` under ``plan.runs`` seeded PCT or random schedules: the summary, or the first failure,
    shrunk."""
    from simdist.backends.sim import PCTStrategy, RandomStrategy

    show, runs_wanted = plan.show, plan.runs
    base = 0 if plan.seed is None else plan.seed
    seen: set[tuple] = set()
    quick = program.unrecorded()  # passing runs' traces are never read; a failure is replayed with ``program``
    steps, runs = 1000, 0
    outer_trace = trace_user_code(sys._getframe())
    try:
        for i in range(runs_wanted):
            if plan.strategy == "random":
                strategy: Any = RandomStrategy(run_seed(base, i))
            else:
                strategy = PCTStrategy(run_seed(base, i), plan.depth, steps)
            runs += 1
            if show:
                print(
                    f"\rsimdist explore: {runs}/{runs_wanted} runs, {len(seen)} interleavings",
                    end="",
                    file=sys.stderr,
                    flush=True,
                )
            try:
                res = quick.run(strategy=strategy)
            except DistError as err:
                if err.choices is None:
                    raise
                shrunk = shrunk_failure(program, err)
                note_decisions(program, shrunk)
                raise shrunk
            warn = warn and not warn_leaks(res)
            seen.add(tuple(res.choices))
            if plan.strategy == "pct" and i == 0:
                steps = max(len(res.choices), plan.depth)  # PCT's change points fall among this many decisions
    finally:
        if outer_trace is not None:
            sys.settrace(outer_trace)
        if show:
            print(file=sys.stderr, flush=True)
    return ExploreSummary(runs, len(seen), plan.strategy, False)


def explore_script(
    path: str | os.PathLike,
    nprocs: int,
    args: Any = (),
    *,
    nnodes: int = 1,
    module: bool = False,
    launch: str = "auto",
    workdir: str | os.PathLike | None = None,
    strategy: str = "pct",
    max_runs: int | None = None,
    depth: int = 3,
    seed: int | None = None,
    progress: bool | None = None,
    preemption_bound: int | None = None,
    reduction: bool = True,
    check: Callable | None = None,
    **options: Any,
) -> ExploreSummary:
    """Run the script ``path`` on ``nprocs`` simulated ranks per node under up to ``max_runs`` schedules, as
    :func:`explore` runs a function: an :class:`ExploreSummary`, or the first failure, shrunk and replayed.

    Each run is one run of :func:`run_script` (torchrun's way, or once for a script that starts its own ranks),
    in a copy of ``workdir`` (default: the current directory) put back as it was before every run: what one
    schedule writes is never read by the next, and the replay of a failure starts from the same files. A run
    fails when a rank raises or exits with another status than 0, on a deadlock, a collective mismatch, a buffer
    race, a timeout (``timeout=``, real seconds per run) or when ``check(values)`` (each rank's
    :class:`ScriptRank`; called in the run's folder, where the job's files are) raises or returns ``False``.
    The failure's ``.schedule`` replays it: ``simdist run --backend sim --nproc-per-node N --replay TOKEN script``
    or :func:`run_script` with ``schedule=TOKEN``. ``pytest --simdist-replay`` and ``--simdist-max-schedules``
    apply, as to :func:`explore`.

    Args:
        path: the script (with ``module``, a module's name).
        nprocs: ranks per node.
        args: the script's arguments (strs).
        nnodes: nodes (the world is ``nprocs * nnodes`` ranks).
        module: ``path`` is a module's name.
        launch: ``'auto'``, ``'torchrun'`` or ``'spawn'``, as for :func:`run_script`.
        workdir: the folder whose copy every run starts in (default: the current directory).
        strategy: ``'pct'`` (default), ``'random'`` or ``'exhaustive'``, as for :func:`explore`.
        max_runs: the most runs (default 100, or ``--simdist-max-schedules``).
        depth: PCT's depth.
        seed: the exploration's seed.
        progress: draw a progress line on stderr (default: when stderr is a terminal).
        preemption_bound: with ``'exhaustive'``, the most non-zero choices per schedule.
        reduction: with ``'exhaustive'``, skip reorderings of independent steps.
        check: ``check(values)`` after each run, in the run's folder; raising or returning ``False`` fails it.
        options: :func:`simdist.simulate`'s keyword arguments; here ranks are processes unless
            ``isolation='threads'`` (or where the system has no pidfd), and their output is kept as their values.

    Returns:
        An :class:`ExploreSummary` when every run passed.

    Raises:
        RankError, DeadlockError, CollectiveMismatchError, BufferRaceError, CheckError, ...: the first failure,
            shrunk to its minimal schedule (``.schedule``) and replayed once.
        ValueError, TypeError: a bad argument.

    Example:
        >>> import simdist.testing as sdt
        >>> print(sdt.explore_script("train.py", 2, max_runs=50, isolation="threads"))  # doctest: +SKIP
        50 runs (pct), 12 distinct interleavings, no failure
    """
    from ._script import Script, ScriptProgram, script_defaults
    from ._workdir import Scratch

    plan = Plan(strategy, max_runs, depth, seed, progress, preemption_bound, reduction)
    script = Script.of(path, nprocs, args, nnodes=nnodes, module=module, launch=launch)
    check_argument(check)
    options.setdefault("test", current_test())
    for name, value in script_defaults(options.get("isolation") or OPTIONS.get("isolation")).items():
        options.setdefault(name, value)
    with Scratch(os.getcwd() if workdir is None else workdir) as files:
        return explore_program(ScriptProgram.of(script, options, check, files), plan)


def spmd(
    nprocs: Any = 2,
    *,
    args: tuple = (),
    strategy: str = "pct",
    max_runs: int | None = None,
    depth: int = 3,
    seed: int = 0,
    check: Callable | None = None,
    **options: Any,
) -> Callable[[Callable], Callable[[], None]]:
    """Decorator: ``fn(rank, *args)`` becomes a test that :func:`explore`\\ s it under many schedules.

    ``nprocs`` is a world size or an iterable of them (each explored in turn). The test
    fails with the minimal failing schedule's error (``check(values)`` as in :func:`explore`);
    ``pytest --simdist-replay TOKEN`` replays one schedule (at the token's world size only),
    ``--simdist-max-schedules N`` changes how many are tried. The test takes no arguments and
    keeps ``fn``'s name and docstring, so pytest collects it; ``test.spmd_function`` is ``fn``.

    Args:
        nprocs: a world size, or an iterable of them.
        args: the arguments after ``rank``.
        strategy: ``'pct'`` (default), ``'random'`` or ``'exhaustive'``.
        max_runs: the most runs per world size.
        depth: PCT's depth.
        seed: the exploration's seed.
        check: ``check(values)`` after each run.
        options: :func:`simdist.simulate`'s keyword arguments.

    Returns:
        The decorator; it returns the test function.

    Raises:
        ValueError: ``nprocs`` is not a positive int or an iterable of them.
        TypeError: ``check`` is not callable.

    Example:
        >>> import simdist, torch
        >>> import simdist.testing as sdt
        >>> @sdt.spmd(nprocs=[2, 3], max_runs=5)
        ... def test_broadcast(rank):
        ...     simdist.init_process_group("gloo")
        ...     t = torch.tensor([rank])
        ...     simdist.broadcast(t, src=0)
        ...     assert int(t) == 0
        >>> test_broadcast()                        # passes: 5 schedules at 2 ranks, 5 at 3
        >>> test_broadcast.__name__
        'test_broadcast'
    """
    worlds = [nprocs] if isinstance(nprocs, int) else list(nprocs)
    if not worlds or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in worlds):
        raise ValueError(f"nprocs={nprocs!r}: expected a positive int or an iterable of them")
    check_argument(check)

    def decorate(fn: Callable) -> Callable[[], None]:
        def test() -> None:
            for n in replay_worlds(worlds):
                explore(
                    fn,
                    n,
                    args=args,
                    strategy=strategy,
                    max_runs=max_runs,
                    depth=depth,
                    seed=seed,
                    check=check,
                    **options,
                )

        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(test, attr, getattr(fn, attr, None))
        test.spmd_function = fn  # type: ignore[attr-defined]
        return test

    return decorate
