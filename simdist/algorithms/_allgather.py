"""all_gather algorithms: ``fn(t, inp, out)``; every rank's ``out[i*n:(i+1)*n]`` gets rank ``i``'s ``inp``.

``inp`` has ``n`` elements and ``out`` has ``p * n``; ``inp`` may be a view of the
rank's own block of ``out`` (in-place all-gather) and is never written otherwise.
"""

from __future__ import annotations

from typing import Any

from ..core import _arrays as A
from ._chunks import check_numel, copy, first_of, fold, real_of, recv, scratch, send
from ._transport import Algorithm, Transport, observe

__all__ = ["ring", "recursive_doubling", "bruck"]


def _own_block(t: Transport, inp: Any, out: Any) -> tuple[int, int]:
    """Copy ``inp`` into this rank's block of ``out``; return ``(p, n)``."""
    n = A.numel(inp)
    check_numel(out, t.size * n, "out")
    copy(t, A.narrow(out, t.rank * n, n), inp)
    return t.size, n


def ring(t: Transport, inp: Any, out: Any) -> Algorithm:
    """Ring: in ``p - 1`` steps each rank passes the block it got last to its right neighbour.

    Bandwidth-optimal (each rank sends ``(p-1)/p`` of the output) and neighbour-only,
    but ``p - 1`` message latencies.
    """
    p, n = _own_block(t, inp, out)
    if p == 1 or n == 0:
        return
    r = t.rank
    right, left = (r + 1) % p, (r - 1) % p
    blocks = A.blocks(out, [n] * p)
    for step in range(p - 1):
        s, g = (r - step) % p, (r - step - 1) % p
        yield recv(t, blocks[g], left, step, g, n) + send(t, blocks[s], right, step, s, n)


def recursive_doubling(t: Transport, inp: Any, out: Any) -> Algorithm:
    """Recursive doubling: ``log2 p`` exchanges with rank ``r xor 2^k``, doubling the data held.

    Works for every ``p``: with ``rem = p - 2^floor(log2 p)``, even rank ``2i < 2 rem``
    first hands its block to ``2i + 1`` (which then holds two adjacent blocks), the
    power-of-two group exchanges contiguous block ranges, and ``2i + 1`` finally sends
    the whole output back to ``2i``: two extra steps when ``p`` is not a power of two.
    """
    p, n = _own_block(t, inp, out)
    if p == 1 or n == 0:
        return
    r = t.rank
    pof2, rem, newrank = fold(r, p)

    def blocks(lo: int, hi: int) -> Any:
        """The blocks of the original ranks that new ranks ``lo .. hi - 1`` stand for."""
        a, b = first_of(lo, rem), first_of(hi, rem)
        return A.narrow(out, a * n, (b - a) * n)

    if r < 2 * rem:
        if newrank == -1:
            yield send(t, inp, r + 1, 0, r)
        else:
            yield recv(t, A.narrow(out, (r - 1) * n, n), r - 1, 0, r - 1)
    if newrank != -1:
        lo, mask, step = newrank, 1, 1
        while mask < pof2:
            peer_new = newrank ^ mask
            theirs = lo ^ mask
            yield recv(t, blocks(theirs, theirs + mask), real_of(peer_new, rem), step) + send(
                t, blocks(lo, lo + mask), real_of(peer_new, rem), step
            )
            lo, mask, step = min(lo, theirs), mask << 1, step + 1
    if r < 2 * rem:
        tag = pof2.bit_length()
        if newrank == -1:
            yield recv(t, out, r + 1, tag)
        else:
            yield send(t, out, r - 1, tag)


def bruck(t: Transport, inp: Any, out: Any) -> Algorithm:
    """Bruck: ``ceil(log2 p)`` steps for every ``p``; step ``k`` sends the blocks held so far
    to rank ``r - 2^k`` and receives as many from ``r + 2^k``.

    Rank ``r`` collects the blocks of ranks ``r, r+1, ...`` in that order in a scratch
    buffer (the filled part is its observed working data), then rotates them into place.
    Latency-optimal for short messages at any ``p``.
    """
    p, n = t.size, A.numel(inp)
    r = t.rank
    check_numel(out, p * n, "out")
    if p == 1 or n == 0:
        copy(t, A.narrow(out, r * n, n), inp)
        return
    work = out if r == 0 else scratch(t, out, p * n)
    copy(t, A.narrow(work, 0, n), inp)
    observe(t, A.narrow(work, 0, n))
    dist, step = 1, 0
    while dist < p:
        count = min(dist, p - dist)
        yield recv(t, A.narrow(work, dist * n, count * n), (r + dist) % p, step) + send(
            t, A.narrow(work, 0, count * n), (r - dist) % p, step
        )
        observe(t, A.narrow(work, 0, (dist + count) * n))
        dist, step = dist << 1, step + 1
    if r:
        # work[i] is rank (r + i) % p's block
        copy(t, A.narrow(out, r * n, (p - r) * n), A.narrow(work, 0, (p - r) * n))
        copy(t, A.narrow(out, 0, r * n), A.narrow(work, (p - r) * n, r * n))
