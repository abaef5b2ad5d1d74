"""reduce_scatter algorithms: ``fn(t, inp, out, counts, op)``.

``inp`` holds ``p`` blocks, block ``j`` of ``counts[j]`` elements, in rank order; rank
``r``'s ``out`` (``counts[r]`` elements) gets the reduction over all ranks of block
``r``. Counts may differ between blocks (and be 0). ``inp`` is never written, except
where ``out`` is a view of it (in-place reduce-scatter: ``out`` is block ``r`` of
``inp``). Each block's result is computed on one rank only.

The partial sums travel in scratch, so the algorithms that forward them :func:`observe`
them in the input's layout: a rank's working data is its partial sum of every block
(its own input where nothing was reduced in yet).
"""

from __future__ import annotations

from typing import Any, Sequence

from ..core import _arrays as A
from ..core._reduce_op import ReduceOp
from ._chunks import (
    SEGMENT_BYTES,
    WINDOW,
    check_counts,
    combine,
    copy,
    first_of,
    fold,
    offsets,
    real_of,
    recv,
    scratch,
    segment,
    segment_grid,
    send,
)
from ._transport import Algorithm, Transport, observe

__all__ = ["ring", "ring_pipelined", "pairwise", "recursive_halving"]


def _setup(t: Transport, inp: Any, counts: Sequence[int]) -> tuple[list[int], list[int], list[Any]]:
    counts = check_counts(counts, t.size, "counts")
    offs = offsets(counts)
    if A.numel(inp) != offs[-1]:
        raise ValueError(f"inp has {A.numel(inp)} elements but sum(counts) is {offs[-1]}")
    return counts, offs, A.blocks(inp, counts)


def ring(t: Transport, inp: Any, out: Any, counts: Sequence[int], op: ReduceOp) -> Algorithm:
    """Ring: each block travels once around the ring, collecting contributions, ending at its owner.

    At step ``s`` rank ``r`` sends its partial sum of block ``r - s - 1`` to the right
    and receives the partial sum of block ``r - s - 2`` from the left; ``p - 1`` steps,
    ``(p-1)/p`` of the input sent per rank, neighbour-only traffic.
    """
    counts, offs, blocks = _setup(t, inp, counts)
    p, r = t.size, t.rank
    if p == 1:
        copy(t, out, blocks[0])
        return
    if offs[-1] == 0:
        return
    width = max(counts)
    bufs = [scratch(t, inp, width), scratch(t, inp, width)]  # partial sums, alternately
    right, left = (r + 1) % p, (r - 1) % p
    outgoing = blocks[(r - 1) % p]
    observe(t, inp)
    for step in range(p - 1):
        s, g = (r - step - 1) % p, (r - step - 2) % p
        incoming = A.narrow(bufs[step % 2], 0, counts[g])
        yield recv(t, incoming, left, step, g) + send(t, outgoing, right, step, s)
        combine(t, incoming, blocks[g], op)
        observe(t, incoming, offs[g])
        outgoing = incoming
    copy(t, out, outgoing)  # block r, finished (``out`` may be a view of ``inp``)


