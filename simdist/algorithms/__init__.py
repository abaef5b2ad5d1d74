"""Collective algorithms, written once against a :class:`Transport`, shared by the backends.

Each algorithm is a generator function that posts ``t.isend``/``t.irecv`` and yields
the handles it waits on (see :mod:`simdist.algorithms._transport`). Look one up by
collective and name, or let :func:`choose` pick one::

    fn = get("all_reduce", choose("all_reduce", nbytes, size))
    run_blocking(fn(transport, buf, ReduceOp.SUM), transport)

Signatures, per collective (``t`` the transport, buffers flat, ranks group ranks):

=============== ====================================== =====================================
op              call                                   algorithms
=============== ====================================== =====================================
all_reduce      ``fn(t, buf, op)``                     ring, ring_pipelined,
                                                       recursive_doubling,
                                                       rabenseifner, binomial,
                                                       hierarchical
broadcast       ``fn(t, buf, root)``                   binomial, scatter_allgather,
                                                       chain_pipelined
reduce          ``fn(t, buf, op, root)``               binomial, linear
all_gather      ``fn(t, inp, out)``                    ring, recursive_doubling, bruck
reduce_scatter  ``fn(t, inp, out, counts, op)``        ring, ring_pipelined, pairwise,
                                                       recursive_halving
all_to_all      ``fn(t, inp, out, send_counts,         pairwise, bruck, direct
                recv_counts)``
gather          ``fn(t, inp, out, root)``              linear, binomial
scatter         ``fn(t, inp, out, root)``              linear, binomial
barrier         ``fn(t, scratch)``                     dissemination
=============== ====================================== =====================================

Every algorithm works for any group size and element count, never writes an input
that is not also its output, and leaves bit-identical results on every rank that
holds one. ``op`` is never ``ReduceOp.AVG``: callers sum, then divide.
:mod:`simdist.algorithms.oneshot` computes the same results for all ranks at once.

Algorithms compose: :class:`Subgroup` runs one on some of a transport's ranks (the phases of
the two-level ``hierarchical``), :func:`together` runs several side by side in lockstep, and
:func:`pipelined` runs pieces through the same phases with each piece's next phase beside the
next piece's phase before it (``hierarchical``'s pieces from 16 MiB).
"""

from __future__ import annotations

from . import oneshot as oneshot
from ._algorithmic import AlgorithmicGroup as AlgorithmicGroup
from ._algorithmic import CollectiveCall as CollectiveCall
from ._chunks import chunk_bounds as chunk_bounds
from ._select import ACROSS_MACHINES_BYTES as ACROSS_MACHINES_BYTES
from ._select import ALGORITHMS as ALGORITHMS
from ._select import FORMULAS as FORMULAS
from ._select import choose as choose
from ._select import cost as cost
from ._select import get as get
from ._transport import Algorithm as Algorithm
from ._transport import Handle as Handle
from ._transport import Lender as Lender
from ._transport import Observer as Observer
from ._transport import Subgroup as Subgroup
from ._transport import Timed as Timed
from ._transport import Transport as Transport
from ._transport import machines as machines
from ._transport import run_blocking as run_blocking
from ._transport import pipelined as pipelined
from ._transport import together as together

__all__ = [
    "ACROSS_MACHINES_BYTES",
    "ALGORITHMS",
    "AlgorithmicGroup",
    "CollectiveCall",
    "FORMULAS",
    "Algorithm",
    "Handle",
    "Lender",
    "Observer",
    "Subgroup",
    "Timed",
    "Transport",
    "choose",
    "chunk_bounds",
    "cost",
    "get",
    "machines",
    "oneshot",
    "run_blocking",
    "pipelined",
    "together",
]
