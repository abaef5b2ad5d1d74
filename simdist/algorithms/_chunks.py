"""Small helpers shared by the algorithms: block bounds, tree arithmetic, posting messages."""

from __future__ import annotations

import operator
from itertools import accumulate
from typing import Any, Sequence

from ..core import _arrays as A
from ..core._reduce_op import ReduceOp
from ._transport import Handle, Lender, Timed, Transport

__all__ = [
    "chunk_bounds",
    "chunk_lengths",
    "offsets",
    "floor_log2",
    "ceil_log2",
    "fold",
    "first_of",
    "real_of",
    "send",
    "recv",
    "combine",
    "copy",
    "scratch",
    "check_counts",
    "check_numel",
    "SEGMENT_BYTES",
    "WINDOW",
    "CHAIN_SEGMENT_BYTES",
    "PIECE_BYTES",
    "PIECES",
    "pieces",
    "segment_grid",
    "segment",
]

SEGMENT_BYTES = 4 << 20
"""Bytes per segment of the pipelined algorithms: enough segments for receiving and reducing
to overlap, few enough that per-message costs stay small (over loopback TCP with Python
threads, 4 MiB segments beat 1 and 2 MiB ones: a 64 MiB all_reduce on 2 ranks took 50-60 ms
against 70-78 ms with 1 MiB)."""

WINDOW = 2
"""Segments a pipelined algorithm receives ahead into rotating scratch slots."""

PIECE_BYTES = 8 << 20
"""The least bytes of a piece of the hierarchical all_reduce (see :func:`pieces`). Each piece costs every
rank its messages again: between namespace hosts on 1 Gbit/s links, 16 MiB in 2 pieces took 0.93-0.96x
the time of 1 piece and 32 MiB in 4 0.88-0.93x, but on unshaped links, where 8 ranks on 2 cores make the
time, 16 MiB in 2 pieces took 0.97-1.11x and 4 MiB in 4 1.33-1.85x (BENCHMARKS.md, section (n2))."""

PIECES = 4
"""The most pieces of the hierarchical all_reduce: with ``P`` pieces, one piece's phases within the machines
run beside another's across them, and a ``1/P`` share of the time within the machines shows."""


