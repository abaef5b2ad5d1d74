"""One DDP training step on the simulator, and its Gantt chart: backward per parameter, all-reduce per bucket.

``ddp_run`` simulates a stack of ``nn.Linear`` layers wrapped in
``simdist.DistributedDataParallel``: construction (a model check, then every parameter
broadcast from rank 0), one forward and one backward. ``ddp_gantt`` reads its trace:

- each ``compute`` event with op ``'backward'`` is one parameter's gradient (DDP charges
  it a modelled cost as the gradient becomes ready); the run notes the order in which
  gradients became ready on each rank, which names the events in turn;
- bucket ``i``'s all-reduce is the ``i``-th ``all_reduce`` collective that starts on a
  rank once its backward has begun (DDP launches buckets strictly in order), and its size
  must be the bucket's;
- every collective before that (the ``all_gather`` of the model check, the ``broadcast``
  of each parameter) belongs to DDP's construction.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import simdist as dist
from simdist.core._trace import Event, Trace

__all__ = ["DdpBar", "DdpBucket", "DdpGantt", "DdpRun", "ddp_gantt", "ddp_run"]


@dataclass(frozen=True, slots=True)
class DdpBucket:
    """One gradient bucket: its parameters' names (in bucket order) and its size in bytes."""

    index: int
    params: tuple[str, ...]
    nbytes: int


@dataclass(frozen=True, slots=True)
class DdpRun:
    """A simulated DDP step: its trace, the buckets (in reduction order), the gradient order per rank.

    Attributes:
        sizes: each parameter's name -> number of elements.
        ready: rank -> parameter names in the order their gradients became ready.
    """

    world: int
    trace: Trace
    buckets: tuple[DdpBucket, ...]
    sizes: dict[str, int]
    ready: dict[int, tuple[str, ...]]


def _step(rank: int, widths: tuple[int, ...], cap_mb: float) -> tuple:
    """One rank: build the model, wrap it in DDP, run one forward and backward; note the gradient order."""
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(a, b) for a, b in itertools.pairwise(widths)])
    ddp = dist.DistributedDataParallel(model, bucket_cap_mb=cap_mb)
    ready: list[str] = []
    for name, p in model.named_parameters():  # registered after DDP's hooks: each runs right after DDP's
        p.register_post_accumulate_grad_hook(lambda p, name=name: ready.append(name))
    x = torch.randn(8, widths[0], generator=torch.Generator().manual_seed(rank))
    ddp(x).pow(2).mean().backward()
    names = {p: n for n, p in model.named_parameters()}
    buckets = [[(names[p], p.numel() * p.element_size()) for p in b.params] for b in ddp._buckets]
    sizes = {n: p.numel() for n, p in model.named_parameters()}
    dist.destroy_process_group()
    return buckets, sizes, ready


def ddp_run(world: int, widths: Sequence[int], bucket_cap_mb: float, topology: Any = None, seed: int = 0) -> DdpRun:
    """One DDP step of ``nn.Sequential(Linear(widths[0], widths[1]), ...)`` on ``world`` simulated ranks.

    Args:
        world: the number of ranks (at least 2).
        widths: the layer widths (at least two, positive).
        bucket_cap_mb: DDP's bucket cap in MB (positive).
        topology: a topology for ``simulate``; default ``'switch'``.
        seed: the scheduler's seed.

    Returns:
        A ``DdpRun``: ``world``, ``trace``, ``buckets`` (parameter names per bucket), ``sizes``,
        ``ready``.

    Raises:
        ValueError: for a world below 2, fewer than two widths or a non-positive width or cap.

    Example:
        >>> from simdist.visualize import ddp_run
        >>> run = ddp_run(2, [4, 8, 2], bucket_cap_mb=0.0001)    # a tiny cap: two buckets
        >>> run.world, len(run.buckets)
        (2, 2)
    """
    if isinstance(world, bool) or not isinstance(world, int) or world < 2:
        raise ValueError(f"world={world!r} must be an int of at least 2")
    widths = tuple(widths)
    if len(widths) < 2 or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in widths):
        raise ValueError(f"widths={widths!r} must be two or more positive ints (layer i maps widths[i] to widths[i+1])")
    if not bucket_cap_mb > 0:
        raise ValueError(f"bucket_cap_mb={bucket_cap_mb!r} must be a positive number of MiB")
    res = dist.simulate(_step, world, args=(widths, bucket_cap_mb), topology=topology, seed=seed)
    buckets, sizes, _ = res.values[0]
    return DdpRun(
        world,
        res.trace,
        tuple(DdpBucket(i, tuple(n for n, _ in b), sum(s for _, s in b)) for i, b in enumerate(buckets)),
        dict(sizes),
        {r: tuple(v[2]) for r, v in enumerate(res.values)},
    )


