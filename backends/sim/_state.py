"""The engine's state and its data types: everything a run is made of, below the engine that runs it.

- :class:`Settings`: one run's options, resolved (what the engine, its groups and the rank hooks read);
- :class:`RankState`: one rank thread; :class:`Abort` unwinds one;
- what a rank waits on (:class:`Waitable`): a message the program posted (:class:`Post`), or its part
  of a collective (:class:`CollectiveRun`), whose algorithm's messages are :class:`Message`\\ s;
- :class:`GroupState`: a group's collectives as its members join them.

Nothing here calls the engine: the engine (:mod:`._engine`) changes these objects, and the modules it
calls (:mod:`._discrete`, :mod:`._report`, :mod:`._isolation`) read or change the ones they are given.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Callable

from . import _threads

if TYPE_CHECKING:
    from simdist.algorithms import CollectiveCall
    from simdist.core import ProcessGroup

__all__ = [
    "Abort",
    "CollectiveRun",
    "GroupState",
    "Joining",
    "Message",
    "Post",
    "RankState",
    "Settings",
    "WAKE_FDS",
    "Waitable",
]


@dataclass(frozen=True)
class Settings:
    """One run's options, resolved from :class:`~simdist.backends.sim.SimOptions` for its world (no ``None``
    left to decide): what the engine, its groups and the rank hooks (:mod:`._isolation`, ``ProcessRanks``) read.

    ``pin_core`` is the core rank threads run on (``None``: not pinned); ``test`` the pytest node id and
    ``script`` the script's name the replay token records. The other fields are ``SimOptions``' of the same names.
    """

    size: int
    detail: str = "messages"
    eager_limit: int = 0
    record_steps: bool = False
    prefix_output: bool = False
    cpu_time: bool = False
    cuda_as_cpu: bool = False
    gpus_per_node: int = 1
    timeout: float | None = None
    algorithms: tuple[tuple[str, str], ...] = ()  # the default algorithm per collective, as (op, name) pairs
    pin_core: int | None = None
    test: str | None = None
    script: str | None = None
    capture_output: bool = False


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
        "output",
    )

    def __init__(self, rank: int, wake_fd: bool = False, capture: bool = False):
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
        # with capture_output: the text the rank wrote to stdout and to stderr, in pieces; else None
        self.output: tuple[list[str], list[str]] | None = ([], []) if capture else None

    def now(self, cpu_time: bool) -> float:
        """The rank's virtual time while it runs: its clock, with ``cpu_time`` plus its CPU time since it resumed."""
        return self.clock + self.cpu() - self.cpu_mark if cpu_time else self.clock

    def close(self) -> None:
        """Free the rank's file descriptor, if it has one (once no thread can wake or sleep on it)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:  # a rank whose thread never ended (stuck in C code past its run's timeout)
        with contextlib.suppress(Exception):  # (at interpreter exit, os may be gone)
            self.close()


class Waitable:
    """Something that completes once, with the virtual time ``t_done``.

    ``waiters`` are notified on completion: each has a ``pending`` count that drops by one.
    """

    __slots__ = ("done", "t_done", "waiters")

    def __init__(self) -> None:
        self.done = False
        self.t_done = 0.0
        self.waiters: list = []


class Post(Waitable):
    """One send or receive that a rank's program posted (a collective's own messages are
    :class:`Message`\\ s).

    ``src``/``dst`` are global ranks (``src`` is ``None`` for an any-source receive until
    it matches; ``source`` then holds the sender). ``ctx`` names the group's point-to-point
    traffic.
    """

    __slots__ = (
        "kind",
        "src",
        "dst",
        "ctx",
        "tag",
        "buf",
        "nbytes",
        "dtype",
        "t_post",
        "owner",
        "group",
        "call_site",
        "source",
        "data",
        "on_done",
    )

    def __init__(
        self,
        kind: str,
        src: int | None,
        dst: int,
        ctx: tuple,
        tag: int,
        buf: Any,
        nbytes: int,
        dtype: str,
        t_post: float,
        owner: int,
        group: int,
        call_site: str | None,
    ):
        self.done = False
        self.t_done = 0.0
        self.waiters = []
        self.kind = kind
        self.src = src
        self.dst = dst
        self.ctx = ctx
        self.tag = tag
        self.buf = buf
        self.nbytes = nbytes
        self.dtype = dtype
        self.t_post = t_post
        self.owner = owner
        self.group = group
        self.call_site = call_site
        self.source = src
        self.data: Any = None
        self.on_done = None

    def describe(self, group: str | None = None) -> str:
        """One line on the message; ``group`` is what to call its group (default ``'group N'``)."""
        group = group or f"group {self.group}"
        if self.kind == "send":
            what = f"send {self.owner}->{self.dst}"
        else:
            what = f"recv {self.owner}<-{'any' if self.src is None else self.src}"
        where = f" at {self.call_site}" if self.call_site else ""
        return f"{what} tag {self.tag} ({self.nbytes} bytes, {self.dtype}) on {group}{where}"


class CollectiveRun(Waitable):
    """One rank's part of one collective (``group``: the rank's ``SimGroup``): once every member has joined, an
    algorithm generator driven by :mod:`._discrete`.

    ``t`` is the run's own virtual clock: it starts at the caller's clock and advances
    as the messages it waits for complete, so an asynchronous collective progresses
    while the caller computes.
    """

    __slots__ = ("call", "group", "rank", "gen", "seq", "coll_id", "t", "t0", "step", "waiting", "pending", "ctx")

    def __init__(self, call: CollectiveCall, group: ProcessGroup, rank: int, seq: int, coll_id: int, t: float):
        super().__init__()
        self.call = call
        self.group = group
        self.rank = rank
        self.seq = seq
        self.coll_id = coll_id
        self.t = t
        self.t0 = t
        self.step = 0
        self.gen: Iterator[list] | None = None  # the algorithm's steps, set once the run starts
        self.waiting: list = []
        self.pending = 0
        self.ctx = ("c", group.group_id, seq)

    def describe(self) -> str:
        where = f" at {self.call.call_site}" if self.call.call_site else ""
        group = f"group {self.group.group_desc or self.group.group_id}"
        return f"{self.call.op} (collective {self.seq} of {group}){where}"


class Message:
    """One send or receive of a collective's algorithm: a handle it yields to wait for.

    ``src``/``dst`` are global ranks; ``waiter`` is the run whose current step waits for it.
    """

    __slots__ = ("arrival", "buf", "chunk", "data", "done", "dst", "kind", "nbytes", "partner", "run", "src", "step",
                 "t_done", "t_post", "tag", "waiter")  # fmt: skip

    def __init__(self, kind: str, src: int, dst: int, tag: int, buf: Any, run: CollectiveRun, chunk: int | None):
        self.kind = kind
        self.src = src
        self.dst = dst
        self.tag = tag
        self.buf = buf
        self.nbytes = buf.nbytes  # (A.nbytes: every array kind says it so)
        self.run = run
        self.step = run.step
        self.chunk = chunk
        self.t_post = run.t
        self.t_done = 0.0
        self.done = False
        self.data: Any = None  # an eager send's copy of its buffer
        self.waiter: CollectiveRun | None = None
        self.partner: Message | None = None  # a send's receive, once matched (``flows``)
        self.arrival: float | None = None  # when a send's bytes arrived (``flows``)

    def describe(self) -> str:
        what = f"send {self.src}->{self.dst}" if self.kind == "send" else f"recv {self.dst}<-{self.src}"
        return f"{what} tag {self.tag} ({self.nbytes} bytes) in {self.run.describe()}"


class GroupState:
    """A group's collectives: how many each rank has joined, and those not every rank has joined yet."""

    __slots__ = ("gid", "ranks", "seq", "instances", "_hosts")

    def __init__(self, gid: int, ranks: tuple[int, ...]):
        self.gid = gid
        self.ranks = ranks
        self.seq = dict.fromkeys(ranks, 0)
        self.instances: dict[int, Joining] = {}
        self._hosts: tuple | None | bool = False  # not read yet

    def hosts(self, topology: Any) -> tuple | None:
        """The machine of each member where ``topology`` says (``Topology.machine``), else ``None``; read once."""
        if self._hosts is False:
            machines = tuple(topology.machine(r) for r in self.ranks)
            self._hosts = None if None in machines else machines
        return self._hosts  # type: ignore[return-value]


class Joining:
    """The k-th collective on a group, as its members join it: each member's :class:`CollectiveRun` by group rank."""

    __slots__ = ("seq", "coll_id", "first", "runs")

    def __init__(self, seq: int, coll_id: int, first: tuple[int, CollectiveCall]):
        self.seq = seq
        self.coll_id = coll_id
        self.first = first  # the rank that arrived first, and its call: the others are checked against it
        self.runs: dict[int, CollectiveRun] = {}
