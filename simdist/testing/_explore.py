"""``explore``: run a program under many schedules; a failure comes back with its smallest schedule."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable

from simdist._errors import DistError

from ._run import check_replays, same_failure

__all__ = ["explore", "ExploreSummary", "minimize", "spmd"]

DEFAULT_RUNS = 100
MINIMIZE_RUNS = 300  # replays spent at most on shrinking one failure


@dataclass(frozen=True)
class ExploreSummary:
    """What :func:`explore` tried when every run passed."""

    runs: int
    interleavings: int  # distinct choice sequences among the runs
    strategy: str
    complete: bool  # exhaustive search that tried every schedule

    def __str__(self) -> str:
        done = ", every schedule" if self.complete else ""
        return f"{self.runs} runs ({self.strategy}{done}), {self.interleavings} distinct interleavings, no failure"


def _max_runs(max_runs: int | None) -> int:
    from simdist._pytest_plugin import OPTIONS

    if max_runs is None:
        max_runs = OPTIONS["max_schedules"] or DEFAULT_RUNS
    if isinstance(max_runs, bool) or not isinstance(max_runs, int) or max_runs < 1:
        raise ValueError(f"max_runs={max_runs!r} must be a positive int")
    return max_runs


def explore(fn: Callable, nprocs: int, *, args: tuple = (), strategy: str = "pct", max_runs: int | None = None,
            depth: int = 3, seed: int | None = None, progress: bool | None = None, **options: Any) -> ExploreSummary:
    """Run ``fn(rank, *args)`` on ``nprocs`` ranks under up to ``max_runs`` schedules: an :class:`ExploreSummary`.

    ``strategy`` is ``'pct'`` (priority change points of depth ``depth``: finds bugs
    that need ``depth - 1`` ill-timed preemptions with known probability),
    ``'random'`` or ``'exhaustive'`` (every schedule, depth first, for small programs).
    Run ``i`` uses seed ``seed + i``. On the first failure the schedule is shrunk to a
    minimal one that fails the same way, replayed once, and the error is raised with
    ``.schedule`` set to the minimal token (replay it with :func:`simdist.testing.replay`).
    ``progress`` (default: when stderr is a terminal) draws a progress line on stderr.
    ``max_runs`` defaults to 100, or ``pytest --simdist-max-schedules N``. ``options``
    go to :func:`simdist.simulate` (``detail``, ``topology``, ``eager_limit``, ...).
    """
    from simdist.backends.sim import simulate
    from simdist._pytest_plugin import OPTIONS

    if strategy not in ("pct", "random", "exhaustive"):
        raise ValueError(f"strategy={strategy!r}: expected 'pct', 'random' or 'exhaustive'")
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth={depth!r} must be a positive int")
    runs_wanted = _max_runs(max_runs)
    options.setdefault("leaks", "ignore")
    options.setdefault("check_buffers", True)
    if OPTIONS["replay"] is not None:  # pytest --simdist-replay: exactly that interleaving
        from ._run import run

        run(fn, nprocs, args=args, **options)
        return ExploreSummary(1, 1, "replay", False)
    from simdist.backends.sim._strategies import PCTStrategy, RandomStrategy, next_schedule

    show = sys.stderr.isatty() if progress is None else bool(progress)
    base = 0 if seed is None else seed
    seen: set[tuple] = set()
    steps, prefix, complete, runs = 1000, [], False, 0
    try:
        for i in range(runs_wanted):
            if strategy == "random":
                kwargs: dict = {"strategy": RandomStrategy(base + i)}
            elif strategy == "pct":
                kwargs = {"strategy": PCTStrategy(base + i, depth, steps)}
            else:
                kwargs = {"schedule": list(prefix)}
            runs += 1
            if show:
                print(f"\rsimdist explore: {runs}/{runs_wanted} runs, {len(seen)} interleavings", end="",
                      file=sys.stderr, flush=True)
            try:
                res = simulate(fn, nprocs, args, **kwargs, **options)
            except DistError as err:
                if err.choices is None:
                    raise
                shrunk = _shrunk(fn, nprocs, args, err, options)
                shrunk.__suppress_context__ = True  # a RankError keeps its __cause__: the rank's own exception
                raise shrunk
            seen.add(tuple(res.choices))
            if strategy == "pct" and i == 0:
                steps = max(len(res.choices), depth)  # PCT's change points fall among this many decisions
            if strategy == "exhaustive":
                prefix = next_schedule(res.choices, res.option_counts)
                if prefix is None:
                    complete = True
                    break
    finally:
        if show:
            print(file=sys.stderr, flush=True)
    return ExploreSummary(runs, len(seen), strategy, complete)


def minimize(fn: Callable, nprocs: int, args: tuple, err: DistError, options: dict,
             budget: int = MINIMIZE_RUNS) -> DistError:
    """The error of the simplest schedule found that fails like ``err``: shorter, then with more zero choices."""
    from simdist.backends.sim import simulate

    best, choices, spent = err, list(err.choices), 0

    def fails(candidate: list[int]) -> DistError | None:
        nonlocal spent
        spent += 1
        try:
            simulate(fn, nprocs, args, schedule=candidate, **options)
        except DistError as again:
            return again if same_failure(err, again) else None
        return None

    while spent < budget:  # until a pass changes nothing: the shortest failing prefix, then zeros
        before = list(choices)
        lo, hi = 0, len(choices)
        while lo < hi and spent < budget:
            mid = (lo + hi) // 2
            again = fails(choices[:mid])
            if again is not None:
                hi, best = mid, again
            else:
                lo = mid + 1
        choices = choices[:hi]
        for i in reversed(range(len(choices))):  # each remaining choice to 0 (no preemption) if it still fails
            if spent >= budget:
                break
            if choices[i] != 0:
                trial = choices[:i] + [0] + choices[i + 1 :]
                again = fails(trial)
                if again is not None:
                    choices, best = trial, again
        while choices and choices[-1] == 0:
            choices.pop()
        if choices == before:
            break
    return best


def _shrunk(fn: Callable, nprocs: int, args: tuple, err: DistError, options: dict) -> DistError:
    """``err`` with the minimal schedule, after checking that it replays."""
    best = minimize(fn, nprocs, args, err, options)
    check_replays(fn, nprocs, args, best, options)
    if best.schedule != err.schedule:
        best.add_note(f"schedule shrunk from {_length(err.choices)} scheduler choices to {_length(best.choices)}; "
                      f"the original run's token: {err.schedule}")
    return best


def _length(choices: list[int] | None) -> int:
    """Choices up to the last non-zero one (the rest are implied)."""
    choices = list(choices or [])
    while choices and choices[-1] == 0:
        choices.pop()
    return len(choices)


def spmd(nprocs: Any = 2, *, args: tuple = (), strategy: str = "pct", max_runs: int | None = None, depth: int = 3,
         seed: int = 0, **options: Any) -> Callable[[Callable], Callable[[], None]]:
    """Decorator: ``fn(rank, *args)`` becomes a test that :func:`explore`\\ s it under many schedules.

    ``nprocs`` is a world size or an iterable of them (each explored in turn). The test
    fails with the minimal failing schedule's error; ``pytest --simdist-replay TOKEN``
    replays one schedule, ``--simdist-max-schedules N`` changes how many are tried.

    Example::

        @simdist.testing.spmd(nprocs=[2, 3, 4])
        def test_ring(rank):
            dist.init_process_group("gloo")
            ...
    """
    worlds = [nprocs] if isinstance(nprocs, int) else list(nprocs)
    if not worlds or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in worlds):
        raise ValueError(f"nprocs={nprocs!r}: expected a positive int or an iterable of them")

    def decorate(fn: Callable) -> Callable[[], None]:
        def test() -> None:
            for n in worlds:
                explore(fn, n, args=args, strategy=strategy, max_runs=max_runs, depth=depth, seed=seed, **options)

        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(test, attr, getattr(fn, attr, None))
        test.spmd_function = fn  # type: ignore[attr-defined]
        return test

    return decorate
