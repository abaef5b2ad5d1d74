"""Collectives computed for every rank at once, without messages.

The simulator's ``detail="collectives"`` mode calls these once all members of a group
have arrived: each function takes per-rank lists indexed by group rank and writes the
results into the given buffers, exactly what the message-level algorithms would leave
there. Work is a handful of whole-buffer operations per rank (no per-element Python),
so thousands of ranks stay cheap. Reductions combine the ranks in rank order into one
temporary and copy it out, so every rank gets the same bits, and inputs are read in
full before any output is written (outputs may alias inputs).
"""

from __future__ import annotations

from typing import Any, Sequence

from ..core import _arrays as A
from ..core._reduce_op import ReduceOp
from ._chunks import check_counts, offsets

__all__ = [
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "gather",
    "scatter",
    "run",
]


def _reduced(bufs: Sequence[Any], op: ReduceOp) -> Any:
    """A new buffer holding ``bufs[0] op bufs[1] op ... op bufs[-1]``."""
    acc = A.empty(bufs[0], A.numel(bufs[0]))
    A.copy_(acc, bufs[0])
    for b in bufs[1:]:
        A.reduce_(acc, b, op)
    return acc


def all_reduce(bufs: Sequence[Any], op: ReduceOp) -> None:
    """Every ``bufs[i]`` becomes the reduction of all of them, in place, same bits everywhere."""
    if len(bufs) <= 1:
        return
    acc = _reduced(bufs, op)
    for b in bufs:
        A.copy_(b, acc)


def broadcast(bufs: Sequence[Any], root: int) -> None:
    """Every ``bufs[i]`` becomes a copy of ``bufs[root]``."""
    src = bufs[root]
    for i, b in enumerate(bufs):
        if i != root:
            A.copy_(b, src)


def reduce(bufs: Sequence[Any], op: ReduceOp, root: int) -> None:
    """``bufs[root]`` becomes the reduction of all ``bufs`` (in rank order); the others are unchanged."""
    if len(bufs) > 1:
        A.copy_(bufs[root], _reduced(bufs, op))


def all_gather(inps: Sequence[Any], outs: Sequence[Any]) -> None:
    """Every ``outs[i]`` becomes the concatenation of ``inps`` in rank order."""
    p = len(inps)
    n = A.numel(inps[0])
    whole = A.empty(outs[0], p * n)
    for j, x in enumerate(inps):
        A.copy_(A.narrow(whole, j * n, n), x)
    for out in outs:
        A.copy_(out, whole)


def reduce_scatter(inps: Sequence[Any], outs: Sequence[Any], counts: Sequence[int], op: ReduceOp) -> None:
    """``outs[i]`` becomes the reduction of block ``i`` (``counts[i]`` elements) of every ``inps[j]``."""
    p = len(inps)
    offs = offsets(check_counts(counts, p, "counts"))
    acc = _reduced(inps, op)
    for i, out in enumerate(outs):
        A.copy_(out, A.narrow(acc, offs[i], offs[i + 1] - offs[i]))


def all_to_all(
    inps: Sequence[Any],
    outs: Sequence[Any],
    send_counts_per_rank: Sequence[Sequence[int]],
    recv_counts_per_rank: Sequence[Sequence[int]],
) -> None:
    """Block ``j`` of ``inps[i]`` lands as block ``i`` of ``outs[j]``.

    ``send_counts_per_rank[i][j]`` is the size of block ``j`` of ``inps[i]`` and must
    equal ``recv_counts_per_rank[j][i]``. ``p^2`` block copies: at 1024 ranks this is the
    slowest one-shot collective, though still without per-element Python.

    Raises:
        ValueError: if the counts disagree.
    """
    p = len(inps)
    send = [check_counts(c, p, f"send_counts_per_rank[{i}]") for i, c in enumerate(send_counts_per_rank)]
    recv = [check_counts(c, p, f"recv_counts_per_rank[{i}]") for i, c in enumerate(recv_counts_per_rank)]
    if len(send) != p or len(recv) != p or [list(col) for col in zip(*send)] != recv:
        raise ValueError("send_counts_per_rank[i][j] must equal recv_counts_per_rank[j][i] for all ranks i, j")
    # Stage every output in one scratch buffer first, in case outputs alias inputs:
    # rank j's output starts at base[j], and its block from rank i at base[j] + recv_offs[j][i].
    recv_offs = [offsets(c) for c in recv]
    base = offsets([o[-1] for o in recv_offs])
    staged = A.empty(outs[0], base[-1])
    for i, (x, row) in enumerate(zip(inps, send)):
        src = 0
        for j, k in enumerate(row):
            if k:
                A.copy_(A.narrow(staged, base[j] + recv_offs[j][i], k), A.narrow(x, src, k))
                src += k
    for j, out in enumerate(outs):
        A.copy_(out, A.narrow(staged, base[j], base[j + 1] - base[j]))


def gather(inps: Sequence[Any], out_at_root: Any, root: int) -> None:
    """``out_at_root`` becomes the concatenation of ``inps`` in rank order."""
    n = A.numel(inps[0])
    whole = A.empty(out_at_root, len(inps) * n)
    for j, x in enumerate(inps):
        A.copy_(A.narrow(whole, j * n, n), x)
    A.copy_(out_at_root, whole)


def scatter(inp_at_root: Any, outs: Sequence[Any], root: int) -> None:
    """``outs[i]`` becomes block ``i`` of ``inp_at_root``."""
    n = A.numel(outs[0])
    whole = A.empty(inp_at_root, len(outs) * n)
    A.copy_(whole, inp_at_root)
    for i, out in enumerate(outs):
        A.copy_(out, A.narrow(whole, i * n, n))


def run(op: str, args: Sequence[Any]) -> None:
    """Every rank's result of collective ``op`` at once: ``args[i]`` is group rank ``i``'s typed tuple
    (:mod:`simdist.algorithms._args`), what its algorithm would be called with.

    ``barrier`` (and ``new_group``, a simulator's synchronisation) move no data.

    Raises:
        ValueError: ``op`` is not a collective, or the ranks' counts disagree.
    """
    first = args[0]
    if op == "all_reduce":
        all_reduce([a.buf for a in args], first.op)
    elif op == "broadcast":
        broadcast([a.buf for a in args], first.root)
    elif op == "reduce":
        reduce([a.buf for a in args], first.op, first.root)
    elif op == "all_gather":
        all_gather([a.inp for a in args], [a.out for a in args])
    elif op == "gather":
        gather([a.inp for a in args], args[first.root].out, first.root)
    elif op == "scatter":
        scatter(args[first.root].inp, [a.out for a in args], first.root)
    elif op == "reduce_scatter":
        reduce_scatter([a.inp for a in args], [a.out for a in args], first.counts, first.op)
    elif op == "all_to_all":
        all_to_all([a.inp for a in args], [a.out for a in args], [a.send for a in args], [a.recv for a in args])
    elif op not in ("barrier", "new_group"):
        raise ValueError(f"op={op!r} is not a collective that oneshot computes")
