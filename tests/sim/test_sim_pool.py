"""Rank threads reused between runs (RankPool): each run gives exactly what a run on new threads gives."""

from __future__ import annotations

import os
import random
import sys
import threading

import numpy as np
import pytest
import torch

import simdist
import simdist.testing as sdt
from simdist.backends.sim import PCTStrategy, RankPool, simulate
from simdist.testing._explore import run_seed

pytestmark = pytest.mark.timeout(120)

WORLD = 4


def exchange(rank: int) -> tuple:
    """all_reduce, a ring exchange, then draws from every global generator; leaves state behind on purpose."""
    simdist.init_process_group("gloo")
    t, buf = torch.ones(4) * (rank + 1), torch.zeros(4)
    simdist.all_reduce(t)
    works = [simdist.isend(t, dst=(rank + 1) % WORLD), simdist.irecv(buf, src=(rank - 1) % WORLD)]
    for work in works:
        work.wait()
    seen_env = os.environ.get("SIMDIST_POOL_TEST")
    os.environ["SIMDIST_POOL_TEST"] = str(rank)  # a fresh run never sees this
    grad = torch.is_grad_enabled()
    torch.set_grad_enabled(False)  # nor this
    draws = (random.random(), float(np.random.rand()), float(np.random.randn()), torch.rand(2).tolist())
    simdist.barrier()
    simdist.destroy_process_group()
    return buf.tolist(), draws, seen_env, grad, threading.get_ident()


def _seeded_draws(rank: int) -> tuple:
    """What ``exchange`` draws on ``rank``, from generators of its own seeded with ``rank``."""
    legacy = np.random.RandomState(rank)
    return (
        random.Random(rank).random(),
        float(legacy.rand()),
        float(legacy.randn()),
        torch.rand(2, generator=torch.Generator().manual_seed(rank)).tolist(),
    )


def _same_run(a, b) -> None:
    assert [v[:4] for v in a.values] == [v[:4] for v in b.values]
    assert a.choices == b.choices and a.schedule == b.schedule and a.points == b.points
    assert a.trace.to_json() == b.trace.to_json()


def _run(i: int, pool: RankPool | None, **options):
    return simulate(
        exchange,
        WORLD,
        strategy=PCTStrategy(run_seed(7, i), 3, 40),
        check_buffers=True,
        leaks="ignore",
        pool=pool,
        **options,
    )


def test_pooled_runs_equal_fresh_runs_and_reuse_one_thread_per_rank():
    with RankPool() as pool:
        pooled = [_run(i, pool) for i in range(12)]
    fresh = [_run(i, None) for i in range(12)]
    for a, b in zip(pooled, fresh):
        _same_run(a, b)
    assert len({tuple(r.choices) for r in fresh}) > 1  # the schedules differ from run to run
    for res in pooled:
        assert all(v[2] is None and v[3] is True for v in res.values)  # no environment or grad mode carried over
        assert [v[1] for v in res.values] == [_seeded_draws(r) for r in range(WORLD)]  # each run starts seeded
    # one thread per rank for all 12 pooled runs; fresh runs use new threads
    assert [len({res.values[r][4] for res in pooled}) for r in range(WORLD)] == [1] * WORLD
    ended = [t for t in threading.enumerate() if t.ident in {v[4] for res in pooled for v in res.values}]
    assert ended == []  # closing the pool ended its threads


def _fails_on_rank_2(rank: int) -> int:
    simdist.init_process_group("gloo")
    simdist.barrier()
    if rank == 2:
        raise ValueError("rank 2 fails")
    simdist.barrier()
    simdist.destroy_process_group()
    return rank


def _deadlocks(rank: int) -> None:
    simdist.init_process_group("gloo")
    if rank == 0:
        simdist.recv(torch.zeros(1), src=1)  # nobody sends
    simdist.destroy_process_group()


def test_failed_runs_leave_the_pool_usable_and_runs_unchanged():
    with RankPool() as pool:
        for bad, err in ((_fails_on_rank_2, simdist.RankError), (_deadlocks, simdist.DeadlockError)):
            with pytest.raises(err):
                simulate(bad, WORLD, seed=3, pool=pool, leaks="ignore")
            _same_run(_run(5, pool), _run(5, None))


