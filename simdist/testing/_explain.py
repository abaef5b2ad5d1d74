"""``explain``: the scheduling decisions of a replay token, in the words of the program's call sites.

A schedule is a list of choices, and choice 0 is the one a run makes undisturbed (the
running rank goes on, or the lowest runnable one starts; an any-source receive takes the
lowest sender). Every other choice is a decision that made this run differ from the
plain one. :func:`explain` replays the token and says, for each such decision, which rank
went first instead of which, at which scheduling point, and what happened next: which
send a receive matched, at the user's call sites.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from simdist.core._errors import DistError, RankError, add_note

__all__ = ["MAX_NOTED", "explain", "note_decisions"]
__tracebackhide__ = True  # pytest shows a failure's frames in the user's code, not simdist's

MAX_NOTED = 8  # a failure's message lists its decisions when it has at most this many


@dataclass(frozen=True)
class _Decision:
    """One non-zero choice: ``chosen`` went first instead of ``instead`` (what choice 0 picks)."""

    kind: str  # 'run': which rank runs next; 'match': which sender an any-source receive takes
    step: int  # scheduling points passed before it
    chosen: int
    instead: int
    event: int  # the trace's length at the decision: what follows it starts there
    receiver: int | None = None  # for 'match': the receiving rank and its call site
    recv_site: str | None = None


def _recorder(inner: Any) -> Any:
    """A strategy that chooses as ``inner`` does and keeps every non-zero choice as a :class:`_Decision`."""
    from simdist.backends.sim import Strategy

    class Recorder(Strategy):
        name = inner.name

        def __init__(self) -> None:
            self.decisions: list[_Decision] = []
            self.trace: Any = None

        def pick(self, n: int, options: Sequence[int], current: int | None) -> int:
            return inner.pick(n, options, current)

        def pick_match(self, n: int) -> int:
            return inner.pick_match(n)

        def token(self) -> str | None:
            return inner.token()

        def chose(self, engine: Any, kind: str, options: Sequence[int], index: int, subject: Any) -> None:
            self.trace = engine.trace
            if index == 0:
                return
            at = len(engine.trace)
            if kind == "match":
                decision = _Decision(
                    kind, engine.points, options[index], options[0], at, subject.dst, subject.call_site
                )
            else:
                decision = _Decision(kind, engine.points, options[index], options[0], at)
            self.decisions.append(decision)

    return Recorder()


def explain(fn: Callable, nprocs: int, token: Any, args: tuple = (), **options: Any) -> list[str]:
    """The decisions of ``token`` that made its run differ from the plain one, one line each, in order.

    Replays ``fn(rank, *args)`` on ``nprocs`` ranks under ``token`` (a replay token, a
    :class:`~simdist.testing.Schedule` or a list of choices) and describes each non-zero
    choice at the program's own call sites, for example::

        rank 2 ran before rank 1 at step 12: rank 0's recv at server.py:45 matched rank 2's send at worker.py:10

    The replay may fail (that is usually why one asks); its error is not raised. ``options``
    go to :func:`simdist.simulate` (``detail``, ``eager_limit``, ...), as for the run that made the token.

    Args:
        fn: the program of one rank, called as ``fn(rank, *args)``.
        nprocs: the number of ranks.
        token: a replay token, a ``Schedule`` or a list of choices.
        args: the arguments after ``rank``.
        options: :func:`simdist.simulate`'s keyword arguments, as in the run that made ``token``.

    Returns:
        One line per non-zero choice; ``[]`` when the token made no decision of its own.

    Raises:
        ValueError: ``token`` is not a replay token, or was made for another world size.

    Example:
        >>> import simdist, torch
        >>> import simdist.testing as sdt
        >>> def gather_any(rank):
        ...     simdist.init_process_group("gloo")
        ...     t = torch.tensor([rank])
        ...     if rank == 0:
        ...         simdist.recv(t)
        ...         simdist.recv(t)
        ...     else:
        ...         simdist.send(t, 0)
        >>> sdt.explain(gather_any, 3, "choices:0,1@world=3")
        ["rank 2 ran before rank 1 at step 1: rank 0's recv at ...:5 matched rank 2's send at ...:8"]
        >>> sdt.explain(gather_any, 3, [0])
        []
    """
    from ._program import Program

    return decisions(Program(fn, nprocs, args, options), token)


def decisions(program: Any, token: Any) -> list[str]:
    """:func:`explain`'s lines for ``program`` (a :class:`~simdist.testing._program.Program`) under ``token``."""
    from simdist.backends.sim import check_token, make_strategy

    from ._schedule import Schedule

    if isinstance(token, Schedule):
        token = token.token  # it keeps the world size
    check_token(token, program.nprocs, program.script_name)
    recorder = _recorder(make_strategy(schedule=token))
    error: BaseException | None = None
    try:
        program.simulate(strategy=recorder, leaks=program.options.get("leaks", "ignore"))
    except DistError as err:
        error = err
    events = recorder.trace.events if recorder.trace is not None else []
    return [_describe(d, events, error) for d in recorder.decisions]


def note_decisions(program: Any, err: DistError) -> None:
    """Add to ``err`` a note listing its schedule's decisions, when it has 1 to ``MAX_NOTED`` of them."""
    preemptions = sum(1 for c in err.choices or () if c)
    if not 0 < preemptions <= MAX_NOTED or err.schedule is None:
        return
    lines = decisions(program, err.schedule)
    if lines:
        add_note(err, "the scheduling decisions that led here (simdist.testing.explain):\n  " + "\n  ".join(lines))


def _site(call_site: str | None) -> str:
    """``call_site`` relative to the working directory when it lies below it."""
    if not call_site:
        return "an unknown line"
    path = os.path.relpath(call_site)
    return call_site if path.startswith("..") else path


def _describe(d: _Decision, events: list, error: BaseException | None) -> str:
    """One decision in words: who went first, when, and the communication that followed."""
    if d.kind == "match":
        head = (
            f"rank {d.receiver}'s recv at {_site(d.recv_site)} matched rank {d.chosen}'s send before "
            f"rank {d.instead}'s at step {d.step}"
        )
        sent = next(
            (e for e in events[d.event :] if e.kind == "message" and e.rank == d.chosen and e.peer == d.receiver), None
        )
        return head if sent is None else f"{head}: the send at {_site(sent.call_site)}"
    head = f"rank {d.chosen} ran before rank {d.instead} at step {d.step}"
    then = _consequence(events, d.event, d.chosen)
    if then is None and isinstance(error, RankError) and error.rank == d.chosen:
        then = f"rank {d.chosen} raised {type(error.__cause__).__name__}"
    return head if then is None else f"{head}: {then}"


def _consequence(events: list, start: int, rank: int) -> str | None:
    """The first message to or from ``rank`` recorded from ``events[start]`` on, in words."""
    for i in range(start, len(events)):
        e = events[i]
        if e.kind != "message" or rank not in (e.rank, e.peer):
            continue
        if e.collective_id is not None:
            return f"rank {e.rank}'s {e.op} at {_site(e.call_site)} sent to rank {e.peer} first"
        recv = next((r for r in events[i + 1 :] if r.kind == "recv" and r.rank == e.peer and r.peer == e.rank), None)
        where = "" if recv is None else f" at {_site(recv.call_site)}"
        return f"rank {e.peer}'s recv{where} matched rank {e.rank}'s send at {_site(e.call_site)}"
    return None
