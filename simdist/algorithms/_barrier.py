"""barrier algorithms: ``fn(t, scratch)`` returns on a rank only once every rank has entered."""

from __future__ import annotations

from typing import Any

from ..core import _arrays as A
from ._transport import Algorithm, Transport

__all__ = ["dissemination"]


def dissemination(t: Transport, scratch: Any) -> Algorithm:
    """Dissemination (Hensgen, Finkel & Manber): ``ceil(log2 p)`` rounds of empty messages.

    In round ``k`` rank ``r`` signals ``r + 2^k`` and waits for ``r - 2^k``; after the
    last round every rank has heard, directly or not, from every other. The messages
    are zero-length views of ``scratch``, which is never written.
    """
    p, r = t.size, t.rank
    token = A.narrow(scratch, 0, 0)
    dist, step = 1, 0
    while dist < p:
        yield [
            t.irecv(A.narrow(scratch, 0, 0), (r - dist) % p, step),
            t.isend(token, (r + dist) % p, step),
        ]
        dist, step = dist << 1, step + 1
