"""Algorithm comparison: simulated virtual time against message size, next to the alpha-beta model.

The model's symbols are those of ``simdist.algorithms`` (:data:`SYMBOLS` says what each
means); :func:`symbol_table` gives their values for one comparison.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from simdist.core._topology import as_topology
from simdist.algorithms import ALGORITHMS, FORMULAS, cost, machines
from simdist.algorithms._chunks import CHAIN_SEGMENT_BYTES, SEGMENT_BYTES, ceil_log2, floor_log2, pieces

from ._runs import collective_run

__all__ = [
    "SYMBOLS",
    "Comparison",
    "Crossover",
    "Curve",
    "coincident",
    "compare_algorithms",
    "crossovers",
    "formula_symbols",
    "model_ratios",
    "model_sides",
    "segments",
    "size_label",
    "symbol_table",
]

SYMBOLS: dict[str, str] = {
    "α": "seconds per message (latency of the path between two ranks)",
    "β": "seconds per byte (1 / the path's bandwidth)",
    "γ": "seconds per byte reduced",
    "p": "ranks (the world size)",
    "n": "bytes: the largest per-rank buffer of the operation (the x axis)",
    "⌈lg p⌉": "log₂ p rounded up",
    "⌊lg p⌋": "log₂ p rounded down",
    "p'": "2^⌊lg p⌋, the largest power of two ≤ p",
    "e": "0 if p is a power of two, else 1 (the extra folding steps of recursive doubling/halving)",
    "S": "segments per block of the pipelined rings: max(1, ⌈n / (p·s)⌉)",
    "C": "segments of the pipelined chain: max(1, ⌈n / c⌉)",
    "k": "ranks on each machine (hierarchical; 1 where the topology has no machines)",
    "H": "machines (hierarchical; p where the topology has no machines)",
    "P": "pieces of the hierarchical all_reduce: one per 8 MiB, 1 to 4 (1 where the topology has no machines)",
}
"""Every symbol of the cost formulas (``simdist.algorithms.FORMULAS``) -> what it stands for."""

CONSTANTS = {
    "s": ("S", "bytes per segment of the pipelined rings (a constant of simdist's algorithms)"),
    "c": ("C", "bytes per segment of the pipelined chain (a constant of simdist's algorithms)"),
}
"""The constants that symbols' meanings name -> (the symbol that uses it, what it stands for)."""

_TOKEN = re.compile("|".join(re.escape(k) for k in sorted(SYMBOLS, key=len, reverse=True)) + r"|[A-Za-zα-ω]+")


@dataclass(frozen=True, slots=True)
class Curve:
    """One algorithm's times (seconds) at each size of :attr:`Comparison.sizes`."""

    algorithm: str
    formula: str
    simulated: tuple[float, ...]
    model: tuple[float, ...]
    model_slowest: tuple[float, ...] = ()
    """The formula with the α, β of the slowest pair of ranks (:attr:`Comparison.slowest`)."""


@dataclass(frozen=True, slots=True)
class Crossover:
    """Between sizes ``below`` and ``above`` the fastest algorithm changes from ``before`` to ``after``."""

    below: int
    above: int
    before: str
    after: str


@dataclass(frozen=True, slots=True)
class Comparison:
    """Every algorithm of ``op`` on ``world`` ranks at each of ``sizes`` (bytes, ascending).

    Attributes:
        curves: one per algorithm, in registry order.
        crossovers: where the fastest algorithm in simulation changes.
        model_crossovers: the same for the alpha-beta model.
        alpha, beta: the model's parameters, from the topology (seconds, seconds per byte):
            those of the path between ranks 0 and 1.
        slowest: ``(0, r)``, the pair whose path has the least bandwidth (then the most
            latency), and ``slowest_alpha``, ``slowest_beta`` its parameters; the same as
            ranks 0 and 1 on a topology where every pair is alike.
        per_machine: ranks on each of the topology's machines (``k`` of ``hierarchical``'s
            formula), where they hold as many; ``None`` where it has none.
    """

    op: str
    world: int
    topology: str
    sizes: tuple[int, ...]
    alpha: float
    beta: float
    curves: tuple[Curve, ...]
    crossovers: tuple[Crossover, ...]
    model_crossovers: tuple[Crossover, ...]
    slowest: tuple[int, int] = (0, 1)
    slowest_alpha: float = 0.0
    slowest_beta: float = 0.0
    per_machine: int | None = None


