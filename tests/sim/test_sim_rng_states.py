"""Each rank's generator states survive every switch, whatever it draws (raw copies of the states included)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from simdist.backends.sim import _isolation

import simdist
import simdist as dist

pytestmark = pytest.mark.timeout(120)


def _torch_draws() -> list:
    """Draws that use every part of torch's CPU generator: words, 64-bit words and the cached normal samples."""
    return [
        torch.rand(3).tolist(),
        torch.randn(1).item(),
        torch.randn(2).tolist(),
        torch.empty(1).normal_().item(),
        torch.randint(0, 2**40, (2,)).tolist(),
        torch.randperm(5).tolist(),
    ]


def _all_draws() -> list:
    return [random.random(), random.gauss(0, 1), float(np.random.randn()), float(np.random.rand()), *_torch_draws()]


def _alone(rank: int, rounds: int) -> list:
    """What a process seeded like rank ``rank`` draws (independent truth: no simulator)."""
    random.seed(rank)
    np.random.seed(rank)
    torch.manual_seed(rank)
    return [_all_draws() for _ in range(rounds)]


def _drawing(rank: int, rounds: int, quiet: tuple) -> list:
    dist.init_process_group("gloo")
    t = torch.zeros(2)
    out = []
    for i in range(rounds):
        if rank not in quiet:
            out.append(_all_draws())
        if i % 2:
            dist.all_reduce(t)
        elif rank % 2 == 0 and rank + 1 < dist.get_world_size():
            dist.send(t, rank + 1)
        elif rank % 2 == 1:
            dist.recv(t, rank - 1)
        dist.barrier()
    dist.destroy_process_group()
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_rank_draws_its_own_sequence_between_switches(seed):
    """Ranks that draw (ranks 1 and 3 draw nothing) get what the same draws give in a plain process."""
    rounds = 6
    res = simdist.simulate(_drawing, 5, (rounds, (1, 3)), seed=seed)
    for rank in (0, 2, 4):
        assert res.values[rank] == _alone(rank, rounds), f"rank {rank}"
    assert res.values[1] == res.values[3] == []


def test_a_quiet_rank_keeps_its_seeded_state():
    """A rank that draws only at its end, after the others drew at every switch, still starts from its seed."""

    def program(rank: int) -> list:
        dist.init_process_group("gloo")
        for _ in range(4):
            if rank:
                _all_draws()
            dist.barrier()
        return _all_draws() if rank == 0 else []

    res = simdist.simulate(program, 3, seed=3)
    assert res.values[0] == _alone(0, 1)[0]


def test_raw_torch_state_round_trips_like_the_public_api():
    """Where torch's generator is copied as raw bytes, restoring them gives back ``get_state`` and the draws."""
    raw = _isolation._TORCH_RAW
    if raw is None:
        pytest.skip("this torch's generator is saved through get_state/set_state")
    gen = torch.default_generator
    saved = gen.get_state()
    try:
        torch.manual_seed(7)
        torch.randn(1)  # leaves a cached normal sample pending
        before, snap = gen.get_state(), raw.get()
        expected = [_torch_draws() for _ in range(30)]
        raw.set(snap)
        assert torch.equal(gen.get_state(), before)
        assert [_torch_draws() for _ in range(30)] == expected
    finally:
        gen.set_state(saved)


def _draws_around_a_collective(rank: int, drawing: tuple) -> list | None:
    dist.init_process_group("gloo")
    out = [_all_draws()] if rank in drawing else None
    t = torch.zeros(1)
    dist.all_reduce(t)  # every rank waits here: the others run and draw meanwhile
    if out is not None:
        out.append(_all_draws())
    dist.destroy_process_group()
    return out


def test_ranks_of_a_world_larger_than_the_kept_seeds_draw_their_own_sequences():
    """Past ``SEEDS_KEPT`` ranks, each rank seeds the generators itself: the same draws as a plain process."""
    n = _isolation.SEEDS_KEPT + 3
    drawing = (0, 1, 700, n - 2, n - 1)
    res = simdist.simulate(_draws_around_a_collective, n, (drawing,), detail="collectives", leaks="ignore", seed=5)
    for rank in drawing:
        assert res.values[rank] == _alone(rank, 2), f"rank {rank}"
    assert all(res.values[r] is None for r in range(n) if r not in drawing)
