"""Collectives of picklable Python objects, built on the tensor collectives.

Objects are pickled into uint8 tensors; sizes travel first so every rank can allocate.
Only use them with ranks you trust: unpickling runs code.
"""

from __future__ import annotations

import pickle
from typing import Any

import torch

from ._collectives import all_gather, broadcast, gather, scatter
from ._checks import resolve, root_of
from ._entry import library_call

__all__ = ["broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list"]


def _pack(obj: Any) -> torch.Tensor:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


def _unpack(t: torch.Tensor, n: int) -> Any:
    return pickle.loads(t[:n].numpy().tobytes())


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
        pos = 0
        for i, n in enumerate(sizes.tolist()):
            object_list[i] = _unpack(data[pos : pos + n], n)
            pos += n


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
