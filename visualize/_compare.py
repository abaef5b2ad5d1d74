"""Algorithm comparison: simulated virtual time against message size, next to the alpha-beta model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from simdist._topology import as_topology
from simdist.algorithms import ALGORITHMS, FORMULAS, cost

from ._runs import collective_run

__all__ = ["Curve", "Crossover", "Comparison", "compare_algorithms", "crossovers"]


@dataclass(frozen=True, slots=True)
class Curve:
    """One algorithm's times (seconds) at each size of :attr:`Comparison.sizes`."""

    algorithm: str
    formula: str
    simulated: tuple[float, ...]
    model: tuple[float, ...]


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
        alpha, beta: the model's parameters, from the topology (seconds, seconds per byte).
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


def crossovers(sizes: Sequence[int], times: dict[str, Sequence[float]]) -> list[Crossover]:
    """Where the fastest of ``times`` (algorithm -> time per size) changes between consecutive sizes.

    Ties go to the algorithm listed first in ``times``. For example, with sizes
    ``[1, 2, 3]`` and ``{"a": [1, 2, 3], "b": [2, 2, 2]}`` the fastest is a, a, b: one
    crossover, ``Crossover(below=2, above=3, before="a", after="b")``.
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
    ``alpha``/``beta`` (``Topology.alpha_beta``). Sizes are sorted and deduplicated.

    Raises:
        ValueError: for an unknown op, no sizes or a negative size.
    """
    if op not in ALGORITHMS:
        raise ValueError(f"op={op!r} is not a collective; expected one of {sorted(ALGORITHMS)}")
    sizes = tuple(sorted(set(int(s) for s in sizes)))
    if not sizes or sizes[0] < 0:
        raise ValueError(f"sizes={sizes!r} must be one or more non-negative byte counts")
    alpha, beta = as_topology(topology, world).alpha_beta()
    curves = []
    for name in ALGORITHMS[op]:
        sim = tuple(collective_run(op, name, world, n, topology, seed, record_steps=False).time for n in sizes)
        model = tuple(cost(op, name, n, world, alpha, beta) for n in sizes)
        curves.append(Curve(name, FORMULAS[op][name], sim, model))
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
    )
