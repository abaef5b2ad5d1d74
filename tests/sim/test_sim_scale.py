"""Thousands of simulated ranks at ``detail="collectives"``: right values, one trace event per rank, memory per rank.

What a rank costs must not grow with the world: a rank's default group holds the world's ranks,
and a copy of them per rank (with an int object for each rank above 256) made a world of 4096
ranks hold 16 million references. No timing is asserted; the timeouts only bound a hung run.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import tracemalloc
import weakref

import pytest
import torch
from simdist.backends.sim._runner import FULL_PASS_EVERY, LARGE_WORLD

import simdist as dist

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.slow,
]  # slow: starts processes or explores many schedules (quick feedback: -m 'not slow')


def _one_all_reduce(rank: int) -> float:
    dist.init_process_group("gloo")
    t = torch.ones(256, dtype=torch.float32)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return float(t[0])


def _default_group(rank: int) -> tuple:
    dist.init_process_group("gloo")
    world = dist.group.WORLD
    out = (
        dist.get_rank(),
        dist.get_world_size(),
        dist.get_process_group_ranks(world),
        dist.get_group_rank(world, rank),
        dist.get_global_rank(world, rank),
    )
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


def _all_but_rank_0_all_reduce(rank: int) -> None:
    dist.init_process_group("gloo")
    if rank != 0:
        dist.all_reduce(torch.ones(4))


def test_deadlock_report_of_a_large_world_names_the_missing_rank():
    n = 2048
    with pytest.raises(dist.DeadlockError) as info:
        dist.simulate(_all_but_rank_0_all_reduce, n, detail="collectives", leaks="ignore")
    err = info.value
    assert sorted(b["rank"] for b in err.blocked) == list(range(1, n))
    assert all(b["op"] == "all_reduce" and b["missing"] == [0] for b in err.blocked)
    assert sorted(err.graph.edges) == [(r, 0) for r in range(1, n)]  # every blocked rank waits for rank 0 alone
    assert str(err).count("waiting for ranks [0] to join it (ranks [0] finished without calling it)") == n - 1
    err.blocked[1]["missing"].append(-1)  # each entry owns its list
    assert err.blocked[2]["missing"] == [0]


class _Node:
    def __init__(self) -> None:
        self.other = self  # a reference cycle: only the cyclic collector frees it


def _cycle_freed_in_rank(rank: int) -> bool:
    node = _Node()
    ref = weakref.ref(node)
    del node
    if rank == 0:
        gc.collect()
        return ref() is None
    return True


def test_collector_frees_cycles_made_during_a_large_run_and_the_freeze_state_is_put_back():
    n = LARGE_WORLD
    assert gc.get_freeze_count() == 0
    old = _Node()
    old_ref = weakref.ref(old)
    del old  # garbage from before the run
    seen = []

    def rank_fn(rank: int) -> bool:
        if rank == 0:
            seen.append(gc.get_freeze_count())
        return _cycle_freed_in_rank(rank)

    assert dist.simulate(rank_fn, n, detail="collectives").values == [True] * n
    assert seen[0] > 0  # the objects alive before the run were frozen while it ran
    assert gc.get_freeze_count() == 0  # and nothing is left frozen
    assert old_ref() is None  # young garbage was collected before freezing
    again = dist.simulate(rank_fn, 4)  # a small run freezes nothing
    assert again.values == [True] * 4 and seen[1] == 0


def test_a_programs_own_frozen_objects_stay_frozen():
    mine = [_Node()]
    gc.freeze()
    try:
        assert not any(o is mine for o in gc.get_objects())  # frozen: in no generation the collector scans
        assert dist.simulate(_cycle_freed_in_rank, LARGE_WORLD, detail="collectives").values == [True] * LARGE_WORLD
        assert not any(o is mine for o in gc.get_objects())  # still frozen
    finally:
        gc.unfreeze()
    assert any(o is mine for o in gc.get_objects())


_FUTEX_TABLE = """
import ctypes, threading
import simdist
prctl = ctypes.CDLL(None, use_errno=True).prctl
prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
slots = lambda: prctl(78, 2, 0, 0, 0)  # PR_FUTEX_HASH, PR_FUTEX_HASH_GET_SLOTS
t = threading.Thread(target=int); t.start(); t.join()  # (a threaded process has its table)
first = slots()
small = simdist.simulate(lambda rank: rank, 4).values == [0, 1, 2, 3]
after_small = slots()
large = simdist.simulate(lambda rank: rank, {n}, leaks="ignore").values == list(range({n}))
print(first, after_small, slots(), small and large)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="futex tables are Linux's")
def test_thousands_of_ranks_wait_on_the_kernels_shared_futex_table():
    out = subprocess.run(
        [sys.executable, "-c", _FUTEX_TABLE.format(n=LARGE_WORLD)],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    first, after_small, after_large, ok = out.stdout.split()
    assert ok == "True"
    if int(first) <= 0:
        pytest.skip("this kernel gives processes no private futex table (Linux before 6.16)")
    assert int(after_small) == int(first)  # a small run leaves the process's table alone
    assert int(after_large) == 0  # 0 slots: the kernel's shared table


def _engine_ref(refs: list):
    def rank_fn(rank: int) -> int:
        from simdist.core._world import thread_world

        dist.init_process_group("gloo")
        if rank == 0:
            refs.append(weakref.ref(thread_world().engine))
        t = torch.ones(4)
        dist.all_reduce(t)
        dist.destroy_process_group()
        return int(t[0])

    return rank_fn


@pytest.mark.parametrize("n", [4, LARGE_WORLD])
def test_a_finished_run_is_freed_without_the_collector(n):
    refs: list = []
    gc.collect()
    gc.disable()
    try:
        assert dist.simulate(_engine_ref(refs), n, detail="collectives").values == [n] * n
        assert refs[0]() is None  # freed by reference counting: no cycle was left for the collector
    finally:
        gc.enable()


def test_full_collections_wait_while_a_large_run_runs_and_the_thresholds_are_put_back():
    before = gc.get_threshold()
    seen = []

    def rank_fn(rank: int) -> int:
        if rank == 0:
            seen.append(gc.get_threshold())
        return rank

    assert dist.simulate(rank_fn, LARGE_WORLD, detail="collectives").values == list(range(LARGE_WORLD))
    assert seen[0] == (before[0], before[1], max(before[2], FULL_PASS_EVERY))
    assert gc.get_threshold() == before
    dist.simulate(rank_fn, 4)  # a small run changes nothing
    assert seen[1] == before
