"""``Program``: a program under test as one value, and what one run of it is under a schedule the caller chooses.

The explorer, the shrinker, replays and ``explain`` are given a program and choose only its schedule (a
``seed``, ``strategy`` or ``schedule``): a function on simulated ranks is a :class:`Program`; a script is
another (:class:`~simdist.testing._script.ScriptProgram`), whose runs start from the same files and whose
values are its ranks' exit statuses and output.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._check import CheckError

__all__ = ["Program"]
__tracebackhide__ = True  # pytest shows a failure's frames in the user's code, not simdist's


@dataclass(frozen=True)
class Program:
    """``fn(rank, *args)`` on ``nprocs`` simulated ranks, with :func:`simdist.simulate`'s ``options``, judged by
    ``check(values)`` (``None``: every run that finishes passes).

    ``options`` never hold the schedule: each run is given its own (:meth:`run`).
    """

    fn: Callable
    nprocs: int
    args: tuple = ()
    options: Mapping[str, Any] = field(default_factory=dict)
    check: Callable | None = None

    @property
    def script_name(self) -> str | None:
        """The name of the script this program runs, as replay tokens record it (``None``: a function)."""
        return self.options.get("script")

    def simulate(self, **how: Any) -> Any:
        """One run under ``how`` (``seed``, ``strategy`` or ``schedule``, and options that replace the program's):
        what :func:`simdist.simulate` returns or raises."""
        from simdist.backends.sim import simulate

        return simulate(self.fn, self.nprocs, self.args, **{**self.options, **how})

    def run(self, **how: Any) -> Any:
        """One run under ``how``, judged: its ``SimResult`` once ``check(values)`` accepts it.

        Raises:
            CheckError: ``check`` raised an ``Exception`` or returned ``False``; it carries the
                run's ``schedule`` and ``choices``, so it shrinks and replays like any failure.
            DistError: the run itself failed (the check is not called).
        """
        res = self.simulate(**how)
        if self.check is None:
            return res
        name = getattr(self.check, "__qualname__", None) or repr(self.check)
        shown = f"{res.values!r:.300}"
        problem, cause = None, None
        with self.at_files():
            try:
                if self.check(res.values) is False:
                    problem = f"check {name} returned False on the values {shown}"
            except Exception as exc:  # noqa: BLE001 - any exception of the check is its verdict
                problem = f"check {name} failed on the values {shown}: {type(exc).__name__}: {exc}"
                cause = exc
        if problem is None:
            return res
        err = CheckError(problem, res.values, cause)
        err.choices = list(res.choices)
        raise err._with_schedule(res.schedule)

    @contextlib.contextmanager
    def at_files(self) -> Iterator[None]:
        """The block runs where the last run's files are (a script's: its working directory); here, as it is."""
        yield

    def with_options(self, **options: Any) -> Program:
        """This program with ``options`` in place of its own of those names."""
        return dataclasses.replace(self, options={**self.options, **options})

    def unrecorded(self) -> Program:
        """This program for runs whose trace no one reads (a search's passing runs, its shrinking): no step snapshots.

        A search reports only its failure, and replays that with the program as given, so what the user
        sees is recorded in full; the runs before it differ only in their traces (step snapshots change no
        schedule, no value and no error). A program whose options say ``record_steps`` themselves, or write
        the trace to a file (``trace_file``), is kept as it is.
        """
        if "record_steps" in self.options or "trace_file" in self.options:
            return self
        return self.with_options(record_steps=False)
