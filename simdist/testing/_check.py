"""Checked runs: ``check(values)`` after a simulated run, a failing check as a :class:`CheckError`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from simdist.core._errors import DistError

__all__ = ["CheckError", "check_argument"]
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
