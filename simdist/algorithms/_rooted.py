"""Rooted collectives: reduce, gather and scatter.

- reduce ``fn(t, buf, op, root)``: the root's ``buf`` becomes the reduction of every
  rank's ``buf``; other ranks' ``buf`` are left unchanged.
- gather ``fn(t, inp, out, root)``: the root's ``out`` (``p * n`` elements) gets rank
  ``i``'s ``inp`` at ``out[i*n:(i+1)*n]``; ``out`` is ``None`` on the other ranks.
- scatter ``fn(t, inp, out, root)``: rank ``i``'s ``out`` (``n`` elements) gets the
  root's ``inp[i*n:(i+1)*n]``; ``inp`` is ``None`` on the other ranks.

Binomial trees hang from the root: relative rank ``v = (rank - root) mod p`` with lowest
set bit ``2^k`` has parent ``v - 2^k`` and children ``v + 2^j`` for ``j < k``; its
subtree is the relative ranks ``v .. v + 2^k - 1`` (cut at ``p``), contiguous, so a
subtree's blocks travel as one message.
"""

from __future__ import annotations

from typing import Any

from ..core import _arrays as A
from ..core._reduce_op import ReduceOp
from ._chunks import ceil_log2, check_numel, combine, copy, recv, scratch, send
from ._transport import Algorithm, Transport

__all__ = [
    "binomial_tree_reduce",
    "reduce_binomial",
    "reduce_linear",
    "gather_linear",
    "gather_binomial",
    "scatter_linear",
    "scatter_binomial",
]


def _tree(p: int, rank: int, root: int) -> tuple[int, int]:
    """``(v, top)``: the relative rank and the number of child levels below it."""
    v = (rank - root) % p
    return v, ((v & -v).bit_length() - 1 if v else ceil_log2(p))


def binomial_tree_reduce(t: Transport, buf: Any, op: ReduceOp, root: int, *, in_place: bool, tag: int = 0) -> Algorithm:
    """Reduce ``buf`` to ``root`` up a binomial tree; tags ``tag .. tag + ceil(log2 p) - 1``.

    Each rank folds its children in, nearest first, its own (lower) data on the left,
    then sends the partial result to its parent. With ``in_place`` every rank may
    accumulate in ``buf`` (all_reduce); otherwise only the root's ``buf`` changes.
    """
    p = t.size
    n = A.numel(buf)
    v, top = _tree(p, t.rank, root)
    children = [j for j in range(top) if v + (1 << j) < p]
    acc = buf
    if children:
        if not (in_place or v == 0):
            acc = scratch(t, buf, n)
            copy(t, acc, buf)
        tmp = scratch(t, buf, n)
        for j in children:
            yield recv(t, tmp, (v + (1 << j) + root) % p, tag + j)
            combine(t, acc, tmp, op)
    if v:
        yield send(t, acc, (v - (1 << top) + root) % p, tag + top)


def reduce_binomial(t: Transport, buf: Any, op: ReduceOp, root: int) -> Algorithm:
    """Binomial tree: ``ceil(log2 p)`` steps, each moving whole buffers; best for short messages."""
    if t.size == 1 or A.numel(buf) == 0:
        return
    yield from binomial_tree_reduce(t, buf, op, root, in_place=False)


def reduce_linear(t: Transport, buf: Any, op: ReduceOp, root: int) -> Algorithm:
    """Linear: every rank sends its buffer to the root in one step; the root reduces.

    The root combines the buffers in rank order (``b0 op b1 op ... op b(p-1)``), the
    same order as :func:`simdist.algorithms.oneshot.reduce`, so both give the same bits.
    It needs ``(p - 1) * n`` elements of scratch on the root.
    """
    p, r = t.size, t.rank
    n = A.numel(buf)
    if p == 1 or n == 0:
        return
    if r != root:
        yield send(t, buf, root, 0, r)
        return
    tmp = scratch(t, buf, (p - 1) * n)
    slots = {j: A.narrow(tmp, (j - (j > root)) * n, n) for j in range(p) if j != root}
    yield [h for j, s in slots.items() for h in recv(t, s, j, 0, j)]
    acc = buf if root == 0 else slots[0]
    for j in range(1, p):
        combine(t, acc, buf if j == root else slots[j], op)
    if root != 0:
        copy(t, buf, acc)


