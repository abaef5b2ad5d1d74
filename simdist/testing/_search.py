"""Bounded exhaustive search: every schedule up to k preemptions, fewest first, equivalent ones skipped.

A *preemption* is a choice other than 0 (see :mod:`simdist.backends.sim._strategies`:
choice 0 keeps the current rank, or takes the lowest runnable one). The search runs the
schedule with no preemption, then every schedule with exactly one, then two, ... up to
the bound (iterative preemption bounding, Musuvathi and Qadeer, PLDI 2007). A schedule
is a choice list; choices past its end are 0, so a schedule with b preemptions is its
parent (the same list without its last non-zero choice) plus one later non-zero choice,
and each schedule of level b + 1 is made once from the run of its parent.

*Reduction* skips schedules equivalent to one already run, with sleep sets (Godefroid,
1996). A *step* is what one rank does between two selections; two steps of different
ranks are independent when they touch nothing in common (messages of one group, peer
and tag; one group's collectives; timed waits touch everything; a step with an
any-source match is taken to touch everything). Once option ``a`` has been explored at a
scheduling point, a later option ``c`` there runs with ``a`` asleep: as long as only
steps independent of ``a``'s follow, running ``a`` would only reorder independent steps,
so the search does not choose it. Without a bound every sibling before ``c`` goes to
sleep. With a bound, running ``a`` later could need more preemptions than running it
first, so only option 0 sleeps, only while the rank chosen instead runs alone, and it is
skipped only where that costs the skipped schedule at least as many preemptions as its
equivalent (a choice other than 0, or a step after which ``a``'s rank blocked).

Only what passes through simdist is seen: ranks that share Python state (a global
variable, an object passed to every rank) are independent to the reduction even where
their order matters, as it would be between processes, which cannot share it. Pass
``reduction=False`` to search such a program.

Each run is recorded: its choices, the options at each choice, which of them slept, and
a signature of its equivalence class (for every resource the order of the steps that
touched it), so ``distinct`` counts classes, not choice lists.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from simdist.core._errors import DistError
from simdist.backends.sim import Strategy

__all__ = ["RunRecord", "Search", "SearchRun", "SearchStrategy", "preemptions", "signature"]
__tracebackhide__ = True  # pytest shows a failure's frames in the user's code, not simdist's

EVERYTHING = ("*",)  # a footprint member that makes a step depend on every other step


def _dependent(a: frozenset, b: frozenset) -> bool:
    return EVERYTHING in a or EVERYTHING in b or not a.isdisjoint(b)


class _Node:
    """A choice point of the search tree: the step each explored option's rank took there."""

    __slots__ = ("kids", "steps")

    def __init__(self) -> None:
        self.steps: dict[int, tuple[frozenset, bool]] = {}  # rank -> (footprint, still runnable after it)
        self.kids: dict[int, _Node] = {}

    def kid(self, choice: int) -> _Node:
        node = self.kids.get(choice)
        if node is None:
            node = self.kids[choice] = _Node()
        return node


@dataclass
class _Asleep:
    footprint: frozenset
    runnable_after: bool
    instead: int  # the rank chosen instead of it (bounded search: it sleeps while only that rank runs)


@dataclass
class RunRecord:
    """What one run of the search saw, for making the next level's schedules."""

    prefix: list[int]
    options: list[tuple[int, ...] | int] = field(default_factory=list)  # ranks at a selection, or senders' count
    asleep: list[frozenset] = field(default_factory=list)  # ranks at each choice that need not run there
    open_until: int | None = None  # positions from here on are covered by runs already made
    signature: Any = None

    def children(self) -> Iterator[list[int]]:
        """The schedules with one more preemption, all after this run's last one."""
        choices = self.prefix + [0] * (len(self.options) - len(self.prefix))
        end = len(self.options) if self.open_until is None else self.open_until
        for i in range(len(self.prefix), end):
            opts = self.options[i]
            width = opts if isinstance(opts, int) else len(opts)
            for v in range(1, width):
                if isinstance(opts, int) or opts[v] not in self.asleep[i]:
                    yield choices[:i] + [v]