def crossovers(sizes: Sequence[int], times: dict[str, Sequence[float]]) -> list[Crossover]:
    """Where the fastest of ``times`` (algorithm -> time per size) changes between consecutive sizes.

    Ties go to the algorithm listed first in ``times``. For example, with sizes
    ``[1, 2, 3]`` and ``{"a": [1, 2, 3], "b": [2, 2, 2]}`` the fastest is a, a, b: one
    crossover, ``Crossover(below=2, above=3, before="a", after="b")``.

    Args:
        sizes: the sizes, ascending.
        times: algorithm -> its time at each size.

    Returns:
        One ``Crossover`` (``below``, ``above``, ``before``, ``after``) per change of the fastest.

    Example:
        >>> from simdist.visualize import crossovers
        >>> crossovers([1, 2, 3], {"a": [1, 2, 3], "b": [2, 2, 2]})
        [Crossover(below=2, above=3, before='a', after='b')]
    """
    names = list(times)
    if not names:
        return []
    for name, ts in times.items():
        if len(ts) != len(sizes):
            raise ValueError(f"times[{name!r}] has {len(ts)} values for {len(sizes)} sizes")
    best = [min(names, key=lambda n: times[n][i]) for i in range(len(sizes))]
    return [
        Crossover(sizes[i - 1], sizes[i], best[i - 1], best[i]) for i in range(1, len(sizes)) if best[i] != best[i - 1]
    ]


def compare_algorithms(
    op: str, world: int, sizes: Sequence[int], topology: str = "switch", seed: int = 0
) -> Comparison:
    """Virtual time of every algorithm of ``op`` at each size, its alpha-beta formula and prediction.

    Each point is one :func:`collective_run` (``record_steps=False``) and its time the
    run's makespan; the model evaluates ``simdist.algorithms.cost`` with the topology's
    ``alpha``/``beta`` (``Topology.alpha_beta``) and ``gamma``. Sizes are sorted and deduplicated.

    Args:
        op: a collective of ``simdist.algorithms``.
        world: the number of ranks.
        sizes: message sizes in bytes (the cost model's ``n``).
        topology: a name from ``simdist.TOPOLOGIES`` or a topology file.
        seed: the scheduler's seed.

    Returns:
        A ``Comparison``: ``sizes``, ``alpha``, ``beta``, one ``Curve`` per algorithm
        (``simulated`` and ``model`` times per size, ``formula``), ``crossovers``.

    Raises:
        ValueError: for an unknown op, no sizes or a negative size.

    Example:
        >>> from simdist.visualize import compare_algorithms
        >>> cmp = compare_algorithms("all_reduce", 4, [1 << 20, 64, 64])
        >>> cmp.sizes, [curve.algorithm for curve in cmp.curves][:2]
        ((64, 1048576), ['ring', 'ring_pipelined'])
        >>> cmp.curves[0].formula
        '2(p-1)·α + 2(p-1)/p·n·β + (p-1)/p·n·γ'
    """
    if op not in ALGORITHMS:
        raise ValueError(f"op={op!r} is not a collective; expected one of {sorted(ALGORITHMS)}")
    sizes = tuple(sorted(set(int(s) for s in sizes)))
    if not sizes or sizes[0] < 0:
        raise ValueError(f"sizes={sizes!r} must be one or more non-negative byte counts")
    topo = as_topology(topology, world)
    alpha, beta = topo.alpha_beta()
    groups = machines([topo.machine(r) for r in range(world)], world)
    per_machine = len(groups[0]) if groups else None
    far, slow_alpha, slow_beta = _slowest_pair(topo, world)
    curves = []
    for name in ALGORITHMS[op]:
        sim = tuple(collective_run(op, name, world, n, topology, seed, record_steps=False).time for n in sizes)
        model = tuple(cost(op, name, n, world, alpha, beta, topo.gamma, per_machine=per_machine) for n in sizes)
        slow = tuple(
            cost(op, name, n, world, slow_alpha, slow_beta, topo.gamma, per_machine=per_machine) for n in sizes
        )
        curves.append(Curve(name, FORMULAS[op][name], sim, model, slow))
    return Comparison(
        op,
        world,
        topology,
        sizes,
        alpha,
        beta,
        tuple(curves),
        tuple(crossovers(sizes, {c.algorithm: c.simulated for c in curves})),
        tuple(crossovers(sizes, {c.algorithm: c.model for c in curves})),
        (0, far),
        slow_alpha,
        slow_beta,
        per_machine,
    )


