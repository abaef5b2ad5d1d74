"""``simdist.DistributedSampler`` yields torch's indices, takes its world from simdist, and rejects bad input."""

from __future__ import annotations

import inspect

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data import DistributedSampler as TorchSampler

import simdist
from simdist import DistributedSampler


@pytest.mark.timeout(120)
@settings(max_examples=300, deadline=None)
@given(
    length=st.integers(0, 200),
    num_replicas=st.integers(1, 9),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**31),
    drop_last=st.booleans(),
    epochs=st.lists(st.integers(0, 10_000), min_size=1, max_size=4),
)
def test_indices_equal_torchs(length, num_replicas, shuffle, seed, drop_last, epochs) -> None:
    dataset = range(length)
    for rank in range(num_replicas):
        kwargs = dict(num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
        ours, theirs = DistributedSampler(dataset, **kwargs), TorchSampler(dataset, **kwargs)
        assert len(ours) == len(theirs)
        assert list(iter(ours)) == list(iter(theirs))  # epoch 0, before any set_epoch
        for epoch in epochs:
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(iter(ours)) == list(iter(theirs)), (rank, epoch)
            assert len(ours) == len(theirs)


def test_ranks_split_the_padded_indices() -> None:
    shares = [list(DistributedSampler(range(5), 2, r, shuffle=False)) for r in range(2)]
    assert shares == [[0, 2, 4], [1, 3, 0]]
    assert [list(DistributedSampler(range(5), 2, r, shuffle=False, drop_last=True)) for r in range(2)] == [
        [0, 2],
        [1, 3],
    ]


def test_signature_and_attributes_match_torch() -> None:
    assert list(inspect.signature(DistributedSampler).parameters) == list(inspect.signature(TorchSampler).parameters)
    ours, theirs = DistributedSampler(range(7), 3, 2, seed=4), TorchSampler(range(7), 3, 2, seed=4)
    for name in ("num_replicas", "rank", "epoch", "drop_last", "num_samples", "total_size", "shuffle", "seed"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert isinstance(ours, torch.utils.data.Sampler)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shuffle", [True, False])
def test_world_comes_from_the_simdist_group(shuffle: bool) -> None:
    def main(rank):
        simdist.init_process_group("gloo")
        sampler = DistributedSampler(range(17), shuffle=shuffle, seed=3)
        sampler.set_epoch(2)
        out = (sampler.num_replicas, sampler.rank, list(sampler))
        simdist.destroy_process_group()
        return out

    values = simdist.simulate(main, 3).values
    for rank, (num_replicas, got_rank, indices) in enumerate(values):
        theirs = TorchSampler(range(17), num_replicas=3, rank=rank, shuffle=shuffle, seed=3)
        theirs.set_epoch(2)
        assert (num_replicas, got_rank, indices) == (3, rank, list(theirs))
    every = [i for _, _, indices in values for i in indices]
    assert len(every) == 18 and set(every) == set(range(17))  # 17 padded to 3 * 6 with one repeat


def test_works_with_a_data_loader() -> None:
    dataset = TensorDataset(torch.arange(10) * 10)
    sampler = DistributedSampler(dataset, num_replicas=3, rank=1, seed=5)
    sampler.set_epoch(1)
    batches = [batch.tolist() for (batch,) in DataLoader(dataset, sampler=sampler, batch_size=3)]
    theirs = TorchSampler(dataset, num_replicas=3, rank=1, seed=5)
    theirs.set_epoch(1)
    expected = [10 * i for i in theirs]
    assert batches == [expected[:3], expected[3:]]
    assert len(sampler) == 4


def test_without_a_group_it_says_to_initialize_one() -> None:
    with pytest.raises(simdist.NotInitializedError, match=r"num_replicas=None.*init_process_group"):
        DistributedSampler(range(4))
    with pytest.raises(simdist.NotInitializedError, match=r"rank=None.*init_process_group"):
        DistributedSampler(range(4), num_replicas=2)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(num_replicas=2, rank=2), ValueError, r"Invalid rank 2, rank should be in the interval \[0, 1\]"),
        (dict(num_replicas=2, rank=-1), ValueError, r"Invalid rank -1, rank should be in the interval \[0, 1\]"),
        (dict(num_replicas=0, rank=0), ValueError, r"num_replicas=0: expected at least 1"),
        (dict(num_replicas=-3, rank=0), ValueError, r"num_replicas=-3: expected at least 1"),
        (dict(num_replicas=2.0, rank=0), TypeError, r"num_replicas must be an int, got float \(2\.0\)"),
        (dict(num_replicas=2, rank="1"), TypeError, r"rank must be an int, got str \('1'\)"),
        (dict(num_replicas=2, rank=0, seed=1.5), TypeError, r"seed must be an int, got float \(1\.5\)"),
        (dict(num_replicas=2, rank=0, seed=None), TypeError, r"seed must be an int, got NoneType \(None\)"),
        (dict(num_replicas=2, rank=True), TypeError, r"rank must be an int, got bool \(True\)"),
    ],
)
def test_bad_arguments(kwargs, exc, match) -> None:
    with pytest.raises(exc, match=match):
        DistributedSampler(range(10), **kwargs)


def test_bad_epoch() -> None:
    sampler = DistributedSampler(range(10), num_replicas=2, rank=0)
    with pytest.raises(TypeError, match=r"epoch must be an int, got float \(1\.0\)"):
        sampler.set_epoch(1.0)
    with pytest.raises(TypeError, match=r"epoch must be an int, got str \('3'\)"):
        sampler.set_epoch("3")
    assert sampler.epoch == 0


def test_dataset_without_len() -> None:
    def generate():
        yield 1

    with pytest.raises(TypeError, match=r"dataset=generator object: expected a dataset with __len__"):
        DistributedSampler(generate(), num_replicas=2, rank=0)


@pytest.mark.parametrize("drop_last, new_length", [(False, 0), (False, 13), (True, 8)])
def test_dataset_that_changes_length_is_an_error_where_torchs_is(drop_last: bool, new_length: int) -> None:
    data = list(range(10))
    ours = DistributedSampler(data, num_replicas=3, rank=0, drop_last=drop_last)
    theirs = TorchSampler(data, num_replicas=3, rank=0, drop_last=drop_last)
    data[:] = range(new_length)
    with pytest.raises((AssertionError, ZeroDivisionError)):
        list(theirs)
    with pytest.raises(RuntimeError, match=rf"len\(dataset\)={new_length}: the sampler was built for"):
        list(ours)