def ring_pipelined(
    t: Transport,
    inp: Any,
    out: Any,
    counts: Sequence[int],
    op: ReduceOp,
    *,
    segment_bytes: int = SEGMENT_BYTES,
    window: int = WINDOW,
) -> Algorithm:
    """Pipelined ring: :func:`ring`'s messages cut into segments of about ``segment_bytes``,
    each partial sum forwarded as soon as it is reduced.

    Same paths, partial sums and results as :func:`ring`; receiving segment ``k + 1``
    overlaps reducing segment ``k``, and a step starts before the previous one ends.
    Segment ``i = s * parts + k`` of the partial sums arrives in one of ``parts + window``
    rotating scratch slots (one block and ``window`` segments) and is sent on from there;
    its send is waited on one step later (the right neighbour has posted that receive by
    then whatever the schedule), and its slot then takes segment ``i + parts + window``.
    """
    counts, offs, blocks = _setup(t, inp, counts)
    p, r = t.size, t.rank
    if p == 1:
        copy(t, out, blocks[0])
        return
    if offs[-1] == 0:
        return
    width, parts = segment_grid(max(counts), A.itemsize(inp), segment_bytes)
    total, lag = (p - 1) * parts, parts
    nslots = min(window + lag, total)
    slots = scratch(t, inp, nslots * width)
    right, left = (r + 1) % p, (r - 1) % p

    def landing(i: int) -> Any:
        """Slot of segment ``i`` (of block ``r - s - 2``, ``s = i // parts``), cut to the segment."""
        s, k = divmod(i, parts)
        length = A.numel(segment(blocks[(r - s - 2) % p], k, width))
        return A.narrow(slots, i % nslots * width, length)

    def post(i: int) -> list:
        return recv(t, landing(i), left, i // parts, (r - i // parts - 2) % p)

    observe(t, inp)
    pending = {i: post(i) for i in range(nslots)}
    first = (r - 1) % p
    sends = [h for k in range(parts) for h in send(t, segment(blocks[first], k, width), right, 0, first)]
    forwarded: dict[int, list] = {}
    for i in range(total):
        s, k = divmod(i, parts)
        g, old = (r - s - 2) % p, i - lag
        yield pending.pop(i) + forwarded.pop(old, [])
        if old >= 0 and old + nslots < total:
            pending[old + nslots] = post(old + nslots)  # into old's slot, whose send is done
        incoming = landing(i)
        combine(t, incoming, segment(blocks[g], k, width), op)
        observe(t, incoming, offs[g] + k * width)
        if s + 1 < p - 1:
            forwarded[i] = send(t, incoming, right, s + 1, g)
        else:
            copy(t, segment(out, k, width), incoming)  # block r, finished (``out`` may be a view of ``inp``)
    yield sends + [h for hs in forwarded.values() for h in hs]


def pairwise(t: Transport, inp: Any, out: Any, counts: Sequence[int], op: ReduceOp) -> Algorithm:
    """Pairwise exchange: at step ``s`` rank ``r`` sends block ``r + s`` to its owner and
    receives its own block from rank ``r - s``; ``p - 1`` steps, no forwarding.
    """
    counts, offs, blocks = _setup(t, inp, counts)
    p, r = t.size, t.rank
    copy(t, out, blocks[r])
    if p == 1 or offs[-1] == 0:
        return
    tmp = scratch(t, inp, counts[r])
    for step in range(1, p):
        dst, src = (r + step) % p, (r - step) % p
        yield recv(t, tmp, src, step, r) + send(t, blocks[dst], dst, step, dst)
        if counts[r]:
            combine(t, out, tmp, op)


def recursive_halving(t: Transport, inp: Any, out: Any, counts: Sequence[int], op: ReduceOp) -> Algorithm:
    """Recursive halving: ``log2 p`` exchanges with rank ``r xor 2^(K-1-k)``, halving the
    blocks still held and reducing the half kept.

    For ``p`` not a power of two, even rank ``2i < 2 rem`` (``rem = p - 2^floor(log2 p)``)
    first hands its whole input to ``2i + 1``, which then stands for both blocks and at
    the end sends block ``2i``'s result back: two extra steps.
    """
    counts, offs, blocks = _setup(t, inp, counts)
    p, r = t.size, t.rank
    if p == 1:
        copy(t, out, blocks[0])
        return
    total = offs[-1]
    if total == 0:
        return
    pof2, rem, newrank = fold(r, p)
    acc = scratch(t, inp, total if newrank != -1 else 0)
    tmp = scratch(t, inp, total if newrank != -1 else 0)

    def span(buf: Any, lo: int, hi: int) -> Any:
        """The blocks of the original ranks that new ranks ``lo .. hi - 1`` stand for."""
        a, b = offs[first_of(lo, rem)], offs[first_of(hi, rem)]
        return A.narrow(buf, a, b - a)

    if newrank != -1:
        copy(t, acc, inp)
    observe(t, inp)
    if r < 2 * rem:
        if newrank == -1:
            yield send(t, inp, r + 1, 0)
        else:
            yield recv(t, tmp, r - 1, 0)
            combine(t, acc, tmp, op)
            observe(t, acc)
    if newrank != -1:
        lo, hi, step = 0, pof2, 1
        mask = pof2 >> 1
        while mask:
            peer = real_of(newrank ^ mask, rem)
            mid = lo + mask
            if newrank & mask:
                give, keep, lo = (lo, mid), (mid, hi), mid
            else:
                give, keep, hi = (mid, hi), (lo, mid), mid
            kept = span(acc, *keep)
            incoming = A.narrow(tmp, 0, A.numel(kept))
            yield recv(t, incoming, peer, step) + send(t, span(acc, *give), peer, step)
            combine(t, kept, incoming, op)
            observe(t, acc)
            mask, step = mask >> 1, step + 1
        # new rank ``lo`` now holds the results for original ranks first_of(lo) .. r
        copy(t, out, A.narrow(acc, offs[r], counts[r]))
    if r < 2 * rem:
        tag = pof2.bit_length()
        if newrank == -1:
            yield recv(t, out, r + 1, tag, r)
            observe(t, out, offs[r])
        else:
            yield send(t, A.narrow(acc, offs[r - 1], counts[r - 1]), r - 1, tag, r - 1)