def _slowest_pair(topo, world: int) -> tuple[int, float, float]:
    """``(r, alpha, beta)`` of the path from rank 0 with the least bandwidth, then the most latency."""
    if world < 2:
        return 1, 0.0, 0.0
    best = max(range(1, world), key=lambda r: (1.0 / topo.path(0, r)[2], topo.path(0, r)[1], -r))
    _, alpha, bandwidth = topo.path(0, best)
    return best, alpha, 1.0 / bandwidth


def formula_symbols(formula: str) -> list[str]:
    """The symbols of :data:`SYMBOLS` that ``formula`` uses, in :data:`SYMBOLS` order.

    Args:
        formula: a cost formula as ``simdist.algorithms`` writes it.

    Returns:
        The symbols it uses.

    Raises:
        ValueError: if ``formula`` holds a name that is not a symbol (``'lg'`` outside
            ``⌈lg p⌉``/``⌊lg p⌋``, an unknown letter).

    Example:
        >>> from simdist.visualize import formula_symbols
        >>> formula_symbols("⌈lg p⌉·α + n·β")
        ['α', 'β', 'n', '⌈lg p⌉']
    """
    found = set(_TOKEN.findall(formula))
    unknown = found - set(SYMBOLS)
    if unknown:
        raise ValueError(f"formula={formula!r} uses {sorted(unknown)}, which SYMBOLS does not define")
    return [k for k in SYMBOLS if k in found]


def size_label(nbytes: float) -> str:
    """``nbytes`` in binary units: ``16 B``, ``1 KiB``, ``4 MiB``, ``1.5 KiB``.

    Args:
        nbytes: a number of bytes.

    Returns:
        The label.

    Example:
        >>> from simdist.visualize import size_label
        >>> size_label(16), size_label(1536), size_label(4 << 20)
        ('16 B', '1.5 KiB', '4 MiB')
    """
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.3g} B"


