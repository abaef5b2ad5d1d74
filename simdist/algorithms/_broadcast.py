"""broadcast algorithms: ``fn(t, buf, root)`` copies the root's ``buf`` into every rank's ``buf``.

Ranks are renumbered relative to the root (``v = (rank - root) mod p``) so the trees
hang from the root; the root's ``buf`` is only read, never written.
"""

from __future__ import annotations

from typing import Any

from ..core import _arrays as A
from ._chunks import CHAIN_SEGMENT_BYTES, ceil_log2, chunk_bounds, recv, segment, segment_grid, send
from ._transport import Algorithm, Transport

__all__ = ["binomial", "scatter_allgather", "chain_pipelined", "binomial_tree_bcast"]


def binomial_tree_bcast(t: Transport, buf: Any, root: int, *, tag: int = 0) -> Algorithm:
    """Binomial-tree broadcast of ``buf`` from ``root``; tags ``tag .. tag + ceil(log2 p) - 1``.

    Relative rank ``v`` with lowest set bit ``2^k`` receives from ``v - 2^k`` at tag
    ``tag + k``, then sends to ``v + 2^j`` for ``j = k-1 .. 0`` (the root: from
    ``ceil(log2 p) - 1``), one message per step.
    """
    p = t.size
    v = (t.rank - root) % p
    top = (v & -v).bit_length() - 1 if v else ceil_log2(p)
    if v:
        yield recv(t, buf, (v - (1 << top) + root) % p, tag + top)
    for j in range(top - 1, -1, -1):
        if v + (1 << j) < p:
            yield send(t, buf, (v + (1 << j) + root) % p, tag + j)


def binomial(t: Transport, buf: Any, root: int) -> Algorithm:
    """Binomial tree: ``ceil(log2 p)`` steps, each forwarding the whole buffer.

    The number of ranks holding the data doubles every step; best for short messages.
    """
    if t.size == 1 or A.numel(buf) == 0:
        return
    yield from binomial_tree_bcast(t, buf, root)


def scatter_allgather(t: Transport, buf: Any, root: int) -> Algorithm:
    """Van de Geijn: binomial scatter of ``p`` chunks, then a ring all-gather of the chunks.

    Relative rank ``v`` ends the scatter holding chunk ``v`` (:func:`chunk_bounds`); the
    ring then passes every chunk around. About ``2 (p-1)/p`` of the buffer crosses each
    rank's link instead of ``log2 p`` whole buffers: best for long messages.
    """
    p = t.size
    n = A.numel(buf)
    if p == 1 or n == 0:
        return
    v = (t.rank - root) % p
    bounds = chunk_bounds(n, p)

    def span(lo: int, hi: int) -> Any:
        """The chunks ``lo .. hi - 1`` (relative ranks) as one view of ``buf``."""
        start = bounds[lo][0]
        end = bounds[hi - 1][0] + bounds[hi - 1][1]
        return A.narrow(buf, start, end - start)

    def real(u: int) -> int:
        return (u + root) % p

    # Scatter: relative rank v (lowest bit 2^k) gets chunks [v, v + 2^k) from v - 2^k.
    top = (v & -v).bit_length() - 1 if v else ceil_log2(p)
    if v:
        hi = min(v + (1 << top), p)
        yield recv(t, span(v, hi), real(v - (1 << top)), top, v if hi == v + 1 else None)
    for j in range(top - 1, -1, -1):
        child = v + (1 << j)
        if child < p:
            hi = min(child + (1 << j), p)
            yield send(t, span(child, hi), real(child), j, child if hi == child + 1 else None)

    # Ring all-gather of the chunks, in relative rank order. The root holds every chunk
    # already: it only sends, and its left neighbour sends it nothing.
    base = ceil_log2(p)
    right, left = real(v + 1), real(v - 1)
    for step in range(p - 1):
        out, inc = (v - step) % p, (v - step - 1) % p
        recvs = recv(t, span(inc, inc + 1), left, base + step, inc) if v != 0 else []
        sends = send(t, span(out, out + 1), right, base + step, out) if v != p - 1 else []
        yield sends + recvs


def chain_pipelined(t: Transport, buf: Any, root: int, *, segment_bytes: int = CHAIN_SEGMENT_BYTES) -> Algorithm:
    """Pipelined chain: ``buf`` cut into segments of about ``segment_bytes``; relative rank ``v``
    receives each segment from ``v - 1`` and forwards it to ``v + 1`` as soon as it is in.

    With ``S`` segments the last rank has everything after ``p - 2 + S`` segment times, and
    every link carries the buffer once: best for long messages on more than two ranks.
    A rank posts all its receives first; segments travel in order under one tag.
    """
    p = t.size
    n = A.numel(buf)
    if p == 1 or n == 0:
        return
    v = (t.rank - root) % p
    width, parts = segment_grid(n, A.itemsize(buf), segment_bytes)
    segs = [segment(buf, k, width) for k in range(parts)]
    prev, nxt = (t.rank - 1) % p, (t.rank + 1) % p
    recvs = [recv(t, seg, prev, 0) for seg in segs] if v else []
    sends: list = []
    for k, seg in enumerate(segs):
        if v:
            yield recvs[k]
        if v < p - 1:
            sends += send(t, seg, nxt, 0)
    yield sends
