"""Hypothesis strategies for parallel programs: schedules, world sizes, topologies, collective inputs.

Every draw happens on the test's thread, before the run starts; the run then replays
what was drawn, so Hypothesis can shrink it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from ._schedule import Schedule

__all__ = ["schedules", "world_sizes", "topologies", "collective_inputs", "CollectiveInputs", "COLLECTIVE_OPS"]


def schedules(max_choices: int = 200, max_option: int = 7) -> st.SearchStrategy[Schedule]:
    """Schedules: lists of at most ``max_choices`` scheduler choices, each in ``0..max_option``.

    A choice is an index into the runnable ranks (0: keep the running rank; a choice
    larger than the number of options wraps around). Hypothesis shrinks a list to fewer
    and smaller choices: towards fewer preemptions and a shorter prefix of decisions,
    after which every rank runs on undisturbed.

    Args:
        max_choices: the longest list (a non-negative int).
        max_option: the largest choice (a non-negative int).

    Returns:
        A Hypothesis strategy of :class:`Schedule` (a list of ints), for ``run``'s ``schedule``.

    Raises:
        ValueError: ``max_choices`` or ``max_option`` is negative.

    Example:
        >>> from hypothesis import find, settings
        >>> import simdist.testing as sdt
        >>> quiet = settings(database=None, derandomize=True)
        >>> find(sdt.schedules(max_option=3), lambda s: sum(s) >= 4, settings=quiet)   # shrunk
        Schedule([1, 3])
    """
    if max_choices < 0 or max_option < 0:
        raise ValueError(f"max_choices={max_choices} and max_option={max_option} must be non-negative")
    return st.lists(st.integers(0, max_option), max_size=max_choices).map(Schedule)


def world_sizes(min_size: int = 1, max_size: int = 8) -> st.SearchStrategy[int]:
    """World sizes from ``min_size`` to ``max_size``; they shrink towards ``min_size``.

    Args:
        min_size: the smallest world (at least 1).
        max_size: the largest world (at least ``min_size``).

    Returns:
        A Hypothesis strategy of ints.

    Raises:
        ValueError: not ``1 <= min_size <= max_size``.

    Example:
        >>> from hypothesis import find, settings
        >>> import simdist.testing as sdt
        >>> quiet = settings(database=None, derandomize=True)
        >>> find(sdt.world_sizes(2, 8), lambda n: n % 2 == 1, settings=quiet)   # the smallest odd world
        3
    """
    if not 1 <= min_size <= max_size:
        raise ValueError(f"world_sizes({min_size}, {max_size}): expected 1 <= min_size <= max_size")
    return st.integers(min_size, max_size)


def topologies() -> st.SearchStrategy[str]:
    """Names of ``simdist.TOPOLOGIES`` (each builds a network for any world size); shrinks to ``'switch'``.

    Returns:
        A Hypothesis strategy of topology names, for ``run``'s or ``simulate``'s ``topology``.

    Example:
        >>> from hypothesis import find, settings
        >>> import simdist.testing as sdt
        >>> quiet = settings(database=None, derandomize=True)
        >>> find(sdt.topologies(), lambda name: True, settings=quiet)
        'switch'
    """
    from simdist.core._topology import TOPOLOGIES

    names = sorted(TOPOLOGIES, key=lambda n: (n != "switch", n))
    return st.sampled_from(names)


COLLECTIVE_OPS = (
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "gather",
    "scatter",
)


@dataclass(frozen=True)
class CollectiveInputs:
    """Valid inputs of one collective call on every rank.

    ``tensors[r]`` is rank ``r``'s input tensor (for ``scatter``: the root's list of
    ``world`` tensors, ``None`` elsewhere); ``root`` is the ``src``/``dst`` of rooted ops.
    Values are small integers, so sums are exact in every float dtype.
    """

    op: str
    world: int
    dtype: Any
    shape: tuple
    root: int
    tensors: list

    def input(self, rank: int) -> Any:
        """A fresh copy of rank ``rank``'s input (collectives write into their arguments)."""
        t = self.tensors[rank]
        if t is None:
            return None
        return [x.clone() for x in t] if isinstance(t, list) else t.clone()


@st.composite
def collective_inputs(
    draw: Any, op: str | None = None, world: int | None = None, dtypes: tuple | None = None, max_elements: int = 16
) -> CollectiveInputs:
    """Inputs for ``op`` (drawn from ``COLLECTIVE_OPS`` if ``None``) at ``world`` ranks (drawn 1..8 if ``None``).

    Per-rank tensors have the shape the op needs: for ``reduce_scatter_tensor`` and
    ``all_to_all_single`` a first dimension ``world`` times a drawn block; for
    ``scatter`` the root holds ``world`` tensors.

    Args:
        op: a name from ``COLLECTIVE_OPS``, or ``None`` to draw one.
        world: the world size, or ``None`` to draw one from 1 to 8.
        dtypes: the torch dtypes to draw from (default float32, float64, int64, int32).
        max_elements: the most elements of one rank's tensor (before the ``world`` factor).

    Returns:
        A Hypothesis strategy of :class:`CollectiveInputs` (``op``, ``world``, ``dtype``,
        ``shape``, ``root``, ``tensors``; ``input(rank)`` copies a rank's input).

    Raises:
        ValueError: ``op`` is not in ``COLLECTIVE_OPS`` (when the strategy draws).

    Example:
        >>> import torch
        >>> from hypothesis import find, settings
        >>> import simdist.testing as sdt
        >>> quiet = settings(database=None, derandomize=True)
        >>> case = find(sdt.collective_inputs(op="all_reduce", world=2, dtypes=(torch.int64,)),
        ...             lambda c: c.shape == (2,) and sum(c.tensors[1]) > 0, settings=quiet)
        >>> case.world, case.shape, case.tensors
        (2, (2,), [tensor([0, 0]), tensor([0, 1])])
    """
    import torch

    op = draw(st.sampled_from(COLLECTIVE_OPS)) if op is None else op
    if op not in COLLECTIVE_OPS:
        raise ValueError(f"op={op!r} is not one of {COLLECTIVE_OPS}")
    world = draw(world_sizes()) if world is None else world
    dtype = draw(st.sampled_from(dtypes or (torch.float32, torch.float64, torch.int64, torch.int32)))
    shape = tuple(draw(st.lists(st.integers(1, 4), max_size=2).filter(lambda s: _numel(s) <= max_elements)))
    if op in ("reduce_scatter_tensor", "all_to_all_single"):
        shape = (world * (shape[0] if shape else 1), *shape[1:])
    root = draw(st.integers(0, world - 1))
    elements = st.integers(-50, 50)

    def tensor() -> Any:
        values = draw(st.lists(elements, min_size=_numel(shape), max_size=_numel(shape)))
        return torch.tensor(values, dtype=dtype).reshape(shape)

    if op == "scatter":
        tensors = [[tensor() for _ in range(world)] if r == root else None for r in range(world)]
    else:
        tensors = [tensor() for _ in range(world)]
    return CollectiveInputs(op, world, dtype, shape, root, tensors)


def _numel(shape: Any) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
