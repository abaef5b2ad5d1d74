"""Collectives of picklable objects: broadcast_object_list, all_gather_object, gather_object,
scatter_object_list, on the world and on subgroups, with small, empty and large objects."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

import simdist as dist
from every_backend import BACKENDS, run_body

MODES = [("sim", "messages"), ("sim", "collectives"), ("socket", None)]  # (backend, simulator detail)
MODE_IDS = ["sim-messages", "sim-collectives", "socket"]
BIG = 300_000  # bytes of the large object


def obj(rank: int):
    """A different object per rank, of varied types and sizes (rank 2's is large)."""
    kinds = [
        {"rank": 0, "nested": {"list": [1, 2.5, "x"], "tuple": (None, True)}},
        "rank one: ünïcode ✓",
        bytes(range(256)) * (BIG // 256),
        None,
        np.arange(rank * 3, dtype=np.int16),
        torch.tensor([rank, rank + 1.5]),
        Fraction(rank, 7),
        [],
        {},
    ]
    return kinds[rank % len(kinds)]


def same_obj(a, b) -> bool:
    if isinstance(b, (np.ndarray, torch.Tensor)):
        return type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape and bool((a == b).all())
    return type(a) is type(b) and a == b


def simulate(body, nprocs, mode=("sim", "messages")):
    """The values of ``body(rank)`` on ``nprocs`` ranks; ``mode`` is (backend, simulator detail)."""
    backend, detail = mode
    return run_body(body, nprocs, backend, detail=detail, seed=0, leaks="error")


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("n", [1, 3, 4, 9])
def test_broadcast_object_list(n: int, mode: tuple) -> None:
    src = n - 1

    def body(rank):
        lst = [obj(r) for r in range(4)] if rank == src else ["junk"] * 4
        assert dist.broadcast_object_list(lst, src=src) is None
        return lst

    for lst in simulate(body, n, mode):
        assert len(lst) == 4 and all(same_obj(a, obj(r)) for r, a in enumerate(lst))


@pytest.mark.parametrize("backend", BACKENDS)
def test_broadcast_object_list_empty_and_none(backend: str) -> None:
    def body(rank):
        empty = []
        dist.broadcast_object_list(empty, src=1)
        nones = [None, None] if rank == 1 else [1, 2]
        dist.broadcast_object_list(nones, src=1)
        return empty, nones

    assert simulate(body, 3, (backend, "messages")) == [([], [None, None])] * 3


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("n", [1, 2, 5, 9])
def test_all_gather_object(n: int, mode: tuple) -> None:
    def body(rank):
        out = [object()] * n
        assert dist.all_gather_object(out, obj(rank)) is None
        return out

    for out in simulate(body, n, mode):
        assert all(same_obj(a, obj(r)) for r, a in enumerate(out))


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("n", [1, 3, 6])
def test_gather_object(n: int, mode: tuple) -> None:
    dst = n // 2

    def body(rank):
        out = [None] * n if rank == dst else None
        assert dist.gather_object(obj(rank), out, dst=dst) is None
        return out

    vals = simulate(body, n, mode)
    assert all(v is None for r, v in enumerate(vals) if r != dst)
    assert all(same_obj(a, obj(r)) for r, a in enumerate(vals[dst]))


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("n", [1, 3, 7])
def test_scatter_object_list(n: int, mode: tuple) -> None:
    src = n - 1

    def body(rank):
        out = ["junk"]
        inp = [obj(r + 1) for r in range(n)] if rank == src else None
        assert dist.scatter_object_list(out, inp, src=src) is None
        if inp is not None:  # the input list is not modified
            assert all(same_obj(a, obj(r + 1)) for r, a in enumerate(inp))
        return out

    for rank, out in enumerate(simulate(body, n, mode)):
        assert len(out) == 1 and same_obj(out[0], obj(rank + 1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_scatter_object_list_only_sets_the_first_entry(backend: str) -> None:
    def body(rank):
        out = ["a", "b"]
        dist.scatter_object_list(out, [{"to": r} for r in range(2)] if rank == 0 else None, src=0)
        return out

    assert simulate(body, 2, (backend, "messages")) == [[{"to": 0}, "b"], [{"to": 1}, "b"]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_large_objects_of_different_sizes(backend: str) -> None:
    def body(rank):
        mine = "x" * (rank * 200_000)
        gathered = [None] * 3
        dist.all_gather_object(gathered, mine)
        lst = [mine]
        dist.broadcast_object_list(lst, src=2)
        return [len(g) for g in gathered], len(lst[0])

    assert simulate(body, 3, (backend, "messages")) == [([0, 200_000, 400_000], 400_000)] * 3


@pytest.mark.filterwarnings("ignore:running")
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_object_collectives_on_a_subgroup(mode: tuple) -> None:
    members = [4, 0, 2]  # group ranks: 0 -> 0, 2 -> 1, 4 -> 2

    def body(rank):
        g = dist.new_group(members)
        bl = [rank, "mine"]
        dist.broadcast_object_list(bl, src=4, group=g)
        bl2 = [{"from": 2}] if rank == 2 else ["x"]
        dist.broadcast_object_list(bl2, group=g, group_src=1)
        ag = [None] * 3
        dist.all_gather_object(ag, {"r": rank}, group=g)
        go = [None] * 3 if rank == 2 else None
        dist.gather_object(f"r{rank}", go, dst=2, group=g)
        so = [None]
        dist.scatter_object_list(so, [10, 20, 30] if rank == 0 else None, group=g, group_src=0)
        return bl, bl2, ag, go, so

    vals = simulate(body, 5, mode)
    for rank in (1, 3):  # outside the group: every list untouched
        assert vals[rank] == ([rank, "mine"], ["x"], [None] * 3, None, [None])
    for rank, g in ((0, 0), (2, 1), (4, 2)):
        bl, bl2, ag, _, so = vals[rank]
        assert bl == [4, "mine"]
        assert bl2 == [{"from": 2}]
        assert ag == [{"r": 0}, {"r": 2}, {"r": 4}]
        assert so == [[10, 20, 30][g]]
    assert vals[2][3] == ["r0", "r2", "r4"]
    assert vals[0][3] is None and vals[4][3] is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_objects_are_copies_not_shared_references(backend: str) -> None:
    """Simulated ranks share a process; a received object must still be a fresh copy."""
    shared = {"k": [1, 2]}

    def body(rank):
        lst = [shared if rank == 0 else None]
        dist.broadcast_object_list(lst, src=0)
        return lst[0] is shared, lst[0]

    vals = simulate(body, 2, (backend, "messages"))
    assert vals[0] == (True, shared)
    assert vals[1] == (False, shared)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda r: dist.all_gather_object([None] * 2, r), r"object_list.*2.*3"),
        (lambda r: dist.gather_object(r, [None] if r == 0 else None, dst=0), r"object_gather_list.*1.*3"),
        (
            lambda r: dist.scatter_object_list([None], [1, 2] if r == 0 else None, src=0),
            r"scatter_object_input_list.*2.*3",
        ),
        (lambda r: dist.scatter_object_list([], [1, 2, 3] if r == 0 else None, src=0), r"scatter_object_output_list"),
        (lambda r: dist.broadcast_object_list((1, 2), src=0), r"object_list.*tuple"),
        (lambda r: dist.broadcast_object_list([1], src=5), r"src=5"),
        (lambda r: dist.gather_object(r, None, dst=-1), r"dst=-1"),
    ],
)
@pytest.mark.parametrize("backend", BACKENDS)
def test_object_collectives_reject_bad_arguments(call, match: str, backend: str) -> None:
    def body(rank):
        call(rank)

    with pytest.raises(dist.RankError) as info:
        simulate(body, 3, (backend, "messages"))
    assert isinstance(info.value.__cause__, (ValueError, TypeError))
    assert __import__("re").search(match, str(info.value.__cause__)), str(info.value.__cause__)