def gather_linear(t: Transport, inp: Any, out: Any, root: int) -> Algorithm:
    """Linear: every rank sends its block straight to the root, all in one step."""
    p, r = t.size, t.rank
    n = A.numel(inp)
    if r == root:
        check_numel(out, p * n, "out")
        copy(t, A.narrow(out, r * n, n), inp)
    if p == 1 or n == 0:
        return
    if r != root:
        yield send(t, inp, root, 0, r)
        return
    yield [h for j in range(p) if j != root for h in recv(t, A.narrow(out, j * n, n), j, 0, j)]


def gather_binomial(t: Transport, inp: Any, out: Any, root: int) -> Algorithm:
    """Binomial tree: each rank collects its subtree's blocks and sends them up as one message.

    ``ceil(log2 p)`` steps and ``(p-1)/p`` of the total data into the root. Blocks
    travel in relative-rank order; a root other than 0 rotates them into ``out`` at the end.
    """
    p, r = t.size, t.rank
    n = A.numel(inp)
    if r == root:
        check_numel(out, p * n, "out")
    if p == 1 or n == 0:
        if r == root:
            copy(t, A.narrow(out, r * n, n), inp)
        return
    v, top = _tree(p, r, root)
    size = min(1 << top, p - v)
    if size == 1:
        yield send(t, inp, (v - (1 << top) + root) % p, top, r)
        return
    work = out if (v == 0 and root == 0) else scratch(t, inp, size * n)
    copy(t, A.narrow(work, 0, n), inp)
    for j in range(top):
        child = v + (1 << j)
        if child < p:
            count = min(1 << j, p - child)
            origin = (child + root) % p if count == 1 else None
            yield recv(t, A.narrow(work, (1 << j) * n, count * n), (child + root) % p, j, origin)
    if v:
        yield send(t, work, (v - (1 << top) + root) % p, top)
    elif root != 0:
        # work holds relative ranks 0 .. p-1, i.e. real ranks root .. p-1, 0 .. root-1
        copy(t, A.narrow(out, root * n, (p - root) * n), A.narrow(work, 0, (p - root) * n))
        copy(t, A.narrow(out, 0, root * n), A.narrow(work, (p - root) * n, root * n))


def scatter_linear(t: Transport, inp: Any, out: Any, root: int) -> Algorithm:
    """Linear: the root sends every rank its block directly, all in one step."""
    p, r = t.size, t.rank
    n = A.numel(out)
    if r == root:
        check_numel(inp, p * n, "inp")
        copy(t, out, A.narrow(inp, r * n, n))
    if p == 1 or n == 0:
        return
    if r != root:
        yield recv(t, out, root, 0, r)
        return
    yield [h for j in range(p) if j != root for h in send(t, A.narrow(inp, j * n, n), j, 0, j)]


def scatter_binomial(t: Transport, inp: Any, out: Any, root: int) -> Algorithm:
    """Binomial tree: each rank receives its subtree's blocks as one message and splits them.

    The mirror image of :func:`gather_binomial`: ``ceil(log2 p)`` steps, larger
    subtrees first.
    """
    p, r = t.size, t.rank
    n = A.numel(out)
    if r == root:
        check_numel(inp, p * n, "inp")
    if p == 1 or n == 0:
        if r == root:
            copy(t, out, A.narrow(inp, r * n, n))
        return
    v, top = _tree(p, r, root)
    size = min(1 << top, p - v)
    if size == 1:
        yield recv(t, out, (v - (1 << top) + root) % p, top, r)
        return
    if v == 0:
        if root == 0:
            work = inp
        else:
            work = scratch(t, inp, p * n)
            copy(t, A.narrow(work, 0, (p - root) * n), A.narrow(inp, root * n, (p - root) * n))
            copy(t, A.narrow(work, (p - root) * n, root * n), A.narrow(inp, 0, root * n))
    else:
        work = scratch(t, out, size * n)
        yield recv(t, work, (v - (1 << top) + root) % p, top)
    for j in range(top - 1, -1, -1):
        child = v + (1 << j)
        if child < p:
            count = min(1 << j, p - child)
            dest = (child + root) % p
            yield send(t, A.narrow(work, (1 << j) * n, count * n), dest, j, dest if count == 1 else None)
    copy(t, out, A.narrow(work, 0, n))