def test_timed_out_run_gets_new_thread_for_the_stuck_rank(monkeypatch):
    """A rank stuck past the run's timeout keeps its thread busy: the next run gets a new thread for that rank."""
    from simdist.backends.sim import _engine

    monkeypatch.setattr(_engine, "STOP_WAIT", 0.5)
    release, blocked = threading.Event(), []

    def stuck(rank: int) -> int:
        if rank == 1 and not blocked:
            blocked.append(rank)
            release.wait(60)  # blocked in C code, where Abort cannot reach it
        return threading.get_ident()

    with RankPool() as pool:
        try:
            with pytest.raises(simdist.DistTimeoutError, match="did not stop"):
                simulate(stuck, 2, seed=0, timeout=0.5, pool=pool)
            first = pool.workers[1]
            assert first.busy()
            again = simulate(stuck, 2, seed=0, pool=pool).values
            assert pool.workers[1] is not first and again[1] == pool.workers[1].thread.ident
        finally:
            release.set()
    first.thread.join(30)
    assert not first.thread.is_alive()  # it ended once its job returned


def test_explore_runs_on_one_pool_and_leaves_no_thread():
    before = {t.ident for t in threading.enumerate()}
    idents: set = set()

    def program(rank: int) -> None:
        idents.add(threading.get_ident())
        exchange(rank)

    summary = sdt.explore(program, WORLD, strategy="random", max_runs=20, seed=0, progress=False)
    assert summary.runs == 20
    assert len(idents) == WORLD  # 20 runs x 4 ranks on 4 threads
    assert [t for t in threading.enumerate() if t.ident not in before and t.name.startswith("simdist-rank-")] == []


def test_pool_argument_is_checked():
    with pytest.raises(TypeError, match=r"pool=3 must be a simdist.backends.sim.RankPool"):
        simulate(exchange, WORLD, pool=3)
    pool = RankPool()
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        simulate(exchange, WORLD, pool=pool)


def test_explore_puts_back_the_process_generators_environment_and_stdout():
    def draws() -> tuple:
        return random.random(), float(np.random.rand()), float(np.random.randn()), torch.rand(1).item()

    random.seed(11), np.random.seed(11), torch.manual_seed(11)
    float(np.random.randn())  # a cached normal pending in numpy's state
    expected = draws()
    random.seed(11), np.random.seed(11), torch.manual_seed(11)
    float(np.random.randn())
    environ, stdout = os.environ, sys.stdout
    sdt.explore(exchange, WORLD, strategy="pct", max_runs=6, seed=0, progress=False)
    assert os.environ is environ and sys.stdout is stdout and "SIMDIST_POOL_TEST" not in os.environ
    assert draws() == expected


def test_each_run_starts_from_the_environment_as_it_is_when_the_run_starts(monkeypatch):
    def read(rank: int) -> str | None:
        return os.environ.get("SIMDIST_POOL_X")

    seen = []
    with RankPool() as pool:
        for value in ("1", "2", None, "3"):
            if value is None:
                monkeypatch.delenv("SIMDIST_POOL_X")
            else:
                monkeypatch.setenv("SIMDIST_POOL_X", value)
            seen.append(simulate(read, 2, seed=0, pool=pool).values)
    assert seen == [["1", "1"], ["2", "2"], [None, None], ["3", "3"]]


def torch_program(rank: int, fail: bool) -> list:
    """torch.distributed's own API on a simulated rank; with ``fail``, rank 1 raises before destroying the group."""
    import torch.distributed as tdist

    tdist.init_process_group("gloo")
    t = torch.ones(2) * (rank + 1)
    tdist.all_reduce(t)
    if fail and rank == 1:
        raise ValueError("left without destroy_process_group")
    tdist.destroy_process_group()
    return t.tolist()


def test_a_failed_torch_run_leaves_no_process_group_on_the_reused_threads():
    """torch registers process groups per thread (its isolation mode): a run that failed before
    destroying its group must not leave the name registered for the next run on the same thread."""
    fresh = simulate(torch_program, 2, (False,)).values
    with RankPool() as pool:
        with pytest.raises(simdist.RankError, match="left without destroy_process_group"):
            simulate(torch_program, 2, (True,), pool=pool)
        assert simulate(torch_program, 2, (False,), pool=pool).values == fresh == [[3.0, 3.0]] * 2
