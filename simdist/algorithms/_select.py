"""The algorithm registry, the automatic choice and the alpha-beta cost model.

Sizes: ``nbytes`` is always the largest per-rank buffer of the operation, as in
Thakur, Rabenseifner & Gropp (2005), "Optimization of collective communication
operations in MPICH":

- all_reduce, broadcast, reduce: the buffer;
- all_gather: the output (``p`` blocks); reduce_scatter and all_to_all: the input
  (``p`` blocks); gather: the root's output; scatter: the root's input;
- barrier: ignored.

Cost symbols: ``p`` ranks, ``n`` = nbytes, ``α`` seconds per message, ``β`` seconds per
byte, ``γ`` seconds per byte reduced (default 0), ``⌈lg p⌉``/``⌊lg p⌋`` the rounded
base-2 logarithms, ``p' = 2^⌊lg p⌋`` and ``e = 0`` if ``p`` is a power of two, else 1
(the two extra folding steps of the recursive doubling/halving algorithms), ``S`` the
segments per block of the pipelined algorithms: ``max(1, ⌈n/(p·s)⌉)`` with ``s`` =
``SEGMENT_BYTES`` (reducing a segment overlaps receiving the next, so a ``1/S`` share of the
reduction shows; with ``S = 1`` they cost what the plain ring does), and ``C = max(1, ⌈n/c⌉)``
the segments of the pipelined chain, ``c`` = ``CHAIN_SEGMENT_BYTES``, ``k`` ranks on each of
``H`` machines (``hierarchical`` only; ``k = 1``, ``H = p`` where the machines are not known or
differ in size, as there the algorithm is the pipelined ring), and ``P`` the pieces of the
hierarchical all_reduce: ``min(PIECES, max(1, ⌊n/q⌋))`` with ``q`` = ``PIECE_BYTES`` where machines
hold several ranks, else 1 (each piece's ``⌈S/P⌉`` segments a block). Costs
count the critical path of the algorithm as implemented here, assuming every rank can
send and receive one message at a time; on one rank every cost is 0.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from . import _allgather, _allreduce, _alltoall, _barrier, _broadcast, _reduce_scatter, _rooted
from ._chunks import CHAIN_SEGMENT_BYTES, SEGMENT_BYTES, ceil_log2, floor_log2, pieces
from ._transport import machines

__all__ = ["ALGORITHMS", "FORMULAS", "ACROSS_MACHINES_BYTES", "DEFAULT_ALPHA", "DEFAULT_BETA", "get", "choose", "cost"]


class _Terms(NamedTuple):
    p: int
    n: float
    a: float  # α
    b: float  # β
    g: float  # γ
    up: int  # ⌈lg p⌉
    down: int  # ⌊lg p⌋
    q: int  # p'
    e: int
    spread: float  # (p-1)/p
    s: int  # S, segments per block
    c: int  # C, segments of the whole buffer
    k: int = 1  # ranks a machine
    h: int = 1  # machines
    pieces: int = 1  # P, the hierarchical all_reduce's pieces


@dataclass(frozen=True)
class Algorithm:
    """One algorithm of a collective: its generator, its cost formula as text and that formula to evaluate."""

    op: str
    name: str
    function: Callable
    """The generator function (see its module for the signature)."""
    formula: str
    """The critical-path cost in the module doc's symbols, as :func:`cost` evaluates it."""
    cost: Callable[[_Terms], float]
    """``formula`` as a function of the terms of one call."""


_STEPS = ("(p-1)·α + (p-1)/p·n·β", lambda x: (x.p - 1) * x.a + x.spread * x.n * x.b)
"""The cost of ``p-1`` steps moving ``(p-1)/p`` of the data in all: rings, pairwise exchanges, linear roots."""

_LOG_STEPS = ("⌈lg p⌉·α + (p-1)/p·n·β", lambda x: x.up * x.a + x.spread * x.n * x.b)
"""The cost of ``⌈lg p⌉`` steps moving ``(p-1)/p`` of the data in all: binomial trees, Bruck's all_gather."""

_REDUCING_STEPS = ("(p-1)·α + (p-1)/p·n·(β + γ)", lambda x: (x.p - 1) * x.a + x.spread * x.n * (x.b + x.g))
"""``_STEPS`` reducing every byte received: reduce_scatter's ring and pairwise exchange."""


