"""The errors simdist raises. Every one derives from :class:`DistError`.

Each is also the torch error it corresponds to, so code written for torch catches simdist's
errors unchanged: :class:`DistError` is ``torch.distributed.DistError`` (a ``RuntimeError``), and

- ``DeadlockError``, ``CollectiveMismatchError`` and ``BufferRaceError`` are ``DistBackendError``:
  a communication op failed (torch's NCCL reports a hung collective so);
- ``DistTimeoutError`` is ``DistStoreError`` (and the builtin ``TimeoutError``): what torch raises
  for a wait that timed out, and what torch's own code catches around one;
- ``PeerLostError``, ``ProtocolError`` and ``AuthenticationError`` are ``DistNetworkError``: a
  connection failed or carried bytes it should not;
- ``RankError``, ``RankExitError`` and ``NotInitializedError`` are ``DistError`` only.
"""

from __future__ import annotations

import sys
from typing import Any

try:
    from torch.distributed import DistBackendError, DistNetworkError, DistStoreError
    from torch.distributed import DistError as _TorchDistError
except ImportError:  # torch absent or built without distributed: the errors are RuntimeErrors alone
    DistBackendError = DistNetworkError = DistStoreError = _TorchDistError = RuntimeError  # type: ignore[assignment,misc]

__all__ = [
    "DistError",
    "DeadlockError",
    "CollectiveMismatchError",
    "BufferRaceError",
    "RankError",
    "RankExitError",
    "DistTimeoutError",
    "ProtocolError",
    "NotInitializedError",
    "AuthenticationError",
    "PeerLostError",
    "LeakWarning",
]


class DistError(_TorchDistError):
    """Base of every simdist error; it is also ``torch.distributed.DistError`` (a ``RuntimeError``).

    Errors raised by a simulation carry ``schedule``, the replay token that
    reproduces the run (``simdist.simulate(..., schedule=err.schedule)``); the
    token is also printed in the message.
    """

    schedule: str | None = None
    choices: list[int] | None = None  # the scheduler's choices up to the failure (simulated runs)

    def _with_schedule(self, token: str | None) -> "DistError":
        self.schedule = token
        return self

    def __reduce__(self) -> tuple:
        """Pickled as its class, message and attributes (a rank process sends its errors whole)."""
        return (_rebuilt, (type(self), self.args, self.__dict__, self.__cause__))

    def __str__(self) -> str:
        text = super().__str__()
        if self.schedule and "replay token" not in text:
            text += f"\nreplay token: {self.schedule}"
        if sys.version_info < (3, 11):  # tracebacks print notes from 3.11 on; before, the message carries them
            text += "".join(f"\n{note}" for note in getattr(self, "__notes__", ()))
        return text


class DeadlockError(DistError, DistBackendError):
    """No rank can make progress while some have not finished.

    Attributes:
        graph: the wait-for graph (``networkx.DiGraph``); an edge ``a -> b`` means
            rank ``a`` waits for rank ``b``. Node attributes hold each blocked
            rank's ``op``, ``peer``, ``group``, ``tag`` and ``call_site``.
        blocked: one dict per blocked rank (the same fields as the node attributes).
        unmatched: descriptions of the posted messages that found no partner.
        cycle: the ranks of one cycle of the graph, if there is one.
    """

    def __init__(self, message: str, *, graph=None, blocked=(), unmatched=(), cycle=()):
        super().__init__(message)
        self.graph = graph
        self.blocked = list(blocked)
        self.unmatched = list(unmatched)
        self.cycle = list(cycle)


class CollectiveMismatchError(DistError, DistBackendError):
    """The k-th collective on a group differs between ranks.

    Attributes:
        ranks: the two ranks whose calls disagree (global ranks).
        call_sites: ``file:line`` of each of the two calls.
        fields: ``{field: (value on ranks[0], value on ranks[1])}`` for each field that differs.
    """

    def __init__(self, message: str, *, ranks=(), call_sites=(), fields=None):
        super().__init__(message)
        self.ranks = tuple(ranks)
        self.call_sites = tuple(call_sites)
        self.fields = dict(fields or {})


