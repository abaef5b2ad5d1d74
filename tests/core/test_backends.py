"""One suite, every backend: each collective with each of its algorithms, on sim and socket.

The program below is written once. It runs on the simulator and on real processes at
world sizes 1 to 5; integer results must equal a numpy reference and match across
backends bit for bit, float results within tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import simdist
import simdist as dist
from simdist.algorithms import ALGORITHMS

BACKENDS = ["sim", "socket"]


def _data(rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    return (torch.arange(n, dtype=torch.int64) * 3 + 7 * rank - 5).to(dtype)


def every_op_every_algorithm(rank: int, world: int) -> dict:
    """Run every collective with every algorithm on int64 and float32 data; return the results."""
    dist.init_process_group("gloo")
    out: dict = {}
    n = 2 * world + 1
    for dtype in (torch.int64, torch.float32):
        key = str(dtype).removeprefix("torch.")
        for algo in ALGORITHMS["all_reduce"]:
            t = _data(rank, n, dtype)
            dist.all_reduce(t, algorithm=algo)
            out[f"all_reduce/{algo}/{key}"] = t.tolist()
        for algo in ALGORITHMS["broadcast"]:
            t = _data(rank, n, dtype)
            dist.broadcast(t, src=world - 1, algorithm=algo)
            out[f"broadcast/{algo}/{key}"] = t.tolist()
        for algo in ALGORITHMS["reduce"]:
            t = _data(rank, n, dtype)
            dist.reduce(t, dst=0, op=dist.ReduceOp.MAX, algorithm=algo)
            out[f"reduce/{algo}/{key}"] = t.tolist() if rank == 0 else None
        for algo in ALGORITHMS["all_gather"]:
            o = torch.zeros(world * n, dtype=dtype)
            dist.all_gather_into_tensor(o, _data(rank, n, dtype), algorithm=algo)
            out[f"all_gather/{algo}/{key}"] = o.tolist()
        for algo in ALGORITHMS["reduce_scatter"]:
            o = torch.zeros(2, dtype=dtype)
            dist.reduce_scatter_tensor(o, _data(rank, 2 * world, dtype), algorithm=algo)
            out[f"reduce_scatter/{algo}/{key}"] = o.tolist()
        for algo in ALGORITHMS["all_to_all"]:
            o = torch.zeros(2 * world, dtype=dtype)
            dist.all_to_all_single(o, _data(rank, 2 * world, dtype), algorithm=algo)
            out[f"all_to_all/{algo}/{key}"] = o.tolist()
        for algo in ALGORITHMS["gather"]:
            lst = [torch.zeros(n, dtype=dtype) for _ in range(world)] if rank == 0 else None
            dist.gather(_data(rank, n, dtype), lst, dst=0, algorithm=algo)
            out[f"gather/{algo}/{key}"] = [x.tolist() for x in lst] if lst else None
        for algo in ALGORITHMS["scatter"]:
            o = torch.zeros(n, dtype=dtype)
            src = [_data(i, n, dtype) for i in range(world)] if rank == world - 1 else None
            dist.scatter(o, src, src=world - 1, algorithm=algo)
            out[f"scatter/{algo}/{key}"] = o.tolist()
    dist.barrier()
    dist.destroy_process_group()
    return out


def _reference(world: int) -> list[dict]:
    """The expected int64 results, computed with numpy."""
    n = 2 * world + 1

    def data(r, m):
        return np.arange(m, dtype=np.int64) * 3 + 7 * r - 5

    expected = []
    for rank in range(world):
        e = {
            "all_reduce": sum(data(r, n) for r in range(world)).tolist(),
            "broadcast": data(world - 1, n).tolist(),
            "reduce": np.max([data(r, n) for r in range(world)], axis=0).tolist() if rank == 0 else None,
            "all_gather": np.concatenate([data(r, n) for r in range(world)]).tolist(),
            "reduce_scatter": sum(data(r, 2 * world) for r in range(world))[2 * rank : 2 * rank + 2].tolist(),
            "all_to_all": [int(data(r, 2 * world)[2 * rank + j]) for r in range(world) for j in range(2)],
            "gather": [data(r, n).tolist() for r in range(world)] if rank == 0 else None,
            "scatter": data(rank, n).tolist(),
        }
        expected.append(e)
    return expected


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
def test_every_algorithm_on_every_backend(world):
    results = {b: simdist.spawn(every_op_every_algorithm, args=(world,), nprocs=world, backend=b) for b in BACKENDS}
    expected = _reference(world)
    for backend, per_rank in results.items():
        for rank, got in enumerate(per_rank):
            for key, value in got.items():
                op, algo, dtype = key.split("/")
                if dtype == "int64":
                    assert value == expected[rank][op], (backend, rank, key)
                elif value is not None:
                    want = expected[rank][op]
                    assert np.allclose(np.asarray(value, dtype=float), np.asarray(want, dtype=float)), (backend, key)
    assert results["sim"] == results["socket"]
