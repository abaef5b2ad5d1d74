"""Checked runs: ``check(values)`` after a simulated run, a failing check as a :class:`CheckError`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from simdist.core._errors import DistError

__all__ = ["CheckError", "check_argument", "run_checked", "unrecorded"]
__tracebackhide__ = True  # pytest shows a failure's frames in the user's code, not simdist's


class CheckError(DistError):
    """A run finished on every rank, but ``check(values)`` raised or returned ``False``.

    Attributes:
        values: each rank's return value, by rank (what the check was given).
        schedule, choices: the run's replay token and scheduler choices, as on every
            simulation error; the check's own exception is ``__cause__`` (``None`` when
            the check returned ``False``).
    """

    def __init__(self, message: str, values: list, cause: BaseException | None = None):
        super().__init__(message)
        self.values = values
        self.__cause__ = cause


def check_argument(check: Any) -> Callable | None:
    """``check`` itself if it is ``None`` or callable; else a ``TypeError`` naming it."""
    if check is not None and not callable(check):
        raise TypeError(f"check={check!r:.60} must be a function of the ranks' values (or None)")
    return check


def run_checked(fn: Callable, nprocs: int, args: tuple, options: dict, check: Callable | None, **how: Any) -> Any:
    """The ``SimResult`` of ``simulate(fn, nprocs, args, **how, **options)`` once ``check(values)`` accepts it.

    Raises:
        CheckError: ``check`` raised an ``Exception`` or returned ``False``; it carries the
            run's ``schedule`` and ``choices``, so it shrinks and replays like any failure.
        DistError: the run itself failed (the check is not called).
    """
    from simdist.backends.sim import simulate

    res = simulate(fn, nprocs, args, **how, **options)
    if check is None:
        return res
    name = getattr(check, "__qualname__", None) or repr(check)
    shown = f"{res.values!r:.300}"
    try:
        verdict = check(res.values)
    except Exception as exc:  # noqa: BLE001 - any exception of the check is its verdict
        err = CheckError(f"check {name} failed on the values {shown}: {type(exc).__name__}: {exc}", res.values, exc)
    else:
        if verdict is not False:
            return res
        err = CheckError(f"check {name} returned False on the values {shown}", res.values)
    err.choices = list(res.choices)
    raise err._with_schedule(res.schedule)


def unrecorded(options: dict) -> dict:
    """``options`` for runs whose trace no one reads (a search's passing runs, its shrinking): no step snapshots.

    A search reports only its failure, and replays that with the caller's ``options``
    (:func:`~simdist.testing._shrink.shrunk_failure`), so what the user sees is recorded in
    full; the runs before it differ only in their traces (step snapshots change no schedule,
    no value and no error). Options that say ``record_steps`` themselves, or write the trace
    to a file (``trace_file``), are kept as they are.
    """
    if "record_steps" in options or "trace_file" in options:
        return options
    return {**options, "record_steps": False}
