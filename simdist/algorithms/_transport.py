"""The contract between collective algorithms and the backends that carry their messages.

An algorithm is a *generator function*. It posts non-blocking sends and receives on a
:class:`Transport` and, to wait, yields the list of handles it needs completed::

    def ring_step(t: Transport, send_buf, recv_buf):
        s = t.isend(send_buf, (t.rank + 1) % t.size, tag=0)
        r = t.irecv(recv_buf, (t.rank - 1) % t.size, tag=0)
        yield [s, r]          # resumes once both have completed

Each ``yield`` ends one *step* of the algorithm (the visualizer draws steps). The
backend decides how waiting happens: the socket backend blocks in place
(:func:`run_blocking`), the simulator resumes the generator from its scheduler, which
is what lets an ``async_op=True`` collective progress while the caller computes.

An algorithm that keeps partial results in scratch rather than in its output calls
:func:`observe` after each step, so that a transport that records traces (an
:class:`Observer`, the simulator's) can show them; other transports ignore it.

Ranks seen by an algorithm are group ranks ``0 .. t.size - 1``. Messages between one
pair of ranks with one tag arrive in the order they were sent. Buffers are flat,
contiguous arrays handled only through :mod:`simdist.core._arrays`.

A transport may say which machine each group rank runs on (``t.hosts``, a label per group
rank, ``None`` where the backend does not know): the two-level algorithms read it through
:func:`machines` and run their phases on :class:`Subgroup` views of the transport.
"""

from __future__ import annotations

from typing import Any, Generator, Hashable, Iterable, Protocol, Sequence

__all__ = [
    "Handle",
    "Transport",
    "Algorithm",
    "Observer",
    "Timed",
    "Lender",
    "Subgroup",
    "machines",
    "observe",
    "run_blocking",
    "pipelined",
    "together",
]

Handle = Any
"""An opaque token for one posted send or receive."""

Algorithm = Generator[list, None, None]
"""What an algorithm function returns: a generator yielding lists of handles."""


class Transport(Protocol):
    """Point-to-point messaging among the ranks of one group, for one collective call."""

    rank: int
    size: int

    def isend(self, buf: Any, peer: int, tag: int = 0, *, chunk: int | None = None) -> Handle:
        """Post a send of flat buffer ``buf`` to group rank ``peer``.

        ``chunk`` names which chunk of the collective's data this is (for traces).
        The algorithm must not modify ``buf`` until the handle has completed.
        """

    def irecv(self, buf: Any, peer: int, tag: int = 0, *, chunk: int | None = None) -> Handle:
        """Post a receive from group rank ``peer`` into flat buffer ``buf`` (exact size)."""

    def wait(self, handles: Iterable[Handle]) -> None:
        """Block until every handle has completed (used by :func:`run_blocking`)."""


class Observer:
    """A transport that records each rank's working data for traces (declared by subclassing)."""

    def observe(self, buf: Any, offset: int) -> None:
        """Record that ``buf`` now holds elements ``offset ..`` of this rank's working data."""
        raise NotImplementedError


class Timed:
    """A transport with a clock that charges local work, reductions, copies and new scratch memory (declared by
    subclassing): the simulator's."""

    def reduced(self, nbytes: int) -> None:
        """Charge this rank for combining ``nbytes`` into its buffer (see :func:`~._chunks.combine`)."""
        raise NotImplementedError

    def allocated(self, nbytes: int) -> None:
        """Charge this rank for a new scratch buffer of ``nbytes`` (see :func:`~._chunks.scratch`)."""
        raise NotImplementedError

    def copied(self, nbytes: int) -> None:
        """Charge this rank for copying ``nbytes`` between its own buffers (see :func:`~._chunks.copy`)."""
        raise NotImplementedError


class Lender:
    """A transport that lends scratch buffers kept from earlier collectives (declared by subclassing): the
    socket backend's. :func:`~._chunks.scratch` asks it instead of allocating."""

    def lend(self, like: Any, numel: int) -> Any:
        """A flat buffer of ``numel`` elements of ``like``'s kind, dtype and device; its contents are undefined."""
        raise NotImplementedError


