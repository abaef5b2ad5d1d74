"""``Future``: a result that is computed when first waited for (the subset of ``torch.futures.Future`` DDP uses)."""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["Future"]

_UNSET = object()


class Future:
    """The value of a computation that runs on the first :meth:`wait`, as ``torch.futures.Future``.

    ``Work.get_future()`` returns one whose value is the work's output list once the work
    completes; :meth:`then` chains a callback without waiting, so a communication hook can
    return at once and the collective overlaps whatever comes next.

    Example::

        fut = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
        doubled = fut.wait()     # waits for the all_reduce, then runs the callback
    """

    def __init__(self, compute: Callable[[], Any] | None = None, done: Callable[[], bool] | None = None):
        self._compute = compute
        self._done = done
        self._value: Any = _UNSET
        self._error: BaseException | None = None

    def wait(self) -> Any:
        """The value; computes it (waiting for the work behind it) the first time."""
        if self._value is _UNSET and self._error is None:
            if self._compute is None:
                raise RuntimeError("this Future has no result yet: call set_result() first")
            try:
                self._value = self._compute()
            except BaseException as exc:
                self._error = exc
        if self._error is not None:
            raise self._error
        return self._value

    def value(self) -> Any:
        """The value (waits for it if needed, unlike torch, which requires a completed future)."""
        return self.wait()

    def done(self) -> bool:
        """Whether the value is available without blocking."""
        if self._value is not _UNSET or self._error is not None:
            return True
        return self._done() if self._done is not None else False

    def set_result(self, result: Any) -> None:
        """Complete this future with ``result``."""
        if self.done():
            raise RuntimeError("this Future is already completed")
        self._value = result

    def then(self, callback: Callable[["Future"], Any]) -> "Future":
        """A future whose value is ``callback(self)``, run once this one has completed."""
        return Future(lambda: (self.wait(), callback(self))[1], self.done)
