"""``Schedule``: a list of scheduler choices with the run it was made for (what ``run``, ``replay``, ``explain``
and the strategies share)."""

from __future__ import annotations

from typing import Any

__all__ = ["Schedule"]


class Schedule(list):
    """A list of scheduler choices (what :func:`simdist.testing.schedules` draws), with the run it was made for.

    Choice 0 keeps the running rank (or takes the lowest runnable one); choices past the
    end of the list are 0. So shorter lists of smaller numbers are simpler schedules.
    ``world``, ``test`` (a pytest node id) and ``script`` (a script's file name) say which run it came
    from, where known: ``pytest --simdist-replay`` and ``simdist run --replay`` refuse to apply it elsewhere.

    ``token`` is its replay token and :meth:`from_token` reads one back; ``repr`` evaluates
    back to an equal schedule where ``Schedule`` is in scope
    (``from simdist.testing import Schedule``)::

        >>> Schedule.from_token("choices:0,2@world=4")
        Schedule([0, 2], world=4)
    """

    def __init__(self, choices: Any = (), world: int | None = None, test: str | None = None, script: str | None = None):
        choices = list(choices)
        bad = [c for c in choices if isinstance(c, bool) or not isinstance(c, int) or c < 0]
        if bad:
            raise ValueError(f"choices={choices!r:.80} has {bad[0]!r}; a schedule's choices are non-negative ints")
        if world is not None and (isinstance(world, bool) or not isinstance(world, int) or world < 1):
            raise ValueError(f"world={world!r} must be a positive int (the world size) or None")
        if test is not None and (not isinstance(test, str) or not test):
            raise ValueError(f"test={test!r} must be a pytest node id (a non-empty str) or None")
        if script is not None and (not isinstance(script, str) or not script):
            raise ValueError(f"script={script!r} must be a script's file name (a non-empty str) or None")
        super().__init__(choices)
        self.world, self.test, self.script = world, test, script

    @classmethod
    def from_token(cls, token: str) -> Schedule:
        """The schedule of a ``choices:...`` replay token, with its world size, test and script."""
        from simdist.backends.sim import decode_choices, split_token

        schedule, world, test, script = split_token(token)
        if not schedule.startswith("choices:"):
            raise ValueError(
                f"token={token!r} is a seeded strategy's token, whose choices are known only after a "
                "run; expected 'choices:...' (a run's .choices holds the list it made)"
            )
        return cls(decode_choices(token), world=world, test=test, script=script)

    @property
    def choices(self) -> list[int]:
        """The choices, as a plain list."""
        return list(self)

    @property
    def token(self) -> str:
        """The replay token: ``choices:0,2`` then ``@world=N``, ``@script=NAME`` and ``@test=NODEID`` where known."""
        from simdist.backends.sim import encode_choices, make_token

        return make_token(encode_choices(self), self.world, self.test, self.script)

    def __repr__(self) -> str:
        parts = [repr(list(self))]
        if self.world is not None:
            parts.append(f"world={self.world!r}")
        if self.test is not None:
            parts.append(f"test={self.test!r}")
        if self.script is not None:
            parts.append(f"script={self.script!r}")
        return f"Schedule({', '.join(parts)})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Schedule) and (self.world, self.test, self.script) != (
            other.world,
            other.test,
            other.script,
        ):
            return False
        return list.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None  # type: ignore[assignment]  # a list
