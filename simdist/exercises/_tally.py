"""What a class's submissions came to, per exercise, for the teacher: counts only, no names."""

from __future__ import annotations

import threading
from collections import Counter

__all__ = ["TEACHER_ENV", "Tally"]

TEACHER_ENV = "SIMDIST_TEACHER"
"""Set to ``1``, the app's Exercises page shows the teacher's view (:class:`Tally`'s rows)."""


class Tally:
    """Submissions per exercise since it was made: how many, how many passed, the kinds of failure.

    It stores an exercise's name and a verdict's kind per submission, nothing about who submitted.
    Safe to share between threads (the app's sessions).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._submitted: Counter[str] = Counter()
        self._passed: Counter[str] = Counter()
        self._failures: dict[str, Counter[str]] = {}

    def add(self, exercise: str, kind: str) -> None:
        """Count one submission to ``exercise`` whose verdict was ``kind`` (``"passed"`` or a failure's kind)."""
        with self._lock:
            self._submitted[exercise] += 1
            if kind == "passed":
                self._passed[exercise] += 1
            else:
                self._failures.setdefault(exercise, Counter())[kind] += 1

    def rows(self, top: int = 3) -> list[dict]:
        """One row per exercise submitted to: ``exercise``, ``submitted``, ``passed`` and ``failures`` (the ``top``
        most common kinds, as ``"deadlock × 3, wrong result × 1"``), in the order the exercises were first submitted.

        Example:
            >>> t = Tally()
            >>> for kind in ("deadlock", "passed", "deadlock", "wrong result"):
            ...     t.add("ring", kind)
            >>> t.rows()
            [{'exercise': 'ring', 'submitted': 4, 'passed': 1, 'failures': 'deadlock × 2, wrong result × 1'}]
        """
        with self._lock:
            return [
                {
                    "exercise": name,
                    "submitted": n,
                    "passed": self._passed[name],
                    "failures": ", ".join(
                        f"{k} × {c}" for k, c in self._failures.get(name, Counter()).most_common(top)
                    ),
                }
                for name, n in self._submitted.items()
            ]
