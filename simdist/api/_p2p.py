"""The torch.distributed-compatible point-to-point operations: send, recv, isend, irecv, batches.

Every function resolves the world, then the group, checks its arguments, then calls the group.
On a rank outside ``group`` an operation warns (``UserWarning``, as torch), does nothing and
returns ``None``. Ranks named by ``dst``/``src`` are *global* ranks; ``group_dst``/``group_src``
name ranks within ``group``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..core import _arrays as A
from ..core._callsite import user_call_site
from ..core._entry import library_call
from ..core._checks import check_int, resolve, root_of
from ..core._group import Options
from ..core._work import Work

__all__ = [
    "send",
    "recv",
    "isend",
    "irecv",
    "P2POp",
    "batch_isend_irecv",
]


def _p2p(fn: str, tensor: Any, peer: Any, group: Any, tag: Any, group_peer: Any, kind: str) -> tuple:
    """Check a point-to-point call and start it: ``(group, work)``, or ``(None, None)`` outside the group."""
    pg, target, opts = _p2p_args(fn, tensor, peer, group, tag, group_peer, kind)
    if pg is None:
        return None, None
    return pg, (pg.send(tensor, target, opts) if kind == "send" else pg.recv(tensor, target, opts))


def _p2p_args(fn: str, tensor: Any, peer: Any, group: Any, tag: Any, group_peer: Any, kind: str) -> tuple:
    """The group, the peer's group rank and the Options of a checked point-to-point call."""
    world, pg = resolve(fn, group)
    A.check_array(tensor, "tensor")
    if kind == "recv":
        A.check_writable(tensor, "tensor")
    tag = check_int(tag, "tag", 0)
    if pg is None:
        return None, None, None
    argname = "dst" if kind == "send" else "src"
    if peer is None and group_peer is None:
        if kind == "send":
            raise ValueError(f"{fn}: dst=None; pass dst (a global rank) or group_dst (a rank of the group)")
        target = None
    else:
        target = root_of(world, pg, peer, group_peer, argname)
        if target == pg.rank:
            raise ValueError(f"{fn}: {argname}={pg.ranks[target]} is this rank itself; a rank cannot {kind} to itself")
    opts = Options(tag=tag, call_site=user_call_site(), async_op=fn in ("isend", "irecv"))
    return pg, target, opts


@library_call
def send(tensor: Any, dst: int | None = None, group: Any = None, tag: int = 0, group_dst: int | None = None) -> None:
    """Send ``tensor`` to global rank ``dst``; ``tensor`` is not modified.

    Blocks until the message is handed over: on the simulator, until ``dst`` has posted the
    matching receive (sends of at most ``simulate``'s ``eager_limit`` bytes return at once).
    Messages between one pair of ranks with one tag on one group arrive in send order.

    Args:
        tensor: the data: a torch tensor or numpy array; the receive must have its dtype and
            number of elements.
        dst: the receiver's global rank. Required unless ``group_dst`` is given.
        group: a group from ``new_group``; ``None`` is the default group.
        tag: a non-negative int; a send matches only a receive with the same tag.
        group_dst: ``dst`` as a rank of ``group``; pass one of ``dst`` and ``group_dst``.

    Raises:
        NotInitializedError: before ``init_process_group``.
        TypeError: ``tensor`` is not an array, or ``tag`` is not an int.
        ValueError: neither or both of ``dst`` and ``group_dst``, ``dst`` is this rank, out of
            range or not in ``group``, or ``tag`` is negative.
        DistError: on the simulator, when the matching receive has another dtype or size.
        DeadlockError: on the simulator, when no receive is ever posted and every rank waits.

    Example:
        >>> import simdist, torch
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     t = torch.arange(4) if rank == 0 else torch.zeros(4, dtype=torch.int64)
        ...     if rank == 0:
        ...         simdist.send(t, dst=1)
        ...     else:
        ...         simdist.recv(t, src=0)
        ...     return t
        >>> simdist.simulate(fn, 2).values
        [tensor([0, 1, 2, 3]), tensor([0, 1, 2, 3])]
    """
    _, work = _p2p("send", tensor, dst, group, tag, group_dst, "send")
    if work is not None:
        work.wait()


