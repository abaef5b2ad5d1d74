"""all_reduce algorithms: ``fn(t, buf, op)`` reduces ``buf`` across the group, in place.

Every rank ends with the same bits: each element's result is either computed on one
rank and copied to the others (ring, Rabenseifner, binomial, hierarchical), or computed by every rank
from the same partial results in the same order, lower ranks on the left
(recursive doubling).
"""

from __future__ import annotations

from typing import Any

from ..core import _arrays as A
from ..core._reduce_op import ReduceOp
from ._broadcast import binomial_tree_bcast
from ._chunks import (
    PIECE_BYTES,
    SEGMENT_BYTES,
    WINDOW,
    ceil_log2,
    chunk_bounds,
    chunk_lengths,
    combine,
    copy,
    floor_log2,
    fold,
    pieces,
    real_of,
    recv,
    scratch,
    segment,
    segment_grid,
    send,
)
from ._rooted import binomial_tree_reduce
from ._transport import Algorithm, Subgroup, Transport, machines, pipelined

__all__ = ["ring", "ring_pipelined", "recursive_doubling", "rabenseifner", "binomial", "hierarchical"]


def ring(t: Transport, buf: Any, op: ReduceOp) -> Algorithm:
    """Ring: a reduce-scatter around the ring, then an all-gather around the ring.

    ``buf`` is split into ``p`` chunks (:func:`chunk_bounds`). In ``p - 1`` steps each
    chunk travels once around the ring collecting every rank's contribution; rank ``r``
    then holds the finished chunk ``r + 1`` and ``p - 1`` more steps pass the finished
    chunks on. Bandwidth-optimal: each rank sends ``2 (p-1)/p`` of the buffer.
    """
    n = A.numel(buf)
    if t.size == 1 or n == 0:
        return
    blocks, lengths = _ring_blocks(buf, n, t.size)
    yield from _ring_reduce_scatter(t, buf, blocks, lengths, op)
    yield from _ring_all_gather(t, blocks, lengths)


def _ring_blocks(buf: Any, n: int, p: int) -> tuple[list, list[int]]:
    """``buf``'s ``p`` chunks (views) and their lengths; the chunks past the first ``n`` are empty and share one view."""
    lengths = chunk_lengths(n, p)
    full = min(n, p)
    return A.blocks(buf, lengths[:full]) + [A.narrow(buf, n, 0)] * (p - full), lengths


def _ring_reduce_scatter(t: Transport, buf: Any, blocks: list, lengths: list[int], op: ReduceOp) -> Algorithm:
    """The ring's first ``p - 1`` steps (tags ``0 .. p-2``): rank ``r`` ends with chunk ``r + 1`` reduced."""
    p, r = t.size, t.rank
    tmp = scratch(t, buf, lengths[0])
    # chunks differ by one element at most: the two views of ``tmp`` that receive them
    into = {lengths[0]: tmp, lengths[-1]: A.narrow(tmp, 0, lengths[-1])}
    right, left = (r + 1) % p, (r - 1) % p
    # A step whose two chunks are empty (most steps when n < p) posts nothing, but is a step.
    for step in range(p - 1):
        out, inc = (r - step) % p, (r - step - 1) % p
        if not (lengths[inc] or lengths[out]):
            yield []
            continue
        incoming = into[lengths[inc]]
        yield recv(t, incoming, left, step, inc, lengths[inc]) + send(t, blocks[out], right, step, out, lengths[out])
        if lengths[inc]:
            combine(t, blocks[inc], incoming, op)


def _ring_all_gather(t: Transport, blocks: list, lengths: list[int]) -> Algorithm:
    """The ring's last ``p - 1`` steps (tags ``p-1 .. 2p-3``): rank ``r``'s chunk ``r + 1`` goes to every rank."""
    p, r = t.size, t.rank
    right, left = (r + 1) % p, (r - 1) % p
    for step in range(p - 1):
        out, inc = (r + 1 - step) % p, (r - step) % p
        if not (lengths[inc] or lengths[out]):
            yield []
            continue
        tag = p - 1 + step
        yield recv(t, blocks[inc], left, tag, inc, lengths[inc]) + send(t, blocks[out], right, tag, out, lengths[out])


