"""One collective on the simulator, with inputs whose values say where they came from.

Encodings (recorded in ``trace.meta["visualize"]`` so that views can decode snapshots):

- ``'bits'`` (all_reduce, reduce, reduce_scatter): rank ``r`` contributes ``2**r`` to every
  element, so any partial sum is the bit set of the ranks it contains (worlds up to 52,
  float64 holds such sums exactly).
- ``'blocks'`` (broadcast, all_gather, gather, scatter, all_to_all): element of block ``j``
  of rank ``r``'s input holds ``1 + r + p*j``; 0 means "nothing arrived yet".
- ``'none'``: no origins (a reducing op on more than 52 ranks, or barrier).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

import simdist as dist
from simdist.core._arrays import snapshot
from simdist.algorithms import ALGORITHMS, chunk_bounds

__all__ = ["collective_run", "decode", "layout_chunk", "layout_chunks", "REDUCING", "MAX_BITS_WORLD"]

REDUCING = ("all_reduce", "reduce", "reduce_scatter")
MAX_BITS_WORLD = 52
ROOT = 0


def _blocks(rank: int, world: int, blocks: int, m: int) -> torch.Tensor:
    """``blocks`` blocks of ``m`` elements, block ``j`` holding ``1 + rank + world*j``."""
    vals = torch.arange(blocks, dtype=torch.float64) * world + (1 + rank)
    return vals.repeat_interleave(m)


def _program(rank: int, op: str, algorithm: str, world: int, n: int, m: int, encoding: str) -> list:
    """One rank of the collective; returns the leading values of the buffer the trace snapshots."""
    dist.init_process_group("sim", rank=rank, world_size=world)
    mark = float(2**rank) if encoding == "bits" else 1.0
    if op in ("all_reduce", "reduce"):
        buf = torch.full((n,), mark, dtype=torch.float64)
        if op == "all_reduce":
            dist.all_reduce(buf, algorithm=algorithm)
        else:
            dist.reduce(buf, dst=ROOT, algorithm=algorithm)
    elif op == "reduce_scatter":
        buf = torch.zeros(m, dtype=torch.float64)
        dist.reduce_scatter_tensor(buf, torch.full((world * m,), mark, dtype=torch.float64), algorithm=algorithm)
    elif op == "broadcast":
        buf = torch.zeros(n, dtype=torch.float64)
        if rank == ROOT:
            for j, (start, length) in enumerate(chunk_bounds(n, world)):
                buf[start : start + length] = 1 + ROOT + world * j
        dist.broadcast(buf, src=ROOT, algorithm=algorithm)
    elif op == "all_gather":
        buf = torch.zeros(world * m, dtype=torch.float64)
        dist.all_gather_into_tensor(buf, _blocks(rank, world, 1, m), algorithm=algorithm)
    elif op == "gather":
        inp = _blocks(rank, world, 1, m)
        outs = [torch.zeros(m, dtype=torch.float64) for _ in range(world)] if rank == ROOT else None
        dist.gather(inp, outs, dst=ROOT, algorithm=algorithm)
        buf = torch.cat(outs) if outs is not None else inp
    elif op == "scatter":
        buf = torch.zeros(m, dtype=torch.float64)
        ins = list(_blocks(ROOT, world, world, m).split(m)) if rank == ROOT else None
        dist.scatter(buf, ins, src=ROOT, algorithm=algorithm)
    elif op == "all_to_all":
        buf = torch.zeros(world * m, dtype=torch.float64)
        dist.all_to_all_single(buf, _blocks(rank, world, world, m), algorithm=algorithm)
    else:
        buf = None
        dist.barrier(algorithm=algorithm)
    dist.destroy_process_group()
    return snapshot(buf) if buf is not None else []


def collective_run(
    op: str,
    algorithm: str,
    world: int,
    nbytes: int,
    topology: str = "switch",
    seed: int = 0,
    record_steps: bool = True,
) -> Any:
    """A ``SimResult`` of one ``op`` with ``algorithm`` on ``world`` simulated ranks.

    The inputs are float64 and encode their origin (see the module doc); the encoding,
    the layout and each rank's final values are in ``result.trace.meta["visualize"]``.
    ``nbytes`` is the cost model's size (``simdist.algorithms`` module doc): the buffer
    for all_reduce/broadcast/reduce, the p-block buffer for all_gather, reduce_scatter,
    all_to_all, gather and scatter (rounded down to whole float64 blocks, at least one
    element each). The root of rooted ops is rank 0. Pure: the same arguments give the
    same trace, so callers may cache on them.

    Args:
        op: a collective of ``simdist.algorithms`` (``"all_reduce"``, ``"broadcast"``, ...).
        algorithm: one of that collective's algorithms (``"ring"``, ``"binomial"``, ...).
        world: the number of ranks.
        nbytes: the message size of the cost model, in bytes.
        topology: a name from ``simdist.TOPOLOGIES`` or a topology file.
        seed: the scheduler's seed.
        record_steps: record each step's buffer snapshot (for :func:`buffer_table`).

    Returns:
        The ``SimResult`` (``values``, ``trace``, ``schedule``, ``time``).

    Raises:
        ValueError: for an unknown op, algorithm or topology, ``world < 1`` or ``nbytes < 0``.

    Example:
        >>> from simdist.visualize import collective_run
        >>> res = collective_run("all_reduce", "ring", 4, 64)    # 8 float64 per rank
        >>> res.values[0]                                      # 1 + 2 + 4 + 8 everywhere
        [15.0, 15.0, 15.0, 15.0, 15.0, 15.0, 15.0, 15.0]
    """
    if op not in ALGORITHMS:
        raise ValueError(f"op={op!r} is not a collective; expected one of {sorted(ALGORITHMS)}")
    if algorithm not in ALGORITHMS[op]:
        raise ValueError(f"algorithm={algorithm!r} is not a {op} algorithm; expected one of {sorted(ALGORITHMS[op])}")
    if not isinstance(world, int) or world < 1:
        raise ValueError(f"world={world!r} must be a positive int")
    if not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"nbytes={nbytes!r} must be a non-negative int")
    n = max(1, nbytes // 8)
    m = max(1, nbytes // 8 // world)
    if op == "barrier" or (op in REDUCING and world > MAX_BITS_WORLD):
        encoding = "none"
    else:
        encoding = "bits" if op in REDUCING else "blocks"
    res = dist.simulate(
        _program,
        world,
        args=(op, algorithm, world, n, m, encoding),
        seed=seed,
        topology=topology,
        detail="messages",
        record_steps=record_steps,
        leaks="ignore",
    )
    res.trace.meta["visualize"] = {
        "op": op,
        "algorithm": algorithm,
        "world": world,
        "nbytes": nbytes,
        "topology": topology,
        "encoding": encoding,
        "elements": n if op in ("all_reduce", "reduce", "broadcast") else m,
        "root": ROOT,
        "final": list(res.values),
    }
    return res


def layout_chunk(op: str, rank: int, pos: int, world: int, elements: int) -> int | None:
    """The block (chunk) of position ``pos`` of the buffer that ``op``'s trace snapshots on ``rank``."""
    return layout_chunks(op, rank, pos + 1, world, elements)[pos]