@dataclass(frozen=True, slots=True)
class DdpBar:
    """One bar of the Gantt chart (seconds).

    ``kind`` is ``'backward'`` (one parameter's gradient; ``label`` is its name),
    ``'all_reduce'`` (bucket ``bucket``'s all-reduce; ``label`` is ``'bucket i'``) or
    ``'construction'`` (DDP's constructor: the model check and the parameter broadcast,
    from its first collective's start to its last one's end; ``label`` says so).
    """

    rank: int
    kind: str
    label: str
    t_start: float
    t_end: float
    bucket: int | None
    collective_id: int | None


@dataclass(frozen=True, slots=True)
class DdpGantt:
    """Everything the DDP Gantt chart draws, in virtual seconds.

    Attributes:
        bars: per rank, its construction bar, its gradients and its buckets' all-reduces, by start.
        backward: rank -> (start of its first gradient, end of its last).
        overlapped: rank -> how many bucket all-reduces started before its backward ended.
        construction: rank -> how many collectives its DDP construction ran, by op.
    """

    world: int
    buckets: tuple[DdpBucket, ...]
    bars: tuple[DdpBar, ...]
    backward: dict[int, tuple[float, float]]
    overlapped: dict[int, int]
    construction: dict[int, dict[str, int]]
    duration: float


def _on_rank(trace: Trace, rank: int) -> list[Event]:
    order = {id(e): i for i, e in enumerate(trace.events)}
    mine = [e for e in trace.events if e.rank == rank and e.kind in ("compute", "collective")]
    return sorted(mine, key=lambda e: (e.t_start, order[id(e)]))


def _rank_bars(run: DdpRun, rank: int) -> tuple[list[DdpBar], tuple[float, float], int, dict[str, int]]:
    events = _on_rank(run.trace, rank)
    grads = [e for e in events if e.kind == "compute" and e.op == "backward"]
    names = run.ready.get(rank, ())
    if not grads or len(grads) != len(names):
        raise ValueError(
            f"rank {rank}: the trace has {len(grads)} backward events but the run noted {len(names)} "
            "gradients; expected one event per gradient"
        )
    start, end = grads[0].t_start, max(e.t_end for e in grads)
    where = {n: b.index for b in run.buckets for n in b.params}
    bars = [DdpBar(rank, "backward", n, e.t_start, e.t_end, where.get(n), None) for n, e in zip(names, grads)]
    reduces = [e for e in events if e.kind == "collective" and e.op == "all_reduce" and e.t_start >= start]
    if len(reduces) != len(run.buckets):
        raise ValueError(
            f"rank {rank}: {len(reduces)} all-reduces started in backward for {len(run.buckets)} "
            "buckets; expected one per bucket"
        )
    for b, e in zip(run.buckets, reduces):
        if e.nbytes != b.nbytes:
            raise ValueError(
                f"rank {rank}: the all-reduce of bucket {b.index} moved {e.nbytes} bytes; expected "
                f"the bucket's {b.nbytes}"
            )
        bars.append(DdpBar(rank, "all_reduce", f"bucket {b.index}", e.t_start, e.t_end, b.index, e.collective_id))
    built = [e for e in events if e.kind == "collective" and e not in reduces and e.t_start < start]
    ops: dict[str, int] = {}
    for e in built:
        ops[e.op] = ops.get(e.op, 0) + 1
    if built:
        bars.append(
            DdpBar(
                rank,
                "construction",
                "DDP construction: model check + parameter broadcast",
                min(e.t_start for e in built),
                max(e.t_end for e in built),
                None,
                None,
            )
        )
    overlapped = sum(1 for e in reduces if e.t_start < end)
    return bars, (start, end), overlapped, ops


def ddp_gantt(run: DdpRun) -> DdpGantt:
    """The Gantt chart of ``run``: on each rank, construction, each gradient and each bucket's all-reduce.

    Args:
        run: a :func:`ddp_run`.

    Returns:
        A ``DdpGantt``: ``bars`` per rank, ``buckets``, ``backward``, ``overlapped``,
        ``construction``, ``duration``.

    Raises:
        ValueError: when the trace does not hold one backward event per gradient and one
            all-reduce of each bucket's size per bucket on every rank.

    Example:
        >>> from simdist.visualize import ddp_gantt, ddp_run
        >>> g = ddp_gantt(ddp_run(2, [4, 8, 2], bucket_cap_mb=0.0001))
        >>> g.world, len(g.buckets)
        (2, 2)
    """
    bars: list[DdpBar] = []
    backward, overlapped, construction = {}, {}, {}
    for r in range(run.world):
        mine, backward[r], overlapped[r], construction[r] = _rank_bars(run, r)
        bars += sorted(mine, key=lambda b: (b.t_start, b.kind))
    return DdpGantt(run.world, run.buckets, tuple(bars), backward, overlapped, construction, run.trace.duration())