@library_call
def recv(tensor: Any, src: int | None = None, group: Any = None, tag: int = 0, group_src: int | None = None) -> int:
    """Receive into ``tensor`` (overwritten in place) from global rank ``src``, or from any rank; return the sender.

    With ``src=None`` the first matching message of any sender is taken; on the simulator which
    sender that is is a scheduler choice (another seed may pick another sender).

    Args:
        tensor: the output: a writable array of the send's dtype and number of elements.
        src: the sender's global rank, or ``None`` (with no ``group_src``) for any rank.
        group: a group from ``new_group``; ``None`` is the default group.
        tag: a non-negative int; only a send with the same tag matches.
        group_src: ``src`` as a rank of ``group``; pass at most one of ``src`` and ``group_src``.

    Returns:
        The sender's global rank; -1 on a rank outside ``group``.

    Raises:
        NotInitializedError: before ``init_process_group``.
        TypeError: ``tensor`` is not an array, or ``tag`` is not an int.
        ValueError: ``tensor`` is read-only; both ``src`` and ``group_src``; ``src`` is this rank,
            out of range or not in ``group``; ``tag`` is negative.
        DistError: on the simulator, when the matched send has another dtype or size.

    Example:
        >>> import simdist, torch
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     if rank > 0:
        ...         simdist.send(torch.tensor([rank]), dst=0)
        ...         return None
        ...     t = torch.zeros(1, dtype=torch.int64)
        ...     return sorted(simdist.recv(t) for _ in range(2))   # any source: ranks 1 and 2
        >>> simdist.simulate(fn, 3).values
        [[1, 2], None, None]
    """
    pg, work = _p2p("recv", tensor, src, group, tag, group_src, "recv")
    if work is None:
        return -1
    work.wait()
    return work.source_rank()


@library_call
def isend(
    tensor: Any, dst: int | None = None, group: Any = None, tag: int = 0, group_dst: int | None = None
) -> Work | None:
    """Start sending ``tensor`` to ``dst`` and return at once: a ``Work`` to ``wait()`` on.

    ``tensor`` must not be modified before ``work.wait()`` returns, nor received into by an
    ``irecv``. On the simulator with ``check_buffers=True`` (as in ``simdist.testing``), such a
    write raises ``BufferRaceError`` at ``wait()``, such an ``irecv`` at its post; every ``Work``
    must be waited on (else a ``LeakWarning`` at the end of ``simulate``).

    Args:
        tensor: the data: a torch tensor or numpy array.
        dst: the receiver's global rank. Required unless ``group_dst`` is given.
        group: a group from ``new_group``; ``None`` is the default group.
        tag: a non-negative int; a send matches only a receive with the same tag.
        group_dst: ``dst`` as a rank of ``group``; pass one of ``dst`` and ``group_dst``.

    Returns:
        A ``Work`` (``wait()``, ``is_completed()``); ``None`` on a rank outside ``group``.

    Raises:
        NotInitializedError: before ``init_process_group``.
        TypeError: ``tensor`` is not an array, or ``tag`` is not an int.
        ValueError: neither or both of ``dst`` and ``group_dst``, ``dst`` is this rank, out of
            range or not in ``group``, or ``tag`` is negative.

    Example:
        >>> import simdist, torch
        >>> def fn(rank):                     # two ranks swap tensors; neither blocks the other
        ...     simdist.init_process_group("gloo")
        ...     mine, theirs = torch.tensor([rank, rank]), torch.zeros(2, dtype=torch.int64)
        ...     works = [simdist.isend(mine, dst=1 - rank), simdist.irecv(theirs, src=1 - rank)]
        ...     for w in works:
        ...         w.wait()
        ...     return theirs
        >>> simdist.simulate(fn, 2).values
        [tensor([1, 1]), tensor([0, 0])]
    """
    return _p2p("isend", tensor, dst, group, tag, group_dst, "send")[1]


@library_call
def irecv(
    tensor: Any, src: int | None = None, group: Any = None, tag: int = 0, group_src: int | None = None
) -> Work | None:
    """Start receiving into ``tensor`` from ``src`` (any rank if ``None``) and return at once: a ``Work``.

    ``tensor`` holds the message, overwritten in place, once ``work.wait()`` returns; do not
    read or write it before, nor post another operation on its memory. On the simulator with
    ``check_buffers=True`` (as in ``simdist.testing``), a write before then raises
    ``BufferRaceError`` at ``wait()``; an ``irecv`` into memory that an ``isend`` or ``irecv``
    in flight uses, or an ``isend`` of this one's memory, raises it at that post.
    ``work.source_rank()`` is the sender's global rank after the wait.

    Args:
        tensor: the output: a writable array of the send's dtype and number of elements.
        src: the sender's global rank, or ``None`` (with no ``group_src``) for any rank.
        group: a group from ``new_group``; ``None`` is the default group.
        tag: a non-negative int; only a send with the same tag matches.
        group_src: ``src`` as a rank of ``group``; pass at most one of ``src`` and ``group_src``.

    Returns:
        A ``Work`` (``wait()``, ``is_completed()``, ``source_rank()``); ``None`` on a rank outside
        ``group``.

    Raises:
        NotInitializedError: before ``init_process_group``.
        TypeError: ``tensor`` is not an array, or ``tag`` is not an int.
        ValueError: ``tensor`` is read-only; both ``src`` and ``group_src``; ``src`` is this rank,
            out of range or not in ``group``; ``tag`` is negative.

    Example:
        >>> import simdist, torch
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     if rank == 1:
        ...         simdist.send(torch.arange(4), dst=0)
        ...         return None
        ...     t = torch.zeros(4, dtype=torch.int64)
        ...     work = simdist.irecv(t)
        ...     work.wait()
        ...     return t, work.source_rank()
        >>> simdist.simulate(fn, 2).values
        [(tensor([0, 1, 2, 3]), 1), None]
    """
    return _p2p("irecv", tensor, src, group, tag, group_src, "recv")[1]