def pieces(nbytes: int, piece_bytes: int = PIECE_BYTES) -> int:
    """Pieces of a hierarchical all_reduce of ``nbytes``: one per ``piece_bytes``, 1 to :data:`PIECES`.

    >>> pieces(4 << 20), pieces(16 << 20), pieces(64 << 20)
    (1, 2, 4)
    """
    return max(1, min(PIECES, nbytes // max(piece_bytes, 1)))


CHAIN_SEGMENT_BYTES = 2 << 20
"""Bytes per segment of the pipelined chain broadcast. A chain fills in ``p - 2`` segment
times, so it gains from shorter segments than the rings: the alpha-beta optimum
``sqrt((p-2)·n·β/α)`` segments is 1.5 to 3 MiB each for 16 to 64 MiB on 4 ranks of the
socket backend's network."""


def chunk_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """Split ``n`` elements into ``parts`` contiguous chunks, as evenly as possible.

    Returns ``parts`` pairs ``(start, length)`` in order; the first ``n % parts`` chunks
    are one element longer than the others. Chunks may be empty when ``n < parts``.

    >>> chunk_bounds(7, 3)
    [(0, 3), (3, 2), (5, 2)]
    """
    lengths = chunk_lengths(n, parts)
    return list(zip(offsets(lengths), lengths))


def chunk_lengths(n: int, parts: int) -> list[int]:
    """The lengths of :func:`chunk_bounds`'s chunks: ``n % parts`` chunks of ``n // parts + 1``
    elements, then ``n // parts`` elements each.

    >>> chunk_lengths(7, 3)
    [3, 2, 2]
    """
    if parts < 1:
        raise ValueError(f"parts={parts!r} must be at least 1")
    if n < 0:
        raise ValueError(f"n={n!r} must be non-negative")
    base, extra = divmod(n, parts)
    return [base + 1] * extra + [base] * (parts - extra)


def offsets(counts: Sequence[int]) -> list[int]:
    """Start offsets of consecutive blocks of ``counts`` elements, plus the total at the end."""
    return [0, *accumulate(counts)]


def floor_log2(p: int) -> int:
    """The largest ``k`` with ``2**k <= p`` (``p >= 1``)."""
    return p.bit_length() - 1


def ceil_log2(p: int) -> int:
    """The smallest ``k`` with ``2**k >= p`` (``p >= 1``)."""
    return (p - 1).bit_length()


def fold(rank: int, size: int) -> tuple[int, int, int]:
    """Map ``rank`` onto the largest power of two ``pof2 <= size`` (the usual trick).

    The first ``2 * rem`` ranks (``rem = size - pof2``) pair up: even rank ``2i`` hands
    its data to odd rank ``2i + 1``, which acts as new rank ``i``; ranks from ``2 * rem``
    on become ``rank - rem``. New ranks keep the order of the original ranks, and new
    rank ``i`` stands for original ranks ``first(i) .. first(i + 1) - 1`` (see
    :func:`first_of`). Returns ``(pof2, rem, newrank)``; ``newrank`` is -1 for the even
    ranks that sit out.
    """
    pof2 = 1 << floor_log2(size)
    rem = size - pof2
    if rank < 2 * rem:
        newrank = -1 if rank % 2 == 0 else rank // 2
    else:
        newrank = rank - rem
    return pof2, rem, newrank


def first_of(newrank: int, rem: int) -> int:
    """The first original rank that new rank ``newrank`` of :func:`fold` stands for."""
    return 2 * newrank if newrank < rem else newrank + rem


def real_of(newrank: int, rem: int) -> int:
    """The original rank that acts as new rank ``newrank`` of :func:`fold`."""
    return 2 * newrank + 1 if newrank < rem else newrank + rem


def segment_grid(count: int, itemsize: int, segment_bytes: int = SEGMENT_BYTES) -> tuple[int, int]:
    """``(width, parts)``: ``count`` elements cut into ``parts`` segments of ``width`` elements
    (the last one shorter), each about ``segment_bytes``; ``(max(count, 1), 1)`` when one fits.
    """
    width = max(1, segment_bytes // max(itemsize, 1))
    if count <= width:
        return max(count, 1), 1
    return width, -(-count // width)


def segment(buf: Any, k: int, width: int) -> Any:
    """Segment ``k`` of ``buf``: elements ``k * width`` up to ``(k + 1) * width``, cut at the end
    of ``buf`` (empty past it). Buffers of different lengths share one grid this way."""
    start = min(k * width, A.numel(buf))
    return A.narrow(buf, start, min(width, A.numel(buf) - start))


def send(
    t: Transport, buf: Any, peer: int, tag: int, chunk: int | None = None, count: int | None = None
) -> list[Handle]:
    """Post a send of ``buf`` to ``peer``: ``[handle]``, or ``[]`` if ``buf`` is empty.

    Empty messages are skipped; the receiver skips them too, because both sides derive
    every block size from arguments that agree on all ranks. ``count``: ``buf``'s number
    of elements, where the caller has it at hand.
    """
    if (A.numel(buf) if count is None else count) == 0:
        return []
    return [t.isend(buf, peer, tag, chunk=chunk)]


def recv(
    t: Transport, buf: Any, peer: int, tag: int, chunk: int | None = None, count: int | None = None
) -> list[Handle]:
    """Post a receive into ``buf`` from ``peer``: ``[handle]``, or ``[]`` if ``buf`` is empty (as :func:`send`)."""
    if (A.numel(buf) if count is None else count) == 0:
        return []
    return [t.irecv(buf, peer, tag, chunk=chunk)]


def check_counts(counts: Sequence[int], size: int, argname: str) -> list[int]:
    """``counts`` as a list of ``size`` non-negative ints; ``ValueError`` naming ``argname`` if not."""
    try:
        result = list(map(operator.index, counts))
    except TypeError:
        result = None
    if result is None or len(result) != size or min(result, default=0) < 0:
        raise ValueError(f"{argname}={counts!r:.80} must be {size} non-negative ints, one per rank of the group")
    return result


def check_numel(buf: Any, expected: int, argname: str) -> None:
    """``ValueError`` naming ``argname`` unless ``buf`` has ``expected`` elements."""
    if A.numel(buf) != expected:
        raise ValueError(f"{argname} has {A.numel(buf)} elements; expected {expected}")


def combine(t: Transport, acc: Any, other: Any, op: ReduceOp) -> None:
    """``acc = acc (op) other`` in place; a :class:`Timed` transport charges the bytes of ``acc``."""
    A.reduce_(acc, other, op)
    if isinstance(t, Timed):
        t.reduced(A.nbytes(acc))


def copy(t: Transport, dst: Any, src: Any) -> None:
    """``dst`` holds ``src``'s elements (same length), copied in place; a :class:`Timed` transport charges the bytes."""
    A.copy_(dst, src)
    if isinstance(t, Timed):
        t.copied(A.nbytes(dst))


def scratch(t: Transport, like: Any, numel: int) -> Any:
    """A flat buffer of ``numel`` elements of ``like``'s kind, its contents undefined: lent by a :class:`Lender`
    transport, else new; a :class:`Timed` transport charges its bytes."""
    if isinstance(t, Lender):
        return t.lend(like, numel)
    buf = A.empty(like, numel)
    if isinstance(t, Timed):
        t.allocated(numel * A.itemsize(like))
    return buf
