"""What one rank passes to a collective's algorithm, one typed tuple per collective.

An algorithm is called as ``fn(transport, *args)`` (the table in :mod:`simdist.algorithms`);
:func:`simdist.algorithms.oneshot.run` reads the same tuples of every rank to compute all
results at once. Buffers are flat; ``root`` is a group rank; ``op`` is never ``AVG``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from ..core._reduce_op import ReduceOp

__all__ = [
    "AllGatherArgs",
    "AllReduceArgs",
    "AllToAllArgs",
    "BarrierArgs",
    "BroadcastArgs",
    "GatherArgs",
    "ReduceArgs",
    "ReduceScatterArgs",
    "ScatterArgs",
]


class AllReduceArgs(NamedTuple):
    """``all_reduce``: ``buf`` becomes the reduction of every rank's ``buf``."""

    buf: Any
    op: ReduceOp


class BroadcastArgs(NamedTuple):
    """``broadcast``: every ``buf`` becomes the root's."""

    buf: Any
    root: int


class ReduceArgs(NamedTuple):
    """``reduce``: the root's ``buf`` becomes the reduction of every rank's."""

    buf: Any
    op: ReduceOp
    root: int


class AllGatherArgs(NamedTuple):
    """``all_gather``: ``out`` becomes every rank's ``inp``, in rank order."""

    inp: Any
    out: Any


class GatherArgs(NamedTuple):
    """``gather``: the root's ``out`` becomes every rank's ``inp`` (``out`` is ``None`` elsewhere)."""

    inp: Any
    out: Any
    root: int


class ScatterArgs(NamedTuple):
    """``scatter``: each ``out`` becomes its block of the root's ``inp`` (``inp`` is ``None`` elsewhere)."""

    inp: Any
    out: Any
    root: int


class ReduceScatterArgs(NamedTuple):
    """``reduce_scatter``: ``out`` becomes the reduction of every rank's block of ``inp`` with this rank's
    index (``counts`` elements each)."""

    inp: Any
    out: Any
    counts: Sequence[int]
    op: ReduceOp


class AllToAllArgs(NamedTuple):
    """``all_to_all``: block ``j`` of ``inp`` (``send[j]`` elements) goes to rank ``j``, block ``i`` of ``out``
    (``recv[i]`` elements) comes from rank ``i``."""

    inp: Any
    out: Any
    send: Sequence[int]
    recv: Sequence[int]


class BarrierArgs(NamedTuple):
    """``barrier``: the zero-byte messages are cut from ``scratch``."""

    scratch: Any
