"""The mismatch corpus: the k-th collective on a group must agree on every rank."""

from __future__ import annotations

import functools
import os

import pytest
import torch

import simdist
import simdist as dist

HERE = os.path.basename(__file__)


def _prog(variant):
    """The program whose rank 1 calls its collective differently as ``variant`` says (it pickles: a rank process runs it)."""
    return functools.partial(mismatched, variant=variant)


def mismatched(rank, variant):
    dist.init_process_group("gloo")
    odd = rank == 1
    t = torch.ones(4)
    if variant == "op":
        dist.broadcast(t, src=0) if odd else dist.all_reduce(t)
    elif variant == "dtype":
        dist.all_reduce(t.double() if odd else t)
    elif variant == "shape":
        dist.all_reduce(torch.ones(5) if odd else t)
    elif variant == "reduce_op":
        dist.all_reduce(t, op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM)
    elif variant == "root":
        dist.broadcast(t, src=1 if odd else 0)
    elif variant == "async_op":
        w = dist.all_reduce(t, async_op=odd)
        if w is not None:
            w.wait()
    elif variant == "algorithm":
        dist.all_reduce(t, algorithm="ring" if odd else "recursive_doubling")
    elif variant == "gather_dst":
        dist.gather(t, [torch.zeros(4) for _ in range(3)] if rank == (2 if odd else 0) else None, dst=2 if odd else 0)
    elif variant == "new_group":
        dist.new_group([0, 1] if odd else [0, 2])
    elif variant == "barrier_vs_all_gather":
        if odd:
            dist.barrier()
        else:
            dist.all_gather([torch.zeros(4) for _ in range(3)], t)


VARIANTS = {
    "op": {"op"},
    "dtype": {"dtype"},
    "shape": {"shape"},
    "reduce_op": {"reduce_op"},
    "root": {"root"},
    "async_op": {"async_op"},
    "algorithm": {"algorithm"},
    "gather_dst": {"root"},
    "new_group": {"ranks"},
    "barrier_vs_all_gather": {"op"},
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_mismatch_is_reported_the_same_with_ranks_as_processes(variant):
    errors = []
    for isolation in ("threads", "processes"):
        with pytest.raises(simdist.CollectiveMismatchError) as info:
            simdist.simulate(_prog(variant), 3, seed=1, isolation=isolation)
        errors.append(info.value)
    threads, processes = errors
    assert str(processes) == str(threads) and processes.fields == threads.fields
    assert processes.call_sites == threads.call_sites and processes.choices == threads.choices


@pytest.mark.timeout(30)
@pytest.mark.parametrize("detail", ["messages", "collectives"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_mismatch_is_reported(variant, detail):
    with pytest.raises(simdist.CollectiveMismatchError) as info:
        simdist.simulate(_prog(variant), 3, detail=detail, seed=1)
    err = info.value
    assert 1 in err.ranks and len(err.ranks) == 2
    assert VARIANTS[variant] <= set(err.fields), err.fields
    assert all(HERE in site for site in err.call_sites), err.call_sites
    assert err.schedule and err.schedule in str(err)
    for name in VARIANTS[variant]:
        assert name in str(err)


def test_mismatch_is_detected_when_the_second_rank_arrives():
    seen = []

    def program(rank):
        dist.init_process_group("gloo")
        seen.append(rank)
        dist.all_reduce(torch.ones(2 if rank == 0 else 3))
        seen.append(("after", rank))

    with pytest.raises(simdist.CollectiveMismatchError):
        simdist.simulate(program, 2, strategy="round_robin")
    assert ("after", 0) not in seen and ("after", 1) not in seen


def test_all_to_all_split_sizes_that_disagree_are_an_error():
    def program(rank):
        dist.init_process_group("gloo")
        inp = torch.arange(4.0)
        out = torch.zeros(4)
        splits = [1, 3] if rank == 0 else [2, 2]
        dist.all_to_all_single(out, inp, output_split_sizes=[2, 2], input_split_sizes=splits)

    for detail in ("messages", "collectives"):
        with pytest.raises(simdist.DistError):
            simdist.simulate(program, 2, detail=detail)


def test_p2p_dtype_mismatch_names_both_sides():
    def program(rank):
        dist.init_process_group("gloo")
        if rank == 0:
            dist.send(torch.zeros(2, dtype=torch.float32), dst=1)
        else:
            dist.recv(torch.zeros(2, dtype=torch.int32), src=0)

    with pytest.raises(simdist.DistError, match="send 0->1.*float32.*recv 1<-0.*int32"):
        simdist.simulate(program, 2)
