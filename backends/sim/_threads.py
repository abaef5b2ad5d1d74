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

Every rank thread that waits for the baton sleeps on a futex of its own. Since Linux 6.16 a process
has a private table of futex wait queues sized for its number of CPUs (16 slots on 2 cores), and
waking one waiter scans its slot's queue: with 4096 rank threads waiting, 256 a slot, a quarter of a
run's kernel time went there. :func:`futexes_for` moves a process about to run thousands of ranks
back to the kernel's shared table (what every process used before 6.16).

A :class:`RankPool` keeps rank threads between the runs of one exploration (``simdist.testing``):
starting and joining a thread per rank and run was most of a short run's fixed cost. A pooled
thread runs one rank of one run at a time, and parks between runs; the pool's threads end, and
have left the process, once it is closed.
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

__all__ = ["Interruptible", "RankPool", "futexes_for", "one_thread", "wait_ended"]

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

    __slots__ = ("guard", "ident", "injected", "inside", "on_inject")

    def __init__(self) -> None:
        self.guard = threading.Lock()  # held while an exception is injected; settle waits for it
        self.ident: int | None = None
        self.inside = False
        self.injected = False
        self.on_inject: Callable[[], None] | None = None  # what else stops the code (a rank's process: kill it)

    def inject(self, exc: type[BaseException]) -> bool:
        """Whether ``exc`` was raised in the thread: only while it is inside (called from another thread).

        ``on_inject`` runs first, inside or not: the thread of a rank process waits in C code for the
        process, which returns once the process is killed.
        """
        with self.guard:
            if self.on_inject is not None:
                self.on_inject()
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


_PR_FUTEX_HASH, _SET_SLOTS, _GET_SLOTS = 78, 1, 2  # linux/prctl.h (Linux 6.16)


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """``prctl`` of the C library, or ``None`` off Linux."""
    if not os.path.isdir("/proc/self/task"):
        return None
    fn = ctypes.CDLL(None, use_errno=True).prctl
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_int
    return fn


def futexes_for(threads: int) -> None:
    """Let ``threads`` threads wait on futexes of their own without crowding a few wait queues (Linux 6.16+).

    A private futex table of fewer slots than ``threads`` is given up for the kernel's shared
    one (sized by the kernel for the machine); elsewhere (older kernels, a table the program
    made immutable, other systems) nothing changes.
    """
    prctl = _prctl()
    if prctl is None:
        return
    slots = prctl(_PR_FUTEX_HASH, _GET_SLOTS, 0, 0, 0)
    if 0 < slots < threads:
        prctl(_PR_FUTEX_HASH, _SET_SLOTS, 0, 0, 0)


def wait_ended(threads: Iterable[threading.Thread]) -> None:
    """Return once every joined thread in ``threads`` has left the process (Linux; elsewhere at once)."""
    tasks = "/proc/self/task"
    if not os.path.isdir(tasks):
        return
    ids = {str(t.native_id) for t in threads if t.native_id is not None and not t.is_alive()}
    deadline = time.monotonic() + ENDED_WAIT
    while ids:  # (one listing of the process's threads, not one look-up per thread: runs end thousands)
        ids &= set(os.listdir(tasks))
        if not ids or time.monotonic() >= deadline:
            return
        time.sleep(0.0005)


class _Worker:
    """One pooled thread: runs the jobs handed to it, one at a time, until its pool is closed."""

    __slots__ = ("finished", "go", "job", "native_id", "stop", "thread")

    def __init__(self, name: str):
        self.go = threading.Lock()  # released to hand the thread a job (or to end it)
        self.go.acquire()
        self.finished = threading.Lock()  # held while a job runs
        self.job: Callable[[], None] | None = None
        self.stop = False
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.native_id: int | None = None

    def _main(self) -> None:
        while True:
            self.go.acquire()
            job, self.job = self.job, None
            if job is None or self.stop:
                return
            try:
                job()
            except BaseException:
                self.stop = True  # the thread ends with the exception: never handed another job
                raise
            finally:
                self.finished.release()

    def run(self, job: Callable[[], None]) -> None:
        """Hand ``job`` to the thread (starting it the first time); the thread must be idle."""
        self.finished.acquire()
        self.job = job
        self.go.release()
        if self.native_id is None:
            self.thread.start()
            self.native_id = self.thread.native_id

    def busy(self) -> bool:
        """Whether a job handed to the thread has not returned yet."""
        return self.finished.locked()

    def join(self, timeout: float | None = None) -> None:
        """Return once the thread's current job has returned, or after ``timeout`` seconds (as ``Thread.join``)."""
        if self.finished.acquire(timeout=-1 if timeout is None else timeout):
            self.finished.release()

    def is_alive(self) -> bool:
        """Whether the job runs (what a run asks of its rank's thread)."""
        return self.busy()

    def end(self) -> None:
        """Let the thread end once its job (if any) returns."""
        self.stop = True
        try:
            self.go.release()
        except RuntimeError:  # a job was handed over and not yet taken: the thread ends after it
            pass


class RankPool:
    """Threads for the ranks of successive runs, the thread of rank ``r`` reused by each run for rank ``r``.

    Use it as a context manager (or call :meth:`close`): once closed, its threads have ended and
    left the process. A run that stopped with a rank stuck outside Python leaves that thread
    busy; the next run gets a new thread for that rank, and the stuck one ends when it returns.
    """

    def __init__(self) -> None:
        self.workers: dict[int, _Worker] = {}
        self.retired: list[_Worker] = []
        self.closed = False

    def start(self, rank: int, job: Callable[[], None]) -> _Worker:
        """Run ``job`` on the thread of ``rank``: what the run joins (``join(timeout)``, ``is_alive()``)."""
        if self.closed:
            raise RuntimeError("this RankPool is closed")
        worker = self.workers.get(rank)
        if worker is None or worker.busy() or worker.stop:
            if worker is not None:
                worker.end()
                self.retired.append(worker)
            worker = self.workers[rank] = _Worker(f"simdist-rank-{rank}")
        worker.run(job)
        return worker

    def close(self) -> None:
        """End the pool's threads; return once the idle ones have left the process (busy ones end later)."""
        if self.closed:
            return
        self.closed = True
        workers = [*self.workers.values(), *self.retired]
        idle = [w for w in workers if not w.busy()]
        for w in workers:
            w.end()
        for w in idle:
            w.thread.join(ENDED_WAIT)
        wait_ended(w.thread for w in idle if w.native_id is not None)

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