class SearchStrategy(Strategy):
    """Replays ``prefix``, then chooses 0, keeping the sleep sets and the record of the run."""

    name = "exhaustive"

    def __init__(self, prefix: list[int], root: _Node, *, reduce: bool, bounded: bool):
        self.prefix, self.node, self.reduce, self.bounded = list(prefix), root, reduce, bounded
        self.record = RunRecord(list(prefix))
        self.sleep: dict[int, _Asleep] = {}
        self.chosen: tuple[_Node, int] | None = None  # where the running rank was chosen, to store its step
        self.picks: list[int] = []  # any-source matches in the running step
        self.steps: list[tuple[int, frozenset, tuple]] = []

    def observe(self, ran, footprint, runnable):
        fp = frozenset(footprint) | ({EVERYTHING} if self.picks else frozenset())
        if ran is not None:
            self.steps.append((ran, fp, tuple(self.picks)))
        self.picks = []
        if self.chosen is not None:
            node, rank = self.chosen
            if rank == ran:
                node.steps.setdefault(rank, (fp, rank in runnable))
            self.chosen = None
        if ran is None or not self.reduce:
            return
        for q in [
            q
            for q, s in self.sleep.items()
            if q == ran or _dependent(s.footprint, fp) or (self.bounded and s.instead != ran)
        ]:
            del self.sleep[q]
        if len(runnable) == 1 and self._skippable(runnable[0], 0) and self.record.open_until is None:
            self.record.open_until = len(self.record.options)  # its only continuation is covered

    def _skippable(self, rank: int, index: int) -> bool:
        s = self.sleep.get(rank)
        return s is not None and (not self.bounded or index != 0 or not s.runnable_after)

    def pick(self, n, options, current):
        rec, pos = self.record, len(self.record.options)
        rec.options.append(tuple(options))
        rec.asleep.append(frozenset(r for i, r in enumerate(options) if self._skippable(r, i)))
        c = self.prefix[pos] % n if pos < len(self.prefix) else 0
        if rec.open_until is None:
            if pos >= len(self.prefix) and options[0] in rec.asleep[pos]:
                rec.open_until = pos + 1  # choice 0 here is covered; the other choices here are not
            elif self.reduce:
                self._sleep_siblings(options, c)
        self.chosen = (self.node, options[c])
        self.node = self.node.kid(c)
        return c

    def _sleep_siblings(self, options, c: int) -> None:
        for i in range(1 if self.bounded else c):
            if i < c and options[i] not in self.sleep:
                step = self.node.steps.get(options[i])
                if step is not None:  # not run yet: it stays awake (always sound)
                    self.sleep[options[i]] = _Asleep(step[0], step[1], options[c])

    def pick_match(self, n):
        rec, pos = self.record, len(self.record.options)
        rec.options.append(n)
        rec.asleep.append(frozenset())
        c = self.prefix[pos] % n if pos < len(self.prefix) else 0
        self.picks.append(c)
        self.node = self.node.kid(c)
        return c

    def finish(self) -> RunRecord:
        """The run's record, with the signature of its equivalence class."""
        self.record.signature = signature(self.steps)
        return self.record


def signature(steps: list[tuple[int, frozenset, tuple]]) -> Any:
    """The equivalence class of a run: per resource, the order of the steps that touched it.

    A step is (rank, its index among that rank's steps, its matches). Two runs that only
    reorder independent steps get the same signature. A step that touches everything
    records how many steps of every rank came before it.
    """
    count: dict[int, int] = {}
    by_key: dict[Any, list] = {}
    total: list = []
    for rank, fp, picks in steps:
        k = count.get(rank, 0)
        count[rank] = k + 1
        step = (rank, k, picks)
        if EVERYTHING in fp:
            total.append((step, tuple(sorted(count.items()))))
        for key in fp:
            by_key.setdefault(key, []).append(step)
    return (tuple(sorted(count.items())), tuple(total), tuple(sorted(((repr(k), tuple(v)) for k, v in by_key.items()))))


