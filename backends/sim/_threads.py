"""What rank threads leave behind: nothing, once a simulation returns.

Rank threads do torch's intra-op work on their own thread, as ranks under torchrun do.

OpenMP gives every thread that starts parallel work its own team of worker threads. A rank
thread's team would add nothing (only one rank runs at a time, and its workers inherit the
rank's one-core affinity) and outlives the rank: a process forked while those workers wind
down can hang in MKL's allocator (seen as a rank stuck in a matrix product after
``spawn(..., start_method="fork")`` followed a simulation). So each rank thread sets its own
OpenMP thread count to 1, as torchrun's ``OMP_NUM_THREADS=1`` does for its ranks; the setting
is per thread, so the caller's threads keep theirs.

A joined thread is not yet gone: ``Thread.join`` returns once the thread's Python state is
released, before the C library's per-thread destructors (MKL frees its buffers there) have
run. ``wait_ended`` waits for the threads to be gone from the process, so that a fork right
after a simulation never copies a lock that a dying thread holds.

An interrupted run raises an exception in a rank that runs Python code (``PyThreadState_SetAsyncExc``,
:class:`Interruptible`). On CPython before 3.13 a pending asynchronous exception also sets a flag of
the whole interpreter that only its delivery clears; one left pending, or cleared by setting
``NULL``, keeps every thread's evaluation loop checking it forever, and under a trace function
(Hypothesis, coverage, debuggers) 3.11 then re-runs the check at the entry of the next function
called, without end. So no such exception is ever cleared or left behind: each one is delivered.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Callable

import torch

__all__ = ["Interruptible", "one_thread", "wait_ended"]

ENDED_WAIT = 5.0
"""Seconds ``wait_ended`` waits at most for joined threads to leave the process."""

_set_async_exc = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi)
)


class _Settle(BaseException):
    """Raised by a thread in itself to take delivery of an exception injected into it (never seen outside)."""


class Interruptible:
    """One thread's stretches of interruptible code, and the only way another thread raises an exception in them.

    The thread sets ``ident``, then ``inside`` around the code, with plain assignments: no
    exception can arrive between the code and the assignment. Once it has set ``inside`` to
    ``False``, at most two injected exceptions can still arrive (one pending, and one whose
    injection was under way); :meth:`settle`, called where those are caught, makes sure none
    is left pending.
    """

    __slots__ = ("guard", "ident", "injected", "inside")

    def __init__(self) -> None:
        self.guard = threading.Lock()  # held while an exception is injected; settle waits for it
        self.ident: int | None = None
        self.inside = False
        self.injected = False

    def inject(self, exc: type[BaseException]) -> bool:
        """Whether ``exc`` was raised in the thread: only while it is inside (called from another thread)."""
        with self.guard:
            if not self.inside or self.ident is None:
                return False
            _set_async_exc(self.ident, exc)
            self.injected = True
            return True

    def settle(self) -> None:
        """Return once nothing injected is pending in the calling thread (its own, no longer inside).

        An exception injected earlier that has not arrived yet is replaced by one this raises and
        catches at once: delivered, so it clears the interpreter's flag. One that arrives in here
        first propagates (it was pending; nothing is left).
        """
        with self.guard:  # an injection under way has ended, and no other can start
            injected, self.injected = self.injected, False
        if injected:
            try:
                _set_async_exc(self.ident, _Settle)
                while True:  # delivered at the first check of the evaluation loop
                    pass
            except _Settle:
                pass


@functools.cache
def _omp_set_num_threads() -> Callable[[int], None] | None:
    """``omp_set_num_threads`` of the OpenMP runtime torch uses, or ``None`` where there is none."""
    here = Path(torch.__file__).parent / "lib"
    candidates = [str(p) for pattern in ("libgomp*", "libiomp*", "libomp*") for p in sorted(here.glob(pattern))]
    candidates += [None, *filter(None, (ctypes.util.find_library(n) for n in ("gomp", "iomp5", "omp")))]
    for path in candidates:
        try:
            fn = getattr(ctypes.CDLL(path), "omp_set_num_threads", None)
        except OSError:
            continue
        if fn is not None:
            fn.argtypes, fn.restype = [ctypes.c_int], None
            return fn
    return None


def one_thread() -> None:
    """Make the calling thread's OpenMP parallel regions (torch's intra-op work) run on it alone."""
    fn = _omp_set_num_threads()
    if fn is not None:
        fn(1)


def wait_ended(threads: Iterable[threading.Thread]) -> None:
    """Return once every joined thread in ``threads`` has left the process (Linux; elsewhere at once)."""
    tasks = "/proc/self/task"
    if not os.path.isdir(tasks):
        return
    ids = [t.native_id for t in threads if t.native_id is not None and not t.is_alive()]
    deadline = time.monotonic() + ENDED_WAIT
    while any(os.path.exists(f"{tasks}/{tid}") for tid in ids) and time.monotonic() < deadline:
        time.sleep(0.0005)
