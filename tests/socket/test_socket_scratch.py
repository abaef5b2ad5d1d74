"""The socket backend's scratch pool: buffers of finished collectives lent again, never while in use."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from simdist.backends.socket._scratch import ScratchPool

import simdist
import simdist as dist

pytestmark = pytest.mark.timeout(120)


def test_a_buffer_given_back_is_lent_again_for_the_same_kind_dtype_and_length() -> None:
    pool = ScratchPool()
    like = torch.zeros(3)
    key, buf = pool.take(like, 8)
    pool.give(key, buf)
    assert pool.take(like, 8)[1] is buf
    pool.give(key, buf)
    assert pool.take(torch.zeros(3, dtype=torch.float64), 8)[1] is not buf  # another dtype
    assert pool.take(like, 9)[1] is not buf  # another length
    assert pool.take(np.zeros(3, dtype=np.float32), 8)[1] is not buf  # another kind of array
    again = pool.take(like, 8)[1]
    assert again is buf and again.dtype == torch.float32 and again.shape == (8,)


def test_large_buffers_are_not_kept_and_the_pool_stays_small() -> None:
    pool = ScratchPool()
    like = torch.zeros(1, dtype=torch.uint8)
    key, big = pool.take(like, ScratchPool.MAX_BYTES + 1)
    assert key is None
    pool.give(key, big)
    assert pool.take(like, ScratchPool.MAX_BYTES + 1)[1] is not big
    taken = [pool.take(like, 4) for _ in range(ScratchPool.KEEP + 2)]
    for key, buf in taken:
        pool.give(key, buf)
    kept = [pool.take(like, 4)[1] for _ in range(ScratchPool.KEEP + 2)]
    assert sum(any(b is k for _, b in taken) for k in kept) == ScratchPool.KEEP
    for n in range(ScratchPool.KINDS + 5):
        pool.give(*pool.take(like, 100 + n))
    assert len(pool._free) <= ScratchPool.KINDS


def reuses_scratch(rank, world_size):
    """Collectives that use scratch, each three times with new values (a lent buffer holds the last call's
    data): the results against sums computed here, and the sizes the pool kept."""
    from simdist.core._world import current_world

    dist.init_process_group("gloo")
    wrong = []
    for it in range(3):
        for dtype in (torch.float32, torch.int64, torch.float64):
            for n in (1, 5, 1000):
                for algorithm in ("recursive_doubling", "rabenseifner", "ring"):
                    t = (torch.arange(n) * (rank + 1) + it).to(dtype)
                    dist.all_reduce(t, algorithm=algorithm)
                    want = (torch.arange(n) * sum(range(1, world_size + 1)) + it * world_size).to(dtype)
                    if not torch.equal(t, want):
                        wrong.append(("all_reduce", algorithm, dtype, n, it))
        mine = torch.arange(world_size * 4, dtype=torch.float32) + 100 * rank + it
        out = torch.zeros(world_size * 4)
        dist.all_to_all_single(out, mine, algorithm="bruck")
        want = torch.cat([torch.arange(4, dtype=torch.float32) + 4 * rank + 100 * r + it for r in range(world_size)])
        if not torch.equal(out, want):
            wrong.append(("all_to_all", it))
    kept = sorted(key[-1] for key, free in current_world().network.scratch._free.items() if free)
    dist.destroy_process_group()
    return wrong, kept


def test_collectives_that_reuse_scratch_buffers_give_exact_results() -> None:
    for wrong, kept in simdist.spawn(reuses_scratch, args=(3,), nprocs=3, backend="socket"):
        assert wrong == []
        assert 1000 in kept  # a recursive doubling's buffer of 1000 elements was kept (and lent again)


def fails_while_lent(rank, world_size):
    """Rank 0 alone in an all_reduce of 7 elements on a group with a short timeout: its scratch, lent to a
    receive that never completes, must not go back to the pool; a finished all_reduce's does."""
    from simdist.core._world import current_world

    dist.init_process_group("gloo")
    group = dist.new_group(list(range(world_size)), timeout=1)
    if rank == 0:
        with pytest.raises(simdist.DistTimeoutError):
            dist.all_reduce(torch.ones(7), group=group, algorithm="recursive_doubling")
    dist.barrier()
    dist.all_reduce(torch.ones(5), algorithm="recursive_doubling")
    kept = sorted(key[-1] for key, free in current_world().network.scratch._free.items() if free)
    dist.destroy_process_group()
    return kept


def test_a_failed_collective_does_not_give_its_scratch_back(monkeypatch) -> None:
    monkeypatch.setenv("SIMDIST_CHECK_COLLECTIVES", "0")  # the algorithm itself must be what times out
    kept0, kept1 = simdist.spawn(fails_while_lent, args=(2,), nprocs=2, backend="socket", timeout=20)
    assert 7 not in kept0 and 5 in kept0
    assert kept1 == [5]
