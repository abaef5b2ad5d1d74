"""``Work``: the handle every operation returns."""

from __future__ import annotations

from abc import ABC, abstractmethod

from ._future import Future

__all__ = ["Work", "CompletedWork"]


class Work(ABC):
    """A handle on one operation, as ``torch.distributed.Work``.

    The public functions call :meth:`wait` themselves unless ``async_op=True`` (or the
    function is ``isend``/``irecv``), exactly like torch.
    """

    @abstractmethod
    def wait(self, timeout: float | None = None) -> bool:
        """Block until the operation has completed; return ``True``.

        After ``wait`` the output tensors hold their results on this rank.
        """

    @abstractmethod
    def is_completed(self) -> bool:
        """Whether the operation has completed (never blocks)."""

    def is_success(self) -> bool:
        """Whether the operation completed without error."""
        return self.is_completed() and self.exception() is None

    def exception(self) -> BaseException | None:
        return None

    def result(self) -> list:
        """The operation's output arrays on this rank (after :meth:`wait`)."""
        return list(self._outputs())

    def source_rank(self) -> int:
        """For a receive: the global rank the message came from."""
        raise RuntimeError("source_rank() is only defined for a completed receive")

    def get_future(self) -> Future:
        """A :class:`~simdist.Future` whose value is :meth:`result` once this work completes.

        Getting it does not block; its ``wait()`` waits for the work.
        """
        return Future(lambda: (self.wait(), self.result())[1], self.is_completed)

    def _outputs(self) -> list:
        return []


class CompletedWork(Work):
    """A work that completed when it was made (local no-ops, ranks outside a group)."""

    def __init__(self, outputs: list | None = None):
        self._out = list(outputs or [])

    def wait(self, timeout: float | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def _outputs(self) -> list:
        return self._out
