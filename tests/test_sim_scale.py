"""Thousands of simulated ranks at ``detail="collectives"``: right values, one trace event per rank, memory per rank.

What a rank costs must not grow with the world: a rank's default group holds the world's ranks,
and a copy of them per rank (with an int object for each rank above 256) made a world of 4096
ranks hold 16 million references. No timing is asserted; the timeouts only bound a hung run.
"""

from __future__ import annotations

import tracemalloc

import pytest
import torch

import simdist as dist

pytestmark = pytest.mark.timeout(300)


def _one_all_reduce(rank: int) -> float:
    dist.init_process_group("gloo")
    t = torch.ones(256, dtype=torch.float32)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return float(t[0])


def _default_group(rank: int) -> tuple:
    dist.init_process_group("gloo")
    world = dist.group.WORLD
    out = (dist.get_rank(), dist.get_world_size(), dist.get_process_group_ranks(world),
           dist.get_group_rank(world, rank), dist.get_global_rank(world, rank))
    dist.destroy_process_group()
    return out


def test_world_2048_all_reduce_at_collectives_detail():
    n = 2048
    res = dist.simulate(_one_all_reduce, n, detail="collectives", leaks="ignore")
    assert res.values == [float(n)] * n  # every rank's ones, summed over the world
    events = [e for e in res.trace.events if e.kind == "collective"]
    assert sorted(e.rank for e in events) == list(range(n))  # one collective event per rank
    assert {e.op for e in events} == {"all_reduce"}
    assert len({e.collective_id for e in events}) == 1
    assert {e.nbytes for e in events} == {256 * 4}
    assert res.leaks == []


def test_thousand_ranks_replay_exactly():
    n = 1024
    first = dist.simulate(_one_all_reduce, n, detail="collectives", leaks="ignore", seed=7)
    again = dist.simulate(_one_all_reduce, n, detail="collectives", leaks="ignore", schedule=first.schedule)
    assert again.values == first.values == [float(n)] * n
    assert again.choices == first.choices
    key = [(e.rank, e.kind, e.op, e.t_start, e.t_end) for e in first.trace.events]
    assert [(e.rank, e.kind, e.op, e.t_start, e.t_end) for e in again.trace.events] == key


def test_default_group_knows_every_rank():
    n = 300  # ranks above 256 are int objects of their own
    res = dist.simulate(_default_group, n, leaks="ignore")
    assert res.values == [(r, n, list(range(n)), r, r) for r in range(n)]


def _peak_bytes_per_rank(n: int) -> float:
    tracemalloc.start()
    try:
        dist.simulate(_one_all_reduce, 2, detail="collectives", leaks="ignore")  # (imports, caches)
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        dist.simulate(_one_all_reduce, n, detail="collectives", leaks="ignore")
        return (tracemalloc.get_traced_memory()[1] - base) / n
    finally:
        tracemalloc.stop()


def test_memory_per_rank_does_not_grow_with_the_world():
    small, large = _peak_bytes_per_rank(256), _peak_bytes_per_rank(1024)
    # with a copy of the world's ranks per rank, a rank of the larger world held ~24 KiB more
    assert large < 1.3 * small + 4096, (small, large)
