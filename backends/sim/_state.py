"""The engine's record of a rank thread (:class:`RankState`), and :class:`Abort`, which unwinds one.

They sit below the engine (:mod:`._engine`) so that the modules the engine calls name them without importing it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from functools import partial
from typing import Any, Callable

from . import _threads

__all__ = ["Abort", "RankState", "WAKE_FDS"]


class Abort(BaseException):
    """Unwinds a rank thread when the run has failed elsewhere (never seen by users)."""


WAKE_FDS = 64
"""Runs of at most this many ranks wake their rank threads through an ``eventfd`` each (Linux), others through a
``threading.Lock``. The woken thread then finds the GIL free (the waker released it to write): one thread
switch per hand-off between two threads on one core instead of 2.5 to 3 (a Lock's waker still holds the GIL),
about 2.7 µs instead of 6 to 8."""


class RankState:
    """The engine's record of one rank thread.

    ``sleep()`` blocks its thread until another calls ``wake()`` (each wakes one sleep); the thread
    calls ``close()`` when it has ended (no one wakes a rank that is done).
    """

    __slots__ = (
        "rank",
        "fd",
        "sleep",
        "wake",
        "thread",  # its threading.Thread, or its RankPool thread
        "started",
        "done",
        "pending",
        "clock",
        "rng",
        "world",
        "value",
        "blocked",
        "cpu_mark",
        "released",
        "deadline",
        "expired",
        "user",
        "cpu",
    )

    def __init__(self, rank: int, wake_fd: bool = False):
        self.rank = rank
        self.fd = -1
        if wake_fd:
            try:
                self.fd = os.eventfd(0, os.EFD_SEMAPHORE)
            except (AttributeError, OSError):  # not Linux, or out of file descriptors
                pass
        if self.fd >= 0:
            self.sleep = partial(os.eventfd_read, self.fd)
            self.wake = partial(os.eventfd_write, self.fd, 1)
        else:
            lock = threading.Lock()
            lock.acquire()
            self.sleep, self.wake = lock.acquire, lock.release
        self.thread: Any = None
        self.started = False
        self.done = False
        self.pending = 0
        self.clock = 0.0
        self.rng: Any = None
        self.world: Any = None
        self.value: Any = None
        self.blocked: tuple[str, list] | None = None
        self.cpu_mark = 0.0
        self.released = False
        self.deadline: float | None = None  # a timed wait's end, in virtual time
        self.expired = False
        self.user = _threads.Interruptible()  # inside: running user code, where a stopped run injects Abort
        self.cpu: Callable[[], float] = time.thread_time  # the rank's CPU seconds (its process's, for a process)

    def close(self) -> None:
        """Free the rank's file descriptor, if it has one (once no thread can wake or sleep on it)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:  # a rank whose thread never ended (stuck in C code past its run's timeout)
        with contextlib.suppress(Exception):  # (at interpreter exit, os may be gone)
            self.close()
