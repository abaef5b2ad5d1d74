"""How rank threads wake (an eventfd each in small runs, a Lock in large ones) changes nothing but speed."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from simdist.backends.sim import _engine

import simdist
import simdist as dist

pytestmark = pytest.mark.timeout(180)


def _mixed(rank: int, rounds: int) -> list:
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    t = torch.full((3,), float(rank))
    seen = []
    for i in range(rounds):
        if i % 3 == 0:
            dist.all_reduce(t)
        elif i % 3 == 1:
            work = dist.isend(t.clone(), (rank + 1) % world)
            seen.append(dist.recv(torch.zeros(3), None))  # any source: a scheduler choice
            work.wait()
        else:
            dist.barrier()
    dist.destroy_process_group()
    return [t.tolist(), seen]


def _run(size: int, seed: int):
    res = simdist.simulate(_mixed, size, (7,), seed=seed)
    return res.values, res.choices, res.trace.to_json()


@pytest.mark.parametrize("seed", [0, 1])
def test_locks_and_eventfds_give_the_same_run(monkeypatch, seed):
    with_fds = _run(4, seed)
    monkeypatch.setattr(_engine, "WAKE_FDS", 0)
    assert _run(4, seed) == with_fds


def test_a_run_larger_than_wake_fds_computes_the_same():
    """Ranks past WAKE_FDS wake through Locks; the sums are what arithmetic says (ranks 0..n-1 summed)."""
    size = _engine.WAKE_FDS + 3
    values = simdist.simulate(_mixed, size, (4,), seed=2).values
    total = float(sum(range(size)))
    # after two all_reduces (rounds 0 and 3) every entry is size * (sum of ranks)
    assert all(v[0] == [size * total] * 3 for v in values)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _fails(rank: int) -> None:
    dist.init_process_group("gloo")
    if rank == 1:
        raise ValueError("rank 1 fails")
    dist.recv(torch.zeros(1), src=1)


def _deadlocks(rank: int) -> None:
    dist.init_process_group("gloo")
    dist.recv(torch.zeros(1), src=(rank + 1) % 3)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts /proc/self/fd")
def test_runs_leave_no_file_descriptor_open():
    simdist.simulate(_mixed, 3, (3,))  # (imports and first-run set-up out of the count)
    before = _open_fds()
    for _ in range(5):
        simdist.simulate(_mixed, 4, (4,))
        with pytest.raises(simdist.RankError):
            simdist.simulate(_fails, 3)
        with pytest.raises(simdist.DeadlockError):
            simdist.simulate(_deadlocks, 3)
    assert _open_fds() == before
