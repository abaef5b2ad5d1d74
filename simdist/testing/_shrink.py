"""``minimize``: a failing schedule shrunk to a local minimum that still fails the same way.

A schedule is a list of scheduler choices, and choice 0 keeps the running rank (or takes
the lowest runnable one), so a non-zero choice is a preemption or a reordering. One
schedule is *simpler* than another (:func:`simplicity`) when it has fewer non-zero
choices, then when it is shorter, then when its choices sum lower, then when its
non-zero choices come earlier. Trailing zeros are implied, so they never count.

The shrinker works like delta debugging and Hypothesis's shrinker: passes that

1. zero blocks of non-zero choices (halving the block down to a single choice),
2. delete blocks of 8, 4, 2 and 1 consecutive choices,
3. lower each choice by one,
4. move a non-zero choice one place earlier (into a zero),

each keeping a candidate only if it replays to the same failure (:func:`same_failure`:
same exception type and user call site, on any rank), repeated until a whole round
changes nothing. Every candidate is strictly simpler than the schedule it came from, so
the passes terminate; at the fixpoint no single deletion, no lowering to zero and no
lowering by one still fails: a local minimum.

Budget: at most ``MINIMIZE_RUNS`` (1000) replays per failure. A replay of a small program
costs a few milliseconds. A failure that needs one preemption, found by PCT or random
schedules of 3 to 8 ranks, shrank in a median of 5 to 14 replays and at most 24
(tests/testing/test_shrink.py measures it over 100 seeds); the final round alone tries every
single deletion and lowering, so the cost grows with the length of the shrunk schedule.
When the budget runs out the simplest failing schedule found so far is returned; it
still fails the same way, it just may not be a local minimum.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from simdist.core._errors import DistError, add_note

from ._program import Program
from ._run import check_replays, same_failure

__all__ = ["MINIMIZE_RUNS", "Shrinker", "minimize", "shrunk_failure", "simplicity"]
__tracebackhide__ = True  # pytest shows a failure's frames in the user's code, not simdist's

MINIMIZE_RUNS = 1000  # replays spent at most on shrinking one failure
DELETE_BLOCKS = (8, 4, 2, 1)


def _trim(choices: Sequence[int]) -> tuple[int, ...]:
    """``choices`` without trailing zeros (choices past a schedule's end are 0 anyway)."""
    end = len(choices)
    while end and choices[end - 1] == 0:
        end -= 1
    return tuple(choices[:end])


def simplicity(choices: Sequence[int]) -> tuple:
    """A sort key, smaller for simpler schedules: non-zero choices, length, sum, then latest choices first."""
    c = _trim(choices)
    return sum(1 for x in c if x), len(c), sum(c), c[::-1]


class Shrinker:
    """Shrinks ``choices`` with ``attempt(candidate)``: the recorded choices of a run failing the same way, or None.

    ``run()`` returns the simplest failing schedule found (trailing zeros dropped);
    ``spent`` counts the attempts made, at most ``budget``.
    """

    def __init__(
        self, choices: Sequence[int], attempt: Callable[[list[int]], Sequence[int] | None], budget: int = MINIMIZE_RUNS
    ):
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise ValueError(f"budget={budget!r} must be a non-negative int (replays)")
        self.current = _trim(choices)
        self.attempt, self.budget, self.spent = attempt, budget, 0
        self.tried = {self.current}

    def run(self) -> tuple[int, ...]:
        """Apply every pass until a round changes nothing (or the budget is spent); the result."""
        while self.spent < self.budget:
            before = self.current
            self.zero_blocks()
            self.delete_blocks()
            self.lower()
            self.move_earlier()
            if self.current == before:
                break
        return self.current

    def consider(self, candidate: Sequence[int]) -> bool:
        """Replay ``candidate`` if it is new and simpler; keep what it recorded if it fails the same way."""
        cand = _trim(candidate)
        if cand in self.tried or self.spent >= self.budget or simplicity(cand) >= simplicity(self.current):
            return False
        self.tried.add(cand)
        self.spent += 1
        recorded = self.attempt(list(cand))
        if recorded is None:
            return False
        self.current = _trim(recorded)  # what the run did: each choice reduced modulo its options, no longer
        return True

    def zero_blocks(self) -> None:
        """Set blocks of non-zero choices to 0, from all of them at once down to one at a time."""
        size = sum(1 for c in self.current if c)
        while size >= 1:
            i = 0
            while True:
                nonzero = [j for j, c in enumerate(self.current) if c]
                if i >= len(nonzero):
                    break
                block = set(nonzero[i : i + size])
                if not self.consider([0 if j in block else c for j, c in enumerate(self.current)]):
                    i += size
            size //= 2

    def delete_blocks(self) -> None:
        """Delete runs of consecutive choices, the last ones first (later choices move earlier)."""
        for size in DELETE_BLOCKS:
            i = len(self.current) - size
            while i >= 0:
                c = self.current
                if self.consider(c[:i] + c[i + size :]):
                    i = min(i, len(self.current) - size)
                else:
                    i -= 1

    def lower(self) -> None:
        """Lower each choice above 1 by one (zeroing is :meth:`zero_blocks`'s)."""
        i = len(self.current) - 1
        while i >= 0:
            c = self.current
            if i < len(c) and c[i] > 1:
                self.consider(c[:i] + (c[i] - 1,) + c[i + 1 :])
            i -= 1

    def move_earlier(self) -> None:
        """Move each non-zero choice into the zero just before it, as far as the failure allows."""
        i = len(self.current) - 1
        while i > 0:
            c = self.current
            if i < len(c) and c[i] and not c[i - 1]:
                self.consider(c[: i - 1] + (c[i], 0) + c[i + 1 :])
            i -= 1


def minimize(
    fn: Callable,
    nprocs: int,
    args: tuple,
    err: DistError,
    options: dict,
    budget: int = MINIMIZE_RUNS,
    check: Callable | None = None,
) -> DistError:
    """The error of the simplest schedule found that fails like ``err`` (``err`` itself if none is simpler).

    Replays ``fn`` on ``nprocs`` ranks with ``options`` (and ``check`` of the values, as in
    :func:`simdist.testing.explore`) at most ``budget`` times; see this module's docstring
    for the passes and what "simplest" means. ``err.choices`` is where it starts.

    Args:
        fn: the program of the failing run, called as ``fn(rank, *args)``.
        nprocs: its number of ranks.
        args: its arguments after ``rank``.
        err: the failure to shrink: an error of a simulated run (it has ``.choices``).
        options: :func:`simdist.simulate`'s keyword arguments of the failing run
            (``detail``, ``eager_limit``, ...).
        budget: the most replays (default ``MINIMIZE_RUNS``, 1000).
        check: ``check(values)`` as in the failing run, if it had one.

    Returns:
        The error of the simplest failing schedule found: its ``.schedule`` is that schedule's
        replay token, its ``.choices`` the choices. ``err`` itself if nothing simpler fails the
        same way.

    Raises:
        ValueError: ``err`` has no scheduler choices (it did not come from a simulated run).

    Example:
        >>> import simdist, torch
        >>> import simdist.testing as sdt
        >>> def racy(rank):                    # rank 0 assumes rank 1's message comes first
        ...     simdist.init_process_group("gloo")
        ...     if rank > 0:
        ...         return simdist.send(torch.tensor([rank]), dst=0)
        ...     buf = torch.zeros(1, dtype=torch.int64)
        ...     assert (simdist.recv(buf), simdist.recv(buf)) == (1, 2)
        >>> try:
        ...     simdist.simulate(racy, 3, seed=4)
        ... except simdist.RankError as failure:
        ...     err = failure
        >>> err.schedule, err.choices
        ('random:4@world=3', [0, 1, 0, 1, 1])
        >>> sdt.minimize(racy, 3, (), err, {}).schedule
        'choices:0,1@world=3'
    """
    return _minimize(Program(fn, nprocs, args, options, check), err, budget)[0]


def _minimize(program: Program, err: DistError, budget: int) -> tuple[DistError, int]:
    """:func:`minimize`'s error for ``program`` and the replays it spent."""
    if err.choices is None:
        raise ValueError(f"err={type(err).__name__} has no scheduler choices: only a simulated run's error shrinks")
    best = err

    def attempt(candidate: list[int]) -> list[int] | None:
        nonlocal best
        try:
            program.run(schedule=candidate)
        except DistError as again:
            if again.choices is not None and same_failure(err, again):
                best = again
                return again.choices
        return None

    shrinker = Shrinker(err.choices, attempt, budget)
    shrinker.run()
    return best, shrinker.spent


def shrunk_failure(program: Program, err: DistError) -> DistError:
    """``err`` of ``program`` with the minimal schedule, as a replay of that schedule gives it; a note says how it
    shrank.

    The shrinking replays record no step snapshots (:meth:`Program.unrecorded`); the final replay, which also
    checks that the failure replays, records what the program's options say.
    """
    found, spent = _minimize(program.unrecorded(), err, MINIMIZE_RUNS)
    best = check_replays(program, found)
    if best.schedule != err.schedule:
        add_note(
            best,
            f"schedule shrunk from {_significant(err.choices)} to {_significant(best.choices)} "
            f"in {spent} replays; the original run's token: {err.schedule}",
        )
    else:
        add_note(best, f"schedule already minimal: none of {spent} simpler ones replayed fails the same way")
    best.__suppress_context__ = True  # a RankError keeps its __cause__: the rank's own exception
    return best


def _significant(choices: Sequence[int] | None) -> str:
    """How many choices, and how many non-zero, up to the last non-zero one (the rest are implied)."""
    c = _trim(choices or ())
    return f"{len(c)} scheduler choices ({sum(1 for x in c if x)} non-zero)"
