"""all_to_all algorithms: ``fn(t, inp, out, send_counts, recv_counts)``.

``inp`` holds ``p`` blocks in rank order, block ``j`` (``send_counts[j]`` elements)
going to rank ``j``; ``out`` holds ``p`` blocks, block ``j`` (``recv_counts[j]``
elements) coming from rank ``j``. Rank ``i``'s ``send_counts[j]`` must equal rank
``j``'s ``recv_counts[i]``. ``inp`` is never written.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..core import _arrays as A
from ._chunks import check_counts, copy, offsets, recv, scratch, send
from ._transport import Algorithm, Transport, observe

__all__ = ["pairwise", "bruck", "direct"]


def _blocks(t: Transport, buf: Any, counts: Sequence[int], argname: str) -> list[Any]:
    counts = check_counts(counts, t.size, argname)
    offs = offsets(counts)
    bufname = "inp" if argname == "send_counts" else "out"
    if A.numel(buf) != offs[-1]:
        raise ValueError(f"{bufname} has {A.numel(buf)} elements but sum({argname}) is {offs[-1]}")
    return A.blocks(buf, counts)


def direct(t: Transport, inp: Any, out: Any, send_counts: Sequence[int], recv_counts: Sequence[int]) -> Algorithm:
    """Direct: post every send and receive at once and wait for all (one step).

    Lets the transport overlap all ``p - 1`` exchanges; good for medium messages.
    """
    sends = _blocks(t, inp, send_counts, "send_counts")
    recvs = _blocks(t, out, recv_counts, "recv_counts")
    r = t.rank
    copy(t, recvs[r], sends[r])
    handles = []
    for step in range(1, t.size):
        dst, src = (r + step) % t.size, (r - step) % t.size
        handles += recv(t, recvs[src], src, 0, src) + send(t, sends[dst], dst, 0, r)
    if handles:
        yield handles


def pairwise(t: Transport, inp: Any, out: Any, send_counts: Sequence[int], recv_counts: Sequence[int]) -> Algorithm:
    """Pairwise exchange: at step ``s`` send to rank ``r + s`` and receive from ``r - s``.

    ``p - 1`` steps with one message each way; no data is forwarded, so uneven counts
    cost nothing extra. The usual choice for long messages.
    """
    sends = _blocks(t, inp, send_counts, "send_counts")
    recvs = _blocks(t, out, recv_counts, "recv_counts")
    p, r = t.size, t.rank
    copy(t, recvs[r], sends[r])
    if A.numel(inp) == 0 and A.numel(out) == 0:
        return
    for step in range(1, p):
        dst, src = (r + step) % p, (r - step) % p
        yield recv(t, recvs[src], src, step, src) + send(t, sends[dst], dst, step, r)


def bruck(t: Transport, inp: Any, out: Any, send_counts: Sequence[int], recv_counts: Sequence[int]) -> Algorithm:
    """Bruck: ``ceil(log2 p)`` steps; step ``k`` forwards every block whose distance has bit ``k`` set.

    Rank ``r`` first rotates its blocks so that position ``i`` holds the block for rank
    ``r + i``; at step ``k`` it packs the positions with bit ``k`` set, sends them to
    ``r + 2^k`` and unpacks what ``r - 2^k`` sent into the same positions. Position
    ``i`` then holds rank ``r - i``'s block for ``r``, and a local rotation puts the
    blocks in place. About ``log2 p / 2`` of the data per step: latency-optimal, for
    short messages. The slots are the rank's observed working data (:func:`observe`).

    Raises:
        ValueError: if the counts are not all equal (Bruck moves fixed-size blocks).
    """
    p, r = t.size, t.rank
    send_counts = check_counts(send_counts, p, "send_counts")
    recv_counts = check_counts(recv_counts, p, "recv_counts")
    m = send_counts[0]
    if any(c != m for c in send_counts) or any(c != m for c in recv_counts):
        raise ValueError(
            "all_to_all algorithm 'bruck' needs equal counts for every rank; got "
            f"send_counts={send_counts!r:.80}, recv_counts={recv_counts!r:.80} "
            "(use 'pairwise' or 'direct' for uneven counts)"
        )
    sends = _blocks(t, inp, send_counts, "send_counts")
    recvs = _blocks(t, out, recv_counts, "recv_counts")
    if p == 1 or m == 0:
        copy(t, recvs[r], sends[r])
        return
    work = scratch(t, inp, p * m)
    slot = [A.narrow(work, i * m, m) for i in range(p)]
    for i in range(p):
        copy(t, slot[i], sends[(r + i) % p])
    observe(t, work)
    half = (p + 1) // 2 * m
    packed, unpacked = scratch(t, inp, half), scratch(t, inp, half)
    dist, step = 1, 0
    while dist < p:
        moving = [i for i in range(p) if i & dist]
        for k, i in enumerate(moving):
            copy(t, A.narrow(packed, k * m, m), slot[i])
        size = len(moving) * m
        yield recv(t, A.narrow(unpacked, 0, size), (r - dist) % p, step) + send(
            t, A.narrow(packed, 0, size), (r + dist) % p, step
        )
        for k, i in enumerate(moving):
            copy(t, slot[i], A.narrow(unpacked, k * m, m))
        observe(t, work)
        dist, step = dist << 1, step + 1
    for i in range(p):
        copy(t, recvs[(r - i) % p], slot[i])
