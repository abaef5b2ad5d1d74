"""Collectives of picklable Python objects, built on the tensor collectives.

Objects are pickled into uint8 tensors; sizes travel first so every rank can allocate.
Only use them with ranks you trust: unpickling runs code.
"""

from __future__ import annotations

import pickle
from typing import Any

import torch

from ._collectives import all_gather, broadcast, gather, scatter
from ..core._checks import resolve, root_of
from ..core._entry import library_call
from ._p2p import P2POp, batch_isend_irecv, irecv, isend

__all__ = [
    "broadcast_object_list",
    "all_gather_object",
    "gather_object",
    "scatter_object_list",
    "send_object_list",
    "recv_object_list",
]


def _pack(obj: Any) -> torch.Tensor:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


def _unpack(t: torch.Tensor, n: int) -> Any:
    return pickle.loads(t[:n].numpy().tobytes())


def _unpack_into(object_list: list, data: torch.Tensor, sizes: torch.Tensor) -> None:
    """Set ``object_list[i]`` to the i-th object of ``data``, pickled objects of ``sizes`` bytes one after another."""
    pos = 0
    for i, n in enumerate(sizes.tolist()):
        object_list[i] = _unpack(data[pos : pos + n], n)
        pos += n


def _check_objects(items: Any, argname: str, length: int | None = None, where: str = "") -> None:
    """``items`` is a list (of ``length`` entries when given); errors name the argument and the value."""
    if not isinstance(items, list):
        raise TypeError(f"{argname} must be a list, got {type(items).__name__} ({items!r:.60})")
    if length is not None and len(items) != length:
        raise ValueError(f"{argname} has {len(items)} entries, expected {length} (the group size){where}")


def _padded(t: torch.Tensor, n: int) -> torch.Tensor:
    out = torch.zeros(n, dtype=torch.uint8)
    out[: t.numel()] = t
    return out


@library_call
def broadcast_object_list(
    object_list: list, src: int | None = None, group: Any = None, device: Any = None, group_src: int | None = None
) -> None:
    """Replace ``object_list``'s entries on every rank with those of rank ``src`` (in place)."""
    _check_objects(object_list, "object_list")
    world, pg = resolve("broadcast_object_list", group)
    if pg is None:
        return
    root = root_of(world, pg, src, group_src, "src", default=None)
    src_global = pg.ranks[root]
    packed = [_pack(o) for o in object_list] if pg.rank == root else []
    sizes = torch.tensor([p.numel() for p in packed] or [0] * len(object_list), dtype=torch.int64)
    broadcast(sizes, src=src_global, group=group)
    data = torch.cat(packed) if packed else torch.empty(int(sizes.sum()), dtype=torch.uint8)
    broadcast(data, src=src_global, group=group)
    if pg.rank != root:
        _unpack_into(object_list, data, sizes)


def _gather_sizes(t: torch.Tensor, group: Any, size: int) -> list[int]:
    mine = torch.tensor([t.numel()], dtype=torch.int64)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(size)]
    all_gather(sizes, mine, group=group)
    return [int(s.item()) for s in sizes]


@library_call
def all_gather_object(object_list: list, obj: Any, group: Any = None) -> None:
    """Set ``object_list[i]`` to rank i's ``obj`` on every rank of the group."""
    world, pg = resolve("all_gather_object", group)
    if pg is None:
        return
    _check_objects(object_list, "object_list", pg.size)
    mine = _pack(obj)
    sizes = _gather_sizes(mine, group, pg.size)
    width = max(sizes)
    outs = [torch.empty(width, dtype=torch.uint8) for _ in range(pg.size)]
    all_gather(outs, _padded(mine, width), group=group)
    for i, (t, n) in enumerate(zip(outs, sizes)):
        object_list[i] = _unpack(t, n)


@library_call
def gather_object(
    obj: Any,
    object_gather_list: list | None = None,
    dst: int | None = None,
    group: Any = None,
    group_dst: int | None = None,
) -> None:
    """On rank ``dst``, set ``object_gather_list[i]`` to rank i's ``obj``; other ranks pass ``None``."""
    world, pg = resolve("gather_object", group)
    if pg is None:
        return
    root = root_of(world, pg, dst, group_dst, "dst")
    if pg.rank == root:
        _check_objects(object_gather_list, "object_gather_list", pg.size, " on the destination rank")
    mine = _pack(obj)
    sizes = _gather_sizes(mine, group, pg.size)
    width = max(sizes)
    outs = [torch.empty(width, dtype=torch.uint8) for _ in range(pg.size)] if pg.rank == root else None
    gather(_padded(mine, width), outs, dst=pg.ranks[root], group=group)
    if outs is not None and object_gather_list is not None:  # (the root, whose list was checked above)
        for i, (t, n) in enumerate(zip(outs, sizes)):
            object_gather_list[i] = _unpack(t, n)


@library_call
def scatter_object_list(
    scatter_object_output_list: list,
    scatter_object_input_list: list | None = None,
    src: int | None = None,
    group: Any = None,
    group_src: int | None = None,
) -> None:
    """Set ``scatter_object_output_list[0]`` on rank i to ``scatter_object_input_list[i]`` of rank ``src``."""
    world, pg = resolve("scatter_object_list", group)
    if pg is None:
        return
    _check_objects(scatter_object_output_list, "scatter_object_output_list")
    if not scatter_object_output_list:
        raise ValueError("scatter_object_output_list=[] is empty; it needs one entry to receive this rank's object")
    root = root_of(world, pg, src, group_src, "src")
    src_global = pg.ranks[root]
    if pg.rank == root:
        _check_objects(scatter_object_input_list, "scatter_object_input_list", pg.size, " on the source rank")
        packed = [_pack(o) for o in scatter_object_input_list or ()]
        sizes = torch.tensor([p.numel() for p in packed], dtype=torch.int64)
    else:
        sizes = torch.zeros(pg.size, dtype=torch.int64)
    broadcast(sizes, src=src_global, group=group)
    width = int(sizes.max().item())
    parts = [_padded(p, width) for p in packed] if pg.rank == root else None
    out = torch.empty(width, dtype=torch.uint8)
    scatter(out, parts, src=src_global, group=group)
    scatter_object_output_list[0] = _unpack(out, int(sizes[pg.rank].item()))