def layout_chunks(op: str, rank: int, count: int, world: int, elements: int) -> list[int | None]:
    """The block (chunk) of each of the first ``count`` positions of ``op``'s snapshot buffer on ``rank``."""
    if op in ("all_reduce", "reduce", "broadcast"):
        out: list[int | None] = []
        for j, (_, length) in enumerate(chunk_bounds(elements, world)):
            out += [j] * min(length, count - len(out))
            if len(out) >= count:
                break
        return out + [None] * (count - len(out))
    if op in ("all_gather", "all_to_all") or (op == "gather" and rank == ROOT):
        return [i // elements for i in range(count)]
    if op in ("reduce_scatter", "scatter", "gather"):
        return [rank] * count
    return [None] * count


@functools.lru_cache(maxsize=65536)
def decode(value: float, encoding: str, world: int) -> tuple[tuple[int, ...], int | None]:
    """``(ranks, source_chunk)`` a value came from under ``encoding``; ``((), None)`` for "empty"."""
    if encoding == "bits":
        v = int(value)
        if v != value or v < 0:
            return (), None
        return tuple(r for r in range(world) if v >> r & 1), None
    if encoding == "blocks":
        v = int(value)
        if v != value or v < 1:
            return (), None
        return ((v - 1) % world,), (v - 1) // world
    return (), None