def _seconds(t: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if t >= scale:
            return f"{t / scale:.3g} {unit}"
    return f"{t * 1e9:.3g} ns"


def _spread(values: list[int]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo}" if lo == hi else f"{lo} to {hi}"


def segments(cmp: Comparison) -> list[int]:
    """``S``, the segments per block of the pipelined rings, at each of ``cmp``'s sizes.

    Args:
        cmp: a :func:`compare_algorithms`.

    Returns:
        One int per size of ``cmp``.

    Example:
        >>> from simdist.visualize import compare_algorithms, segments
        >>> segments(compare_algorithms("all_reduce", 4, [64, 1 << 20]))
        [1, 1]
    """
    return [max(1, -(-n // (cmp.world * SEGMENT_BYTES))) for n in cmp.sizes]


def symbol_table(cmp: Comparison, slowest: bool = False) -> list[dict[str, str]]:
    """One row per symbol that ``cmp``'s formulas use (α, β, p and n always), then one per constant those
    symbols' meanings name (:data:`CONSTANTS`): symbol, meaning, value here.

    Values are those the model lines use at ``cmp``'s world and sizes: α, β of ranks 0
    and 1, or of the slowest pair with ``slowest``; γ is 0 because the simulator charges
    no time for reducing.

    Args:
        cmp: a :func:`compare_algorithms`.
        slowest: use the slowest pair's α, β.

    Returns:
        Rows of ``{"symbol", "meaning", "value here"}``.

    Example:
        >>> from simdist.visualize import compare_algorithms, symbol_table
        >>> rows = symbol_table(compare_algorithms("all_reduce", 4, [64, 1 << 20]))
        >>> rows[0]["symbol"], rows[0]["value here"]
        ('α', '2 µs (ranks 0 and 1)')
    """
    used = {s for c in cmp.curves for s in formula_symbols(c.formula)} | {"α", "β", "p", "n"}
    p = cmp.world
    down = floor_log2(p)
    alpha, beta = (cmp.slowest_alpha, cmp.slowest_beta) if slowest else (cmp.alpha, cmp.beta)
    pair = f"ranks 0 and {cmp.slowest[1] if slowest else 1}"
    values = {
        "α": f"{_seconds(alpha)} ({pair})",
        "β": f"{beta * 1e9:.3g} ns/B, i.e. {1 / beta / 1e9:.3g} GB/s ({pair})" if beta else "0",
        "γ": "0 here: the simulator charges no time for reducing",
        "p": str(p),
        "n": f"{size_label(cmp.sizes[0])} to {size_label(cmp.sizes[-1])}",
        "⌈lg p⌉": str(ceil_log2(p)),
        "⌊lg p⌋": str(down),
        "p'": str(1 << down),
        "e": str(0 if 1 << down == p else 1),
        "S": f"{_spread(segments(cmp))} at these sizes",
        "C": f"{_spread([max(1, -(-n // CHAIN_SEGMENT_BYTES)) for n in cmp.sizes])} at these sizes",
        "k": str(cmp.per_machine or 1) + ("" if cmp.per_machine else " (no machines of equal size here)"),
        "H": str(p // (cmp.per_machine or 1)),
        "P": f"{_spread([pieces(n) for n in cmp.sizes])} at these sizes" if cmp.per_machine else "1 (no machines)",
    }  # fmt: skip
    constants = {"s": size_label(SEGMENT_BYTES), "c": size_label(CHAIN_SEGMENT_BYTES)}
    rows = [{"symbol": k, "meaning": SYMBOLS[k], "value here": values[k]} for k in SYMBOLS if k in used]
    return rows + [
        {"symbol": k, "meaning": meaning, "value here": constants[k]}
        for k, (user, meaning) in CONSTANTS.items()
        if user in used
    ]


def coincident(cmp: Comparison, rel: float = 1e-9) -> list[tuple[str, ...]]:
    """Groups of two or more algorithms whose simulated times agree (within ``rel``) at every size.

    Args:
        cmp: a :func:`compare_algorithms`.
        rel: the relative tolerance.

    Returns:
        The groups of algorithm names, each in ``cmp``'s order.

    Example:
        >>> from simdist.visualize import coincident, compare_algorithms
        >>> coincident(compare_algorithms("all_reduce", 4, [64, 1 << 20]))
        [('ring', 'ring_pipelined', 'hierarchical')]
    """
    groups: list[list[Curve]] = []
    for c in cmp.curves:
        for g in groups:
            if all(abs(a - b) <= rel * max(abs(a), abs(b)) for a, b in zip(g[0].simulated, c.simulated)):
                g.append(c)
                break
        else:
            groups.append([c])
    return [tuple(c.algorithm for c in g) for g in groups if len(g) > 1]


def model_ratios(cmp: Comparison, slowest: bool = False) -> dict[str, tuple[float, float]]:
    """Algorithm -> (least, greatest) simulated time ÷ model time over the sizes (model > 0 only).

    ``slowest`` picks the model with the slowest pair's α, β instead of ranks 0 and 1's.

    Args:
        cmp: a :func:`compare_algorithms`.
        slowest: use the slowest pair's α, β.

    Returns:
        ``{algorithm: (least ratio, greatest ratio)}``.

    Example:
        >>> from simdist.visualize import compare_algorithms, model_ratios
        >>> least, greatest = model_ratios(compare_algorithms("all_reduce", 4, [64, 1 << 20]))["ring"]
        >>> round(least, 9), round(greatest, 9)                 # the formula is exact on a switch
        (1.0, 1.0)
    """
    out = {}
    for c in cmp.curves:
        model = c.model_slowest if slowest else c.model
        ratios = [s / m for s, m in zip(c.simulated, model) if m > 0]
        out[c.algorithm] = (min(ratios), max(ratios)) if ratios else (1.0, 1.0)
    return out


def model_sides(cmp: Comparison, slowest: bool = False, within: float = 0.01) -> tuple[list[str], ...]:
    """``(above, below, on)``: algorithms with a point more than ``within`` (relative) above their model line,
    with every point more than ``within`` below it, and the rest (on the line at some size, never above).

    Args:
        cmp: a :func:`compare_algorithms`.
        slowest: use the slowest pair's α, β.
        within: the relative tolerance.

    Returns:
        ``(above, below, on)``, three lists of algorithm names.

    Example:
        >>> from simdist.visualize import compare_algorithms, model_sides
        >>> above, below, on = model_sides(compare_algorithms("all_reduce", 4, [64, 1 << 20]))
        >>> above, below, sorted(on)
        ([], [], ['binomial', 'hierarchical', 'rabenseifner', 'recursive_doubling', 'ring', 'ring_pipelined'])
    """
    ratios = model_ratios(cmp, slowest)
    above = [a for a, (_, hi) in ratios.items() if hi > 1 + within]
    below = [a for a, (_, hi) in ratios.items() if hi < 1 - within]
    return above, below, [a for a in ratios if a not in above and a not in below]