def preemptions(choices: list[int]) -> int:
    """How many choices are not 0."""
    return sum(1 for c in choices if c)


@dataclass
class SearchRun:
    """One run of :func:`search`: its schedule, what it returned or raised, and its record."""

    choices: list[int]
    level: int
    record: RunRecord
    result: Any = None
    error: DistError | None = None


class Search:
    """Iterate to run ``fn`` under every schedule with up to ``preemption_bound`` preemptions, fewest first.

    Each step of the iteration is one :class:`SearchRun`. ``complete`` turns True when the
    iteration ends by itself: every schedule within the bound ran (or, with ``reduce``, one
    equivalent to it did); it stays False when ``max_runs`` stopped it. Errors of
    ``simdist`` (``DistError``) are kept in the run, not raised; the caller decides.
    """

    def __init__(self, program: Any, *, preemption_bound: int | None, reduce: bool, max_runs: int):
        self.program = program  # a simdist.testing Program: what one run is
        self.bound, self.reduce, self.max_runs = preemption_bound, reduce, max_runs
        self.runs = 0
        self.complete = False
        self.signatures: set = set()

    def __iter__(self) -> Iterator[SearchRun]:
        root, depth = _Node(), 0
        level: list[list[int]] = [[]]
        while level:
            nxt: list[list[int]] = []
            for prefix in level:
                if self.runs >= self.max_runs:
                    return
                self.runs += 1
                strategy = SearchStrategy(prefix, root, reduce=self.reduce, bounded=self.bound is not None)
                run = SearchRun(prefix, depth, strategy.record)
                try:
                    run.result = self.program.run(strategy=strategy)
                    run.choices = list(run.result.choices)
                except DistError as err:
                    if err.choices is None:
                        raise
                    run.error, run.choices = err, list(err.choices)
                self.signatures.add(strategy.finish().signature)
                if self.bound is None or depth < self.bound:
                    nxt.extend(strategy.record.children())
                yield run
            level, depth = nxt, depth + 1
        self.complete = True


def exhaustive(program: Any, plan: Any, warn_leaks: bool = False) -> tuple[int, int, bool]:
    """``explore(strategy="exhaustive")`` of ``program`` as ``plan`` bounds it: (runs, distinct classes, complete), or
    the first failure, shrunk.

    ``warn_leaks`` gives one ``LeakWarning`` for the first run that leaked. A ``UserWarning`` says so when
    ``plan.runs`` stopped the search before the bound was covered.
    """
    import sys
    import warnings

    from ._explain import note_decisions
    from ._run import warn_leaks as warn
    from ._shrink import shrunk_failure

    max_runs, bound, progress = plan.runs, plan.preemption_bound, plan.show
    found = Search(
        program.unrecorded(), preemption_bound=bound, reduce=plan.reduction, max_runs=max_runs
    )  # a failure is replayed with ``program``
    try:
        for run in found:
            if progress:
                print(
                    f"\rsimdist explore: {found.runs}/{max_runs} runs, {run.level} preemptions, "
                    f"{len(found.signatures)} distinct",
                    end="",
                    file=sys.stderr,
                    flush=True,
                )
            if run.error is not None:
                shrunk = shrunk_failure(program, run.error)
                note_decisions(program, shrunk)
                raise shrunk
            if warn_leaks and warn(run.result):
                warn_leaks = False
    finally:
        if progress:
            print(file=sys.stderr, flush=True)
    if not found.complete:
        within = "" if bound is None else f" with up to {bound} preemptions"
        warnings.warn(
            f"explore(strategy='exhaustive') stopped at max_runs={max_runs} before every schedule"
            f"{within} ran: the search is incomplete; raise max_runs or lower preemption_bound",
            stacklevel=4,
        )
    return found.runs, len(found.signatures), found.complete