@dataclass
class P2POp:
    """One point-to-point operation for :func:`batch_isend_irecv`: ``op`` is ``isend`` or ``irecv``.

    Args:
        op: ``simdist.isend`` or ``simdist.irecv`` (the functions themselves).
        tensor: the data to send, or the writable array to receive into.
        peer: the other side's global rank (``dst`` of a send, ``src`` of a receive).
        group: a group from ``new_group``; ``None`` is the default group.
        tag: a non-negative int; sends and receives match by tag.
        group_peer: ``peer`` as a rank of ``group``; give ``peer`` or ``group_peer``.

    Raises:
        ValueError: ``op`` is neither function, or neither ``peer`` nor ``group_peer`` is given.
    """

    op: Callable
    tensor: Any
    peer: int | None = None
    group: Any = None
    tag: int = 0
    group_peer: int | None = None

    def __post_init__(self) -> None:
        if self.op not in (isend, irecv):
            raise ValueError(f"op={self.op!r} must be simdist.isend or simdist.irecv")
        if self.peer is None and self.group_peer is None:
            raise ValueError("P2POp: peer=None and group_peer=None; pass peer (a global rank) or group_peer")


@library_call
def batch_isend_irecv(p2p_op_list: Sequence[P2POp]) -> list[Work]:
    """Start every operation of ``p2p_op_list`` and return their works, to ``wait()`` on each.

    The operations on one group start together (on NCCL, in one NCCL group), so two ranks that
    each send to the other before receiving do not wait on each other. Receive buffers hold
    their messages once their works are waited on.

    Args:
        p2p_op_list: a non-empty list of :class:`P2POp`.

    Returns:
        One ``Work`` per operation on a group this rank belongs to, in the order of the list
        within each group (groups in order of first appearance).

    Raises:
        NotInitializedError: before ``init_process_group``.
        TypeError: an entry is not a ``P2POp``, or its tensor is not an array.
        ValueError: ``p2p_op_list`` is empty or not a list, or an entry fails the checks of
            ``isend``/``irecv`` (read-only receive buffer, peer is this rank, ...).

    Example:
        >>> import simdist, torch
        >>> def fn(rank):                     # a ring: send right, receive from the left
        ...     simdist.init_process_group("gloo")
        ...     right, left = (rank + 1) % 3, (rank - 1) % 3
        ...     got = torch.zeros(1, dtype=torch.int64)
        ...     ops = [simdist.P2POp(simdist.isend, torch.tensor([rank]), right),
        ...            simdist.P2POp(simdist.irecv, got, left)]
        ...     for work in simdist.batch_isend_irecv(ops):
        ...         work.wait()
        ...     return int(got)
        >>> simdist.simulate(fn, 3).values
        [2, 0, 1]
    """
    if not isinstance(p2p_op_list, (list, tuple)) or not p2p_op_list:
        raise ValueError(f"p2p_op_list must be a non-empty list of P2POp, got {p2p_op_list!r:.60}")
    for i, p in enumerate(p2p_op_list):
        if not isinstance(p, P2POp):
            raise TypeError(f"p2p_op_list[{i}] must be a P2POp, got {type(p).__name__} ({p!r:.60})")
    batches: dict[int, tuple[Any, list]] = {}  # per group, in the order of the list
    for p in p2p_op_list:
        fn, kind = ("isend", "send") if p.op is isend else ("irecv", "recv")
        pg, target, opts = _p2p_args(fn, p.tensor, p.peer, p.group, p.tag, p.group_peer, kind)
        if pg is not None:
            batches.setdefault(id(pg), (pg, []))[1].append((kind, p.tensor, target, opts))
    return [work for pg, ops in batches.values() for work in pg.batch_p2p(ops)]
