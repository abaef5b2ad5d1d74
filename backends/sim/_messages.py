"""Things a rank can wait on: posted messages and collective runs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simdist.algorithms import CollectiveCall

    from ._group import SimGroup

__all__ = ["Waitable", "Post", "CollectiveRun"]


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
    :class:`._discrete.Message`\\ s).

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
    """One rank's part of one collective: once every member has joined, an algorithm generator
    driven by :mod:`._discrete`.

    ``t`` is the run's own virtual clock: it starts at the caller's clock and advances
    as the messages it waits for complete, so an asynchronous collective progresses
    while the caller computes.
    """

    __slots__ = ("call", "group", "rank", "gen", "seq", "coll_id", "t", "t0", "step", "waiting", "pending", "ctx")

    def __init__(self, call: CollectiveCall, group: SimGroup, rank: int, seq: int, coll_id: int, t: float):
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
