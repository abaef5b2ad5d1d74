"""Ranks behave like processes: RNG isolation, stdout prefix, failing ranks, CUDA as CPU."""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest
import torch

import simdist
import simdist as dist

pytestmark = pytest.mark.slow  # slow: starts processes or explores many schedules (quick feedback: -m 'not slow')


def draws(rank, seed_rank0):
    dist.init_process_group("gloo")
    if rank == 0 and seed_rank0:
        random.seed(99)
        np.random.seed(99)
        torch.manual_seed(99)
    out = []
    for _ in range(4):
        out.append((random.random(), float(np.random.randn()), float(np.random.rand()), float(torch.rand(1))))
        dist.barrier()
    return out


def fresh(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return [
        (random.random(), float(np.random.randn()), float(np.random.rand()), float(torch.rand(1))) for _ in range(4)
    ]


@pytest.mark.parametrize("strategy", ["random", "round_robin"])
def test_seeding_one_rank_never_changes_another(strategy):
    plain = simdist.simulate(draws, 4, (False,), strategy=strategy, seed=1).values
    seeded = simdist.simulate(draws, 4, (True,), strategy=strategy, seed=2).values
    assert plain[1:] == seeded[1:]
    assert seeded[0] == fresh(99)
    for rank in range(4):
        assert plain[rank] == fresh(rank), f"rank {rank} starts seeded with its rank"


def test_caller_rng_state_is_restored():
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    expected = fresh(5)
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    simdist.simulate(draws, 3, (True,))
    got = [(random.random(), float(np.random.randn()), float(np.random.rand()), float(torch.rand(1))) for _ in range(4)]
    assert got == expected


def test_normal_cache_is_kept_per_rank():
    """numpy's legacy normal() caches a second value; a switch must keep it with its rank."""

    def program(rank):
        dist.init_process_group("gloo")
        out = []
        for _ in range(5):
            out.append(float(np.random.randn()))
            dist.barrier()
        return out

    res = simdist.simulate(program, 3, seed=4).values
    for rank in range(3):
        np.random.seed(rank)
        assert res[rank] == [float(np.random.randn()) for _ in range(5)]


def test_stdout_prefix(capsys):
    def program(rank):
        dist.init_process_group("gloo")
        print(f"hello from {rank}")
        print("two\nlines", end="!\n")
        dist.barrier()

    simdist.simulate(program, 2, prefix_output=True, strategy="round_robin")
    out = capsys.readouterr().out.splitlines()
    assert sorted(out) == sorted(
        [
            "[rank 0] hello from 0",
            "[rank 0] two",
            "[rank 0] lines!",
            "[rank 1] hello from 1",
            "[rank 1] two",
            "[rank 1] lines!",
        ]
    )
    simdist.simulate(program, 2)
    assert "[rank" not in capsys.readouterr().out


def test_failing_rank_unwinds_everyone():
    finally_ran = []

    def program(rank):
        dist.init_process_group("gloo")
        try:
            if rank == 2:
                raise ZeroDivisionError("rank 2 divides by zero")
            dist.barrier()
        finally:
            finally_ran.append(rank)

    before = threading.active_count()
    with pytest.raises(simdist.RankError) as info:
        simdist.simulate(program, 4)
    err = info.value
    assert err.rank == 2
    assert isinstance(err.__cause__, ZeroDivisionError)
    assert "rank 2 raised ZeroDivisionError: rank 2 divides by zero" in str(err)
    assert err.schedule and err.schedule in str(err)
    assert sorted(finally_ran) == [0, 1, 2, 3]
    assert threading.active_count() == before


def test_calls_after_failure_do_not_run():
    ran_after = []

    def program(rank):
        dist.init_process_group("gloo")
        if rank == 0:
            raise RuntimeError("stop")
        try:
            dist.barrier()
        finally:
            try:
                dist.barrier()
                ran_after.append(rank)
            except BaseException:
                pass

    with pytest.raises(simdist.RankError):
        simdist.simulate(program, 3)
    assert ran_after == []


def test_cuda_code_runs_on_cpu_without_a_gpu():
    def program(rank):
        dist.init_process_group("nccl")
        t = torch.ones(2, 2).to(rank)
        u = torch.zeros(2, device=f"cuda:{rank}").cuda()
        dist.all_reduce(t)
        return t.device.type, u.device.type, float(t.sum())

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: tensors really move to it")
    assert simdist.spawn(program, nprocs=2) == [("cpu", "cpu", 8.0)] * 2
    with pytest.raises(simdist.RankError):
        simdist.simulate(program, 2, cuda_as_cpu=False)


def test_world_is_per_rank_and_gone_after_the_run():
    def program(rank):
        dist.init_process_group("gloo")
        return dist.get_rank(), dist.get_world_size(), dist.is_initialized(), dist.get_backend()

    assert simdist.spawn(program, nprocs=3) == [(r, 3, True, "gloo") for r in range(3)]
    assert not dist.is_initialized()
    with pytest.raises(simdist.NotInitializedError, match="init_process_group"):
        dist.get_rank()


def test_nested_simulation_is_refused():
    def inner(rank):
        return rank

    def outer(rank):
        return simdist.simulate(inner, 2)

    with pytest.raises(simdist.RankError) as info:
        simdist.simulate(outer, 2)
    assert "cannot be nested" in str(info.value.__cause__)


def test_timeout_of_a_rank_stuck_outside_simdist():
    stop = threading.Event()

    def program(rank):
        dist.init_process_group("gloo")
        if rank == 0:
            stop.wait(30)
        dist.barrier()

    try:
        with pytest.raises(simdist.DistTimeoutError, match="timeout=0.5") as info:
            simdist.simulate(program, 2, timeout=0.5)
        assert info.value.schedule and info.value.schedule in str(info.value)
    finally:
        stop.set()
