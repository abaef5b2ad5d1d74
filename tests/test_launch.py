"""Launching like torch: spawn's parameters, and the names torch code checks first."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.multiprocessing as mp

import simdist
import simdist as dist


def summed(rank, world_size):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t, group=dist.group.WORLD)
    dist.destroy_process_group()
    return t.item()


def test_spawn_takes_torch_multiprocessing_parameters_in_order():
    ours = list(inspect.signature(simdist.spawn).parameters)
    theirs = list(inspect.signature(mp.spawn).parameters)
    assert ours[: len(theirs)] == theirs
    assert simdist.spawn(summed, (4,), 4, True, False, "spawn") == [10.0] * 4


def test_spawn_options_reach_the_simulator():
    assert simdist.spawn(summed, args=(3,), nprocs=3, seed=5, detail="collectives") == [6.0] * 3
    with pytest.raises(TypeError, match="unexpected keyword"):
        simdist.spawn(summed, args=(3,), nprocs=3, no_such_option=1)


def test_spawn_refuses_join_false_and_unknown_backends():
    with pytest.raises(ValueError, match="join=False"):
        simdist.spawn(summed, args=(2,), nprocs=2, join=False)
    with pytest.raises(ValueError, match="backend='bogus' is not a known backend"):
        simdist.spawn(summed, args=(2,), nprocs=2, backend="bogus")


def test_is_available_and_group_world():
    assert simdist.is_available() is True
    assert simdist.group.WORLD is None  # stands for the default group, as group=None does
    assert not simdist.is_initialized()


def test_init_outside_a_simulation_says_how_to_launch():
    how = r"simdist.spawn\(fn, args=\(world_size,\), nprocs=world_size, backend='sim'\)"
    with pytest.raises(RuntimeError, match=how):
        dist.init_process_group("gloo", rank=0, world_size=1)
