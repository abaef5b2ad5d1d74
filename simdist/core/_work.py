"""``Work``: the handle every operation returns."""

from __future__ import annotations

from abc import ABC, abstractmethod

from typing import Any, Callable

from ._future import Future

__all__ = ["Work", "CompletedWork", "DeferredWork", "chain"]


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


class DeferredWork(Work):
    """A work that completes by ``finish(timeout)`` (run once) and reports progress by ``done()``.

    ``source`` is, for a receive, the sender's global rank or a function that gives it once done.
    """

    def __init__(
        self, finish: Callable[[float | None], None], done: Callable[[], bool], outputs: list, source: Any = None
    ):
        self._finish = finish
        self._done = done
        self._finished = False
        self._error: BaseException | None = None
        self.outs = outputs
        self.source = source

    def wait(self, timeout: float | None = None) -> bool:
        if not self._finished:
            try:
                self._finish(timeout)
            except BaseException as exc:
                self._error = exc
                raise
            finally:
                self._finished = True
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._finished or self._done()

    def exception(self) -> BaseException | None:
        return self._error

    def source_rank(self) -> int:
        self.wait()
        if self.source is None:
            return super().source_rank()
        return self.source() if callable(self.source) else self.source

    def _outputs(self) -> list:
        return self.outs


def chain(*steps: Callable[[], None] | None) -> Callable[[], None]:
    """One step that runs ``steps`` in order, skipping ``None`` (a work's write-backs, say)."""
    live = [s for s in steps if s is not None]

    def run() -> None:
        for s in live:
            s()

    return run