class Subgroup(Timed):
    """The transport of some of ``t``'s ranks: ``members`` (group ranks of ``t``, this rank among them)
    renumbered ``0 .. len(members) - 1``, every tag shifted by ``tag_base``.

    An algorithm run on it is the same algorithm on a smaller group; its messages, reductions and
    scratch go through ``t``.
    """

    __slots__ = ("members", "rank", "size", "t", "tag_base")

    def __init__(self, t: Transport, members: Sequence[int], tag_base: int = 0):
        self.t = t
        self.members = tuple(members)
        self.rank = self.members.index(t.rank)
        self.size = len(self.members)
        self.tag_base = tag_base

    def isend(self, buf: Any, peer: int, tag: int = 0, *, chunk: int | None = None) -> Handle:
        return self.t.isend(buf, self.members[peer], self.tag_base + tag, chunk=chunk)

    def irecv(self, buf: Any, peer: int, tag: int = 0, *, chunk: int | None = None) -> Handle:
        return self.t.irecv(buf, self.members[peer], self.tag_base + tag, chunk=chunk)

    def wait(self, handles: Iterable[Handle]) -> None:
        self.t.wait(handles)

    def reduced(self, nbytes: int) -> None:
        if isinstance(self.t, Timed):
            self.t.reduced(nbytes)

    def allocated(self, nbytes: int) -> None:
        if isinstance(self.t, Timed):
            self.t.allocated(nbytes)

    def copied(self, nbytes: int) -> None:
        if isinstance(self.t, Timed):
            self.t.copied(nbytes)


def machines(hosts: Sequence[Hashable] | None, size: int) -> list[list[int]] | None:
    """The group ranks of each machine, machines in the order of their lowest rank, ranks in order;
    ``None`` unless ``hosts`` (a machine label per group rank) puts the same number of ranks, more
    than one, on each of two or more machines.

    >>> machines(["a", "b", "a", "b"], 4)
    [[0, 2], [1, 3]]
    >>> machines(["a", "a", "b"], 3) is None  # uneven
    True
    """
    if hosts is None or len(hosts) != size:
        return None
    by_host: dict[Hashable, list[int]] = {}
    for rank, host in enumerate(hosts):
        by_host.setdefault(host, []).append(rank)
    groups = list(by_host.values())
    if len(groups) < 2 or len(groups[0]) < 2 or any(len(g) != len(groups[0]) for g in groups):
        return None
    return groups


def observe(t: Transport, buf: Any, offset: int = 0) -> None:
    """Show ``buf`` to a recording transport as elements ``offset ..`` of this rank's working data.

    The working data is laid out as the algorithm's module says (for reduce_scatter,
    the input's ``p`` blocks; for Bruck, its scratch). Once a rank has observed
    something, a trace shows its observed data instead of its output buffer. A no-op
    unless ``t`` is an :class:`Observer`.
    """
    if isinstance(t, Observer):
        t.observe(buf, offset)


def together(algorithms: Sequence[Algorithm]) -> Algorithm:
    """One algorithm of several run side by side: each step waits for the handles of every unfinished
    algorithm's next step (lockstep); it ends when the last of them does. One algorithm alone gives its
    own steps."""
    running = list(algorithms)
    while running:
        handles: list = []
        for alg in list(running):
            try:
                handles += next(alg)
            except StopIteration:
                running.remove(alg)
        if running:
            yield handles


def pipelined(pieces: Sequence[Sequence[Algorithm]]) -> Algorithm:
    """One algorithm of pieces that each go through the same phases in order: stage ``s`` runs phase ``i``
    of piece ``s - i`` for every phase ``i`` :func:`together`, and ends when all of them have.

    So the first phase of piece ``j + 1`` runs beside the second of piece ``j``: with phases on different
    links, no link waits for another's phase. Every rank runs the same pieces and phases in every stage,
    whatever their step counts, so a message of a stage meets its partner in the same stage. One piece
    gives its phases one after another.
    """
    phases = max((len(piece) for piece in pieces), default=0)
    for stage in range(len(pieces) + phases - 1):
        yield from together([piece[stage - j] for j, piece in enumerate(pieces) if 0 <= stage - j < len(piece)])


def run_blocking(algorithm: Algorithm, transport: Transport) -> None:
    """Run an algorithm to completion, blocking on each step's handles."""
    for handles in algorithm:
        if handles:
            transport.wait(handles)