_ENTRIES: tuple[Algorithm, ...] = (
    Algorithm(
        "all_reduce",
        "ring",
        _allreduce.ring,
        "2(p-1)·α + 2(p-1)/p·n·β + (p-1)/p·n·γ",
        lambda x: 2 * (x.p - 1) * x.a + 2 * x.spread * x.n * x.b + x.spread * x.n * x.g,
    ),
    Algorithm(
        "all_reduce",
        "ring_pipelined",
        _allreduce.ring_pipelined,
        "2(p-1)·S·α + 2(p-1)/p·n·β + (p-1)/p·n·γ/S",
        lambda x: 2 * (x.p - 1) * x.s * x.a + 2 * x.spread * x.n * x.b + x.spread * x.n * x.g / x.s,
    ),
    Algorithm(
        "all_reduce",
        "recursive_doubling",
        _allreduce.recursive_doubling,
        "(⌊lg p⌋+2e)·(α + n·β) + (⌊lg p⌋+e)·n·γ",
        lambda x: (x.down + 2 * x.e) * (x.a + x.n * x.b) + (x.down + x.e) * x.n * x.g,
    ),
    Algorithm(
        "all_reduce",
        "rabenseifner",
        _allreduce.rabenseifner,
        "2(⌊lg p⌋+e)·α + (2(p'-1)/p' + 2e)·n·β + ((p'-1)/p' + e)·n·γ",
        lambda x: (
            2 * (x.down + x.e) * x.a + (2 * (x.q - 1) / x.q + 2 * x.e) * x.n * x.b + ((x.q - 1) / x.q + x.e) * x.n * x.g
        ),
    ),
    Algorithm(
        "all_reduce",
        "binomial",
        _allreduce.binomial,
        "2⌈lg p⌉·(α + n·β) + ⌈lg p⌉·n·γ",
        lambda x: 2 * x.up * (x.a + x.n * x.b) + x.up * x.n * x.g,
    ),
    Algorithm(  # every rank sends the ring's bytes; in fewer steps where machines hold several ranks
        "all_reduce",
        "hierarchical",
        _allreduce.hierarchical,
        "P·(2(k-1) + 2(H-1)·⌈S/P⌉)·α + 2(p-1)/p·n·β + ((k-1)/k + (H-1)/(H·k)/⌈S/P⌉)·n·γ",
        lambda x: (
            x.pieces * (2 * (x.k - 1) + 2 * (x.h - 1) * -(-x.s // x.pieces)) * x.a
            + 2 * x.spread * x.n * x.b
            + ((x.k - 1) / x.k + (x.h - 1) / (x.h * x.k) / -(-x.s // x.pieces)) * x.n * x.g
        ),
    ),
    Algorithm(
        "broadcast",
        "binomial",
        _broadcast.binomial,
        "⌈lg p⌉·(α + n·β)",
        lambda x: x.up * (x.a + x.n * x.b),
    ),
    Algorithm(
        "broadcast",
        "scatter_allgather",
        _broadcast.scatter_allgather,
        "(⌈lg p⌉ + p-1)·α + 2(p-1)/p·n·β",
        lambda x: (x.up + x.p - 1) * x.a + 2 * x.spread * x.n * x.b,
    ),
    Algorithm(
        "broadcast",
        "chain_pipelined",
        _broadcast.chain_pipelined,
        "(p-2+C)·(α + n/C·β)",
        lambda x: (x.p - 2 + x.c) * (x.a + x.n / x.c * x.b),
    ),
    Algorithm(
        "reduce",
        "binomial",
        _rooted.reduce_binomial,
        "⌈lg p⌉·(α + n·β + n·γ)",
        lambda x: x.up * (x.a + x.n * x.b + x.n * x.g),
    ),
    Algorithm(
        "reduce",
        "linear",
        _rooted.reduce_linear,
        "(p-1)·(α + n·β + n·γ)",
        lambda x: (x.p - 1) * (x.a + x.n * x.b + x.n * x.g),
    ),
    Algorithm("all_gather", "ring", _allgather.ring, *_STEPS),
    Algorithm(
        "all_gather",
        "recursive_doubling",
        _allgather.recursive_doubling,
        "(⌊lg p⌋+2e)·α + ((p-1)/p + e(p+1)/p)·n·β",
        lambda x: (x.down + 2 * x.e) * x.a + (x.spread + x.e * (x.p + 1) / x.p) * x.n * x.b,
    ),
    Algorithm("all_gather", "bruck", _allgather.bruck, *_LOG_STEPS),
    Algorithm("reduce_scatter", "ring", _reduce_scatter.ring, *_REDUCING_STEPS),
    Algorithm(
        "reduce_scatter",
        "ring_pipelined",
        _reduce_scatter.ring_pipelined,
        "(p-1)·S·α + (p-1)/p·n·(β + γ/S)",
        lambda x: (x.p - 1) * x.s * x.a + x.spread * x.n * (x.b + x.g / x.s),
    ),
    Algorithm("reduce_scatter", "pairwise", _reduce_scatter.pairwise, *_REDUCING_STEPS),
    Algorithm(
        "reduce_scatter",
        "recursive_halving",
        _reduce_scatter.recursive_halving,
        "(⌊lg p⌋+2e)·α + ((p'-1)/p' + e(p+1)/p)·n·β + ((p'-1)/p' + e + 1)·n·γ",
        lambda x: (
            (x.down + 2 * x.e) * x.a
            + ((x.q - 1) / x.q + x.e * (x.p + 1) / x.p) * x.n * x.b
            + ((x.q - 1) / x.q + x.e + 1) * x.n * x.g  # + 1: it copies the whole input first
        ),
    ),
    Algorithm("all_to_all", "pairwise", _alltoall.pairwise, *_STEPS),
    Algorithm(
        "all_to_all",
        "bruck",
        _alltoall.bruck,
        "⌈lg p⌉·α + ⌈lg p⌉·n/2·β",
        lambda x: x.up * x.a + x.up * x.n / 2 * x.b,
    ),
    Algorithm("all_to_all", "direct", _alltoall.direct, *_STEPS),
    Algorithm("gather", "linear", _rooted.gather_linear, *_STEPS),
    Algorithm("gather", "binomial", _rooted.gather_binomial, *_LOG_STEPS),
    Algorithm("scatter", "linear", _rooted.scatter_linear, *_STEPS),
    Algorithm("scatter", "binomial", _rooted.scatter_binomial, *_LOG_STEPS),
    Algorithm(
        "barrier",
        "dissemination",
        _barrier.dissemination,
        "⌈lg p⌉·α",
        lambda x: x.up * x.a,
    ),
)
"""Every algorithm, grouped by op; within an op, ties of :func:`choose` go to the one listed first."""

_BY_KEY: dict[tuple[str, str], Algorithm] = {(a.op, a.name): a for a in _ENTRIES}


def _view(field: str) -> dict[str, dict[str, Any]]:
    """op -> algorithm name -> that entry's ``field``, in the order of ``_ENTRIES``."""
    view: dict[str, dict[str, Any]] = {}
    for entry in _ENTRIES:
        view.setdefault(entry.op, {})[entry.name] = getattr(entry, field)
    return view


ALGORITHMS: dict[str, dict[str, Callable]] = _view("function")
"""op -> algorithm name -> generator function (see each module for the signature)."""

FORMULAS: dict[str, dict[str, str]] = _view("formula")
"""op -> algorithm name -> the cost formula that :func:`cost` evaluates (symbols in the module doc)."""


def _choices(names: object) -> str:
    return ", ".join(repr(k) for k in sorted(names))  # type: ignore[call-overload]


def _table(op: str) -> dict[str, Callable]:
    try:
        return ALGORITHMS[op]
    except (KeyError, TypeError):
        raise ValueError(f"op={op!r} is not a collective; expected one of {_choices(ALGORITHMS)}") from None


def get(op: str, name: str) -> Callable:
    """The algorithm ``name`` of collective ``op``, e.g. ``get("all_reduce", "ring")``.

    Raises:
        ValueError: naming the unknown ``op`` or ``algorithm`` and the valid choices.
    """
    table = _table(op)
    try:
        return table[name]
    except (KeyError, TypeError):
        article = "an" if op.startswith("a") else "a"
        raise ValueError(
            f"algorithm={name!r} is not {article} {op} algorithm; expected one of {_choices(table)}"
        ) from None


def _check(op: str, nbytes: int, size: int) -> None:
    _table(op)
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"size={size!r} must be a positive int")
    if nbytes < 0:
        raise ValueError(f"nbytes={nbytes!r} must be non-negative")


DEFAULT_ALPHA = 2e-6
"""Latency of one message (s) when the caller names no network: two 1 µs links through a switch."""

DEFAULT_BETA = 1 / 12.5e9
"""Seconds per byte when the caller names no network: 12.5 GB/s (100 Gb/s)."""


ACROSS_MACHINES_BYTES = 256 * 1024
"""From this size, an all_reduce of a group whose ranks run on several machines goes by their
links rather than by the alpha-beta model (BENCHMARKS.md (n)): ``hierarchical`` where machines hold
several ranks each, ``ring_pipelined`` otherwise. A machine's link, shared by its ranks, then sets
the time: ``recursive_doubling`` and ``rabenseifner`` put every rank of a machine on it at once
(2-4.25 times the buffer per all_reduce with 2 ranks a machine), a ring in rank order 1.5-1.75
times, ``hierarchical`` ``2 (H-1)/H`` on ``H`` machines (1.0-1.5)."""

_BY_HOSTS_ONLY = {("all_reduce", "hierarchical")}
"""Algorithms that the alpha-beta model cannot tell apart from another: chosen only by the machines."""


@functools.lru_cache(maxsize=4096)
def choose(
    op: str,
    nbytes: int,
    size: int,
    *,
    equal_counts: bool = True,
    alpha: float = DEFAULT_ALPHA,
    beta: float = DEFAULT_BETA,
    gamma: float = 0.0,
    hosts: tuple | None = None,
) -> str:
    """The algorithm of ``op`` with the lowest alpha-beta cost for ``nbytes`` on ``size`` ranks.

    ``alpha`` and ``beta`` describe the network (the simulator passes its topology's),
    ``gamma`` the seconds per byte reduced; ties go to the algorithm registered first.
    ``bruck`` is left out of ``all_to_all`` unless ``equal_counts``. For example, with the
    defaults at 4 ranks ``all_reduce`` picks ``recursive_doubling`` below about 100 KB and
    ``rabenseifner`` above. ``hosts``, a machine label per rank where the caller knows them:
    an all_reduce of ``ACROSS_MACHINES_BYTES`` or more on several machines is ``hierarchical``
    where every machine holds the same number of ranks, more than one, else ``ring_pipelined``.
    """
    _check(op, nbytes, size)
    if op == "all_reduce" and hosts is not None and nbytes >= ACROSS_MACHINES_BYTES and len(set(hosts)) > 1:
        return "hierarchical" if machines(hosts, size) is not None else "ring_pipelined"
    names = [
        n
        for n in _table(op)
        if (op, n) not in _BY_HOSTS_ONLY and not (op == "all_to_all" and n == "bruck" and not equal_counts)
    ]
    return min(names, key=lambda name: cost(op, name, nbytes, size, alpha, beta, gamma))


def cost(
    op: str,
    name: str,
    nbytes: int,
    size: int,
    alpha: float,
    beta: float,
    gamma: float = 0.0,
    *,
    per_machine: int | None = None,
) -> float:
    """Seconds that algorithm ``name`` of ``op`` takes in the alpha-beta(-gamma) model.

    Evaluates ``FORMULAS[op][name]`` with ``α = alpha`` (seconds per message),
    ``β = beta`` (seconds per byte), ``γ = gamma`` (seconds per byte reduced; reducing
    ops only) and ``n = nbytes`` as defined in the module doc. 0 on one rank.
    ``per_machine``: ranks on each machine (``k``), where every machine holds as many.

    Raises:
        ValueError: for an unknown ``op`` or ``name``, a size below 1 or negative nbytes.
    """
    get(op, name)
    _check(op, nbytes, size)
    if size == 1:
        return 0.0
    down = floor_log2(size)
    q = 1 << down
    terms = _Terms(
        p=size,
        n=float(nbytes),
        a=alpha,
        b=beta,
        g=gamma,
        up=ceil_log2(size),
        down=down,
        q=q,
        e=0 if q == size else 1,
        spread=(size - 1) / size,
        s=max(1, -(-nbytes // (size * SEGMENT_BYTES))),
        c=max(1, -(-nbytes // CHAIN_SEGMENT_BYTES)),
    )
    if per_machine is not None and 1 < per_machine < size and size % per_machine == 0:
        terms = terms._replace(k=per_machine, h=size // per_machine, pieces=pieces(nbytes))
    else:
        terms = terms._replace(h=size)
    return float(_BY_KEY[op, name].cost(terms))