def _peer(fn: str, group: Any, rank: int | None, group_rank: int | None, argname: str) -> tuple[Any, int | None]:
    """The group and the group rank of the peer of ``fn`` (``None`` on a rank outside ``group``), as torch checks it."""
    world, pg = resolve(fn, group)
    if pg is None:
        return None, None
    peer = root_of(world, pg, rank, group_rank, argname, default=None)
    if peer == pg.rank:
        kind = "destination" if argname == "dst" else "source"
        raise ValueError(f"Invalid {kind} rank: {kind} rank should not be the same as the rank of the current process.")
    return pg, peer


def _p2p(op: Any, t: torch.Tensor, pg: Any, peer: int, group: Any, use_batch: bool) -> None:
    """Send or receive ``t`` with the peer of group rank ``peer``: one blocking call, or a batch of one."""
    if use_batch:
        batch_isend_irecv([P2POp(op, t, group=group, group_peer=peer)])[0].wait()
    else:
        work = op(t, group=group, group_dst=peer) if op is isend else op(t, group=group, group_src=peer)
        if work is not None:  # None only on a rank outside the group, which never gets here
            work.wait()


@library_call
def send_object_list(
    object_list: list,
    dst: int | None = None,
    group: Any = None,
    device: Any = None,
    group_dst: int | None = None,
    use_batch: bool = False,
) -> None:
    """Send the picklable objects of ``object_list`` to rank ``dst``, whose ``recv_object_list`` receives them.

    ``object_list`` is not modified. Two messages go to ``dst``: the pickled sizes, then the
    pickled objects, as torch sends them; the call returns once both are handed over.

    Args:
        object_list: the objects to send; the receiver's list must have as many entries.
        dst: the receiver's global rank. Required unless ``group_dst`` is given.
        group: a group from ``new_group``; ``None`` is the default group.
        device: accepted for torch's signature; the bytes travel as CPU tensors.
        group_dst: ``dst`` as a rank of ``group``; pass at most one of ``dst`` and ``group_dst``.
        use_batch: send through ``batch_isend_irecv`` (as torch does) instead of ``send``.

    Raises:
        NotInitializedError: before ``init_process_group``.
        TypeError: ``object_list`` is not a list.
        ValueError: neither ``dst`` nor ``group_dst`` is given, or it names this rank.

    Example:
        >>> import simdist
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     objects = [{"step": 3}, "hello"] if rank == 0 else [None, None]
        ...     if rank == 0:
        ...         simdist.send_object_list(objects, dst=1)
        ...     else:
        ...         simdist.recv_object_list(objects, src=0)
        ...     return objects
        >>> simdist.simulate(fn, 2).values
        [[{'step': 3}, 'hello'], [{'step': 3}, 'hello']]
    """
    _check_objects(object_list, "object_list")
    pg, peer = _peer("send_object_list", group, dst, group_dst, "dst")
    if peer is None:
        return
    packed = [_pack(o) for o in object_list]
    _p2p(isend, torch.tensor([p.numel() for p in packed], dtype=torch.int64), pg, peer, group, use_batch)
    _p2p(isend, torch.cat(packed) if packed else torch.empty(0, dtype=torch.uint8), pg, peer, group, use_batch)


@library_call
def recv_object_list(
    object_list: list,
    src: int | None = None,
    group: Any = None,
    device: Any = None,
    group_src: int | None = None,
    use_batch: bool = False,
) -> int:
    """Replace ``object_list``'s entries (in place) with the objects rank ``src`` sends by ``send_object_list``.

    The sender is named (``src`` or ``group_src``), as torch requires; only this rank's list changes.

    Args:
        object_list: a list with as many entries as the sender sends; they are overwritten.
        src: the sender's global rank. Required unless ``group_src`` is given.
        group: a group from ``new_group``; ``None`` is the default group.
        device: accepted for torch's signature; the bytes travel as CPU tensors.
        group_src: ``src`` as a rank of ``group``; pass at most one of ``src`` and ``group_src``.
        use_batch: receive through ``batch_isend_irecv`` (as torch does) instead of ``recv``.

    Returns:
        The sender's global rank; -1 on a rank outside ``group``.

    Raises:
        NotInitializedError: before ``init_process_group``.
        TypeError: ``object_list`` is not a list.
        ValueError: neither ``src`` nor ``group_src`` is given, or it names this rank.

    Example:
        >>> import simdist
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     if rank == 1:
        ...         simdist.send_object_list([rank * 10], dst=0)
        ...         return None
        ...     got = [None]
        ...     sender = simdist.recv_object_list(got, src=1)
        ...     return sender, got
        >>> simdist.simulate(fn, 2).values
        [(1, [10]), None]
    """
    _check_objects(object_list, "object_list")
    pg, peer = _peer("recv_object_list", group, src, group_src, "src")
    if peer is None:
        return -1
    sizes = torch.empty(len(object_list), dtype=torch.int64)
    _p2p(irecv, sizes, pg, peer, group, use_batch)
    data = torch.empty(int(sizes.sum()), dtype=torch.uint8)
    _p2p(irecv, data, pg, peer, group, use_batch)
    _unpack_into(object_list, data, sizes)
    return pg.ranks[peer]