def ring_pipelined(
    t: Transport, buf: Any, op: ReduceOp, *, segment_bytes: int = SEGMENT_BYTES, window: int = WINDOW
) -> Algorithm:
    """Pipelined ring: :func:`ring`'s messages cut into segments of about ``segment_bytes``,
    each segment forwarded as soon as it is reduced (or, in the all-gather, received).

    Same paths, partial sums and results as :func:`ring`, but receiving segment ``k + 1``
    overlaps reducing segment ``k``, and a step starts before the previous one ends.
    Step ``g`` (``0 .. 2p-3``) receives block ``r - g - 1`` from the left and step
    ``g + 1`` sends it on. The reduce-scatter's segments arrive in ``window`` rotating
    scratch slots (receives posted ``window`` segments ahead), so the scratch is
    ``window`` segments, not a block: less fresh memory to fault in on every call (a
    64 MiB float32 buffer costs about 20 ms of page faults on first touch). The
    all-gather's receives, straight into ``buf``, are posted a step ahead; one overwrites
    a block this rank sent in the reduce-scatter only with a result that needed those
    bytes, so that send has completed by then.
    """
    p, r = t.size, t.rank
    n = A.numel(buf)
    if p == 1 or n == 0:
        return
    bounds = chunk_bounds(n, p)
    blocks = [A.narrow(buf, s, k) for s, k in bounds]
    width, parts = segment_grid(bounds[0][1], A.itemsize(buf), segment_bytes)
    reducing = (p - 1) * parts  # reduce-scatter segments, numbered i = g * parts + k
    ahead = max(1, min(window, reducing))
    slots = scratch(t, buf, ahead * width)
    right, left, last = (r + 1) % p, (r - 1) % p, 2 * (p - 1) - 1

    def seg(g: int, k: int) -> Any:
        """Segment ``k`` of the block that step ``g`` receives."""
        return segment(blocks[(r - g - 1) % p], k, width)

    def slot(i: int) -> Any:
        """Where reduce-scatter segment ``i`` arrives."""
        return A.narrow(slots, i % ahead * width, A.numel(seg(*divmod(i, parts))))

    def post_slot(i: int) -> list:
        return recv(t, slot(i), left, i // parts, (r - i // parts - 1) % p)

    def post_blocks(g: int) -> list[list]:
        return [recv(t, seg(g, k), left, g, (r - g - 1) % p) for k in range(parts)]

    pending: dict[int | tuple[int, int], list] = {i: post_slot(i) for i in range(ahead)}  # by segment or (g, k)
    sends = [h for k in range(parts) for h in send(t, segment(blocks[r], k, width), right, 0, r)]
    for g in range(last + 1):
        if p - 2 <= g < last:
            pending.update({(g + 1, k): hs for k, hs in enumerate(post_blocks(g + 1))})
        for k in range(parts):
            i = g * parts + k
            if g < p - 1:
                yield pending.pop(i)
                combine(t, seg(g, k), slot(i), op)
                if i + ahead < reducing:
                    pending[i + ahead] = post_slot(i + ahead)
            else:
                yield pending.pop((g, k))
            if g < last:
                sends += send(t, seg(g, k), right, g + 1, (r - g - 1) % p)
    yield sends


def _fold_in(t: Transport, buf: Any, tmp: Any, op: ReduceOp, rem: int, newrank: int) -> Algorithm:
    """Non-power-of-two start (see :func:`fold`): rank ``2i`` hands ``buf`` to ``2i + 1``."""
    if t.rank < 2 * rem:
        if newrank == -1:
            yield send(t, buf, t.rank + 1, 0)
        else:
            yield recv(t, tmp, t.rank - 1, 0)
            _reduce_left(t, buf, tmp, op)


def _fold_out(t: Transport, buf: Any, rem: int, newrank: int, tag: int) -> Algorithm:
    """Non-power-of-two end: rank ``2i + 1`` hands the result back to rank ``2i``."""
    if t.rank < 2 * rem:
        if newrank == -1:
            yield recv(t, buf, t.rank + 1, tag)
        else:
            yield send(t, buf, t.rank - 1, tag)


def _reduce_left(t: Transport, buf: Any, lower: Any, op: ReduceOp) -> None:
    """``buf = lower (op) buf``: the lower rank's data as the left operand."""
    combine(t, lower, buf, op)
    copy(t, buf, lower)


def recursive_doubling(t: Transport, buf: Any, op: ReduceOp) -> Algorithm:
    """Recursive doubling: ``log2 p`` exchanges of the whole buffer with rank ``r xor 2^k``.

    Latency-optimal for short messages. Both partners combine ``lower (op) upper``, so
    every rank computes bit-identical results. For ``p`` not a power of two the first
    ``2 * rem`` ranks fold pairwise first and get the result back at the end
    (``rem = p - 2^floor(log2 p)``): two extra steps.
    """
    p, r = t.size, t.rank
    n = A.numel(buf)
    if p == 1 or n == 0:
        return
    pof2, rem, newrank = fold(r, p)
    tmp = scratch(t, buf, n)
    yield from _fold_in(t, buf, tmp, op, rem, newrank)
    if newrank != -1:
        mask, step = 1, 1
        while mask < pof2:
            peer_new = newrank ^ mask
            peer = real_of(peer_new, rem)
            yield recv(t, tmp, peer, step) + send(t, buf, peer, step)
            if peer_new < newrank:
                _reduce_left(t, buf, tmp, op)
            else:
                combine(t, buf, tmp, op)
            mask, step = mask << 1, step + 1
    yield from _fold_out(t, buf, rem, newrank, tag=floor_log2(p) + 1)


def rabenseifner(t: Transport, buf: Any, op: ReduceOp) -> Algorithm:
    """Rabenseifner: reduce-scatter by recursive halving, then all-gather by recursive doubling.

    Step ``k`` of the halving exchanges half of the remaining range with rank
    ``r xor 2^(K-1-k)``; after ``log2 p`` steps each rank owns one finished chunk, and
    the doubling steps gather the chunks back. Each rank sends about
    ``2 (p-1)/p`` of the buffer in ``2 log2 p`` messages. For ``p`` not a power of two
    the first ``2 * rem`` ranks fold pairwise first (whole buffer) and receive the
    result at the end, as in :func:`recursive_doubling`.
    """
    p, r = t.size, t.rank
    n = A.numel(buf)
    if p == 1 or n == 0:
        return
    pof2, rem, newrank = fold(r, p)
    tmp = scratch(t, buf, n)
    yield from _fold_in(t, buf, tmp, op, rem, newrank)
    if newrank != -1:
        bounds = chunk_bounds(n, pof2)

        def span(lo: int, hi: int) -> Any:
            start = bounds[lo][0]
            return A.narrow(buf, start, bounds[hi - 1][0] + bounds[hi - 1][1] - start)

        lo, hi, step = 0, pof2, 1
        mask = pof2 >> 1
        while mask:
            peer = real_of(newrank ^ mask, rem)
            mid = lo + mask
            if newrank & mask:
                give, keep, lo = span(lo, mid), span(mid, hi), mid
            else:
                give, keep, hi = span(mid, hi), span(lo, mid), mid
            incoming = A.narrow(tmp, 0, A.numel(keep))
            yield recv(t, incoming, peer, step) + send(t, give, peer, step)
            if A.numel(keep):
                combine(t, keep, incoming, op)
            mask, step = mask >> 1, step + 1
        mask = 1
        while mask < pof2:
            peer_new = newrank ^ mask
            peer = real_of(peer_new, rem)
            theirs_lo = lo ^ mask
            chunk = lo if mask == 1 else None
            yield (
                recv(t, span(theirs_lo, theirs_lo + mask), peer, step, theirs_lo if mask == 1 else None)
                + send(t, span(lo, hi), peer, step, chunk)
            )
            lo, hi = min(lo, theirs_lo), min(lo, theirs_lo) + 2 * mask
            mask, step = mask << 1, step + 1
    yield from _fold_out(t, buf, rem, newrank, tag=2 * floor_log2(p) + 1)


def binomial(t: Transport, buf: Any, op: ReduceOp) -> Algorithm:
    """Binomial tree: reduce to rank 0 in ``ceil(log2 p)`` steps, then broadcast from rank 0.

    The whole buffer travels at every step, so this suits short messages; the result is
    computed once, at rank 0, so every rank gets the same bits.
    """
    if t.size == 1 or A.numel(buf) == 0:
        return
    yield from binomial_tree_reduce(t, buf, op, 0, in_place=True, tag=0)
    yield from binomial_tree_bcast(t, buf, 0, tag=ceil_log2(t.size))


def hierarchical(
    t: Transport,
    buf: Any,
    op: ReduceOp,
    *,
    segment_bytes: int = SEGMENT_BYTES,
    window: int = WINDOW,
    piece_bytes: int = PIECE_BYTES,
) -> Algorithm:
    """Two levels: a ring reduce-scatter among the ranks of each machine, an all_reduce of each
    rank's share across the machines (:func:`ring_pipelined` among the ranks with the same place
    on their machines), then a ring all-gather within each machine; the buffer cut into
    :func:`~._chunks.pieces` that go through these phases one after another, overlapping.

    On ``H`` machines of ``k`` ranks, a machine's link carries ``2 (H-1)/H`` of the buffer each
    way, where a ring over all ``p = k·H`` ranks in rank order carries ``2 (p-1)/p`` (1.0 against
    1.5 times the buffer at 2 machines of 2): the ``k`` shares cross it at once, one per rank.
    Every rank still sends ``2 (p-1)/p`` of the buffer in all. Piece ``i + 1``'s reduce-scatter and
    piece ``i - 1``'s all-gather run beside piece ``i``'s phase across the machines
    (:func:`pipelined`), so the links between machines are not left idle while the ranks of a machine
    exchange (only the first piece's reduce-scatter and the last one's all-gather run alone). The machines are the
    transport's ``hosts`` (see :func:`machines`); where it gives none, or machines of unequal size
    or of one rank, this is :func:`ring_pipelined` over the whole group. Each element's result is
    computed on one rank and copied to the others, so every rank gets the same bits.
    """
    n = A.numel(buf)
    if t.size == 1 or n == 0:
        return
    groups = machines(getattr(t, "hosts", None), t.size)
    if groups is None:
        yield from ring_pipelined(t, buf, op, segment_bytes=segment_bytes, window=window)
        return
    mine = next(g for g in groups if t.rank in g)
    k, place = len(mine), mine.index(t.rank)
    share = (place + 1) % k  # the block this rank finished, as did the rank at its place on every machine
    tags = 2 * k + 2 * (len(groups) - 1)  # a piece's: within the machines from 0, across them from 2k

    def phases(view: Any, first_tag: int) -> list[Algorithm]:
        inside = Subgroup(t, mine, tag_base=first_tag)
        across = Subgroup(t, [g[place] for g in groups], tag_base=first_tag + 2 * k)
        blocks, lengths = _ring_blocks(view, A.numel(view), k)
        return [
            _ring_reduce_scatter(inside, view, blocks, lengths, op),
            ring_pipelined(across, blocks[share], op, segment_bytes=segment_bytes, window=window),
            _ring_all_gather(inside, blocks, lengths),
        ]

    views = [A.narrow(buf, start, m) for start, m in chunk_bounds(n, pieces(A.nbytes(buf), piece_bytes))]
    yield from pipelined([phases(v, i * tags) for i, v in enumerate(views)])