class BufferRaceError(DistError, DistBackendError):
    """A rank wrote to the buffer of its own send or receive before that operation completed.

    Raised by the simulator when the rank waits for the operation (or learns from
    ``is_completed()`` that it has completed, or ends without waiting for it): the buffer
    then differs from the copy taken when the operation was posted. Raised at the post of an
    ``irecv`` into memory that an operation in flight uses, or of an ``isend`` of memory that
    an ``irecv`` in flight writes: ``op``, ``call_site`` and ``changed`` then describe the
    operation in flight and the bytes of its buffer the new one touches.

    Attributes:
        rank: the global rank that wrote to the buffer.
        op: ``'isend'`` or ``'irecv'``.
        call_site: ``file:line`` of the call that posted the operation.
        changed: ``(first, last)``, the first and the last byte of the buffer that changed.
    """

    def __init__(self, message: str, *, rank: int, op: str, call_site: str | None, changed: tuple[int, int]):
        super().__init__(message)
        self.rank = rank
        self.op = op
        self.call_site = call_site
        self.changed = changed


class RankError(DistError):
    """A rank raised an exception, or its process ended before its function returned; the reason is ``__cause__``.

    Attributes:
        rank: the global rank that failed.
        exitcode: where the rank's process ended (``isolation="processes"``), its exit status, or minus the
            signal that killed it (as ``multiprocessing.Process.exitcode``); ``None`` where the rank raised.
    """

    exitcode: int | None = None

    def __init__(self, rank: int, cause: BaseException):
        if isinstance(cause, RankExitError):
            super().__init__(f"rank {rank}: {cause}")
            self.exitcode = cause.exitcode
        else:
            super().__init__(f"rank {rank} raised {type(cause).__name__}: {cause}")
        self.rank = rank
        self.__cause__ = cause


class RankExitError(DistError):
    """A simulated rank's process ended before its function returned (``os._exit``, a signal, a crash).

    It is the ``__cause__`` of the run's :class:`RankError`.

    Attributes:
        exitcode: the exit status, or minus the signal that killed the process; ``None`` if unknown.
    """

    def __init__(self, message: str, *, exitcode: int | None = None):
        super().__init__(message)
        self.exitcode = exitcode


class DistTimeoutError(DistError, DistStoreError, TimeoutError):
    """An operation or a run did not finish within its timeout (also torch's ``DistStoreError`` and ``TimeoutError``)."""


class ProtocolError(DistError, DistNetworkError):
    """Bytes that do not follow the wire protocol were received."""


class AuthenticationError(DistError, DistNetworkError):
    """A connection failed the shared-secret challenge (a wrong or missing ``SIMDIST_SECRET``)."""


class PeerLostError(DistError, DistNetworkError):
    """A peer closed its connection or died; ``rank`` names it when known."""

    def __init__(self, message: str, *, rank: int | None = None):
        super().__init__(message)
        self.rank = rank


class NotInitializedError(DistError):
    """A call that needs a process group was made before ``init_process_group``."""


class LeakWarning(UserWarning):
    """A simulation ended with unmatched messages, never-waited works or groups never destroyed."""


def _rebuilt(cls: type[DistError], args: tuple, attributes: dict, cause: BaseException | None) -> DistError:
    """A :class:`DistError` from what ``__reduce__`` gave (its constructor is not called: it may take other arguments)."""
    # the builtin base that lays the instance out (OSError for DistTimeoutError, whose MRO names RuntimeError first)
    layout: Any = max(
        (base for base in cls.__mro__ if base.__module__ == "builtins"), key=lambda base: base.__basicsize__
    )
    err = layout.__new__(cls)
    err.args = args
    err.__dict__.update(attributes)
    err.__cause__ = cause
    return err


def add_note(exc: BaseException, note: str) -> None:
    """Add ``note`` to ``exc``'s notes (``BaseException.add_note`` of Python 3.11, also on 3.10).

    On Python 3.10 the note is appended to ``exc.__notes__`` as 3.11 does; a :class:`DistError`
    then prints its notes after its message, since 3.10's tracebacks do not.
    """
    if sys.version_info >= (3, 11):
        exc.add_note(note)
    else:
        exc.__notes__ = [*getattr(exc, "__notes__", ()), note]  # type: ignore[attr-defined]
