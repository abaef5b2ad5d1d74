"""torch.distributed's backends behind simdist's interface: ``gloo``; ``torch-nccl`` and ``mpi`` where torch has them.

The shared backend suite (test_api_collectives, test_api_p2p, test_api_objects, test_ddp)
runs on ``"gloo"`` through tests/support/every_backend.py; this file covers what is particular to
these backends: the launcher, torch's groups seen from both APIs, the fallbacks for what
torch's gloo cannot do, and clear errors where this build of torch lacks a backend.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as td
from every_backend import run_body

import simdist as dist
from simdist.core._world import current_world
from simdist.backends.torchdist import MpiWorld, TorchGroup, TorchNcclWorld

pytestmark = [pytest.mark.timeout(120), pytest.mark.torch_release]


KEEPS_ORDER = "sort_ranks" in inspect.signature(td.new_group).parameters  # torch 2.11's new_group sorts every group


@pytest.mark.skipif(not KEEPS_ORDER, reason=f"torch {torch.__version__}'s new_group has no sort_ranks")
def test_groups_are_torch_groups_seen_from_both_apis() -> None:
    def body(rank: int):
        sub = dist.new_group([2, 0], sort_ranks=False)  # group ranks in the given order: 2 is group rank 0
        assert isinstance(current_world().default_group, TorchGroup)
        mine = None
        if rank != 1:
            assert td.get_rank(sub.pg) == sub.rank == [2, 0].index(rank)  # torch agrees on the order
            t = torch.tensor([float(rank)])
            dist.broadcast(t, group_src=0, group=sub)  # from global rank 2
            mine = t.item()
        plain = torch.tensor([1.0])
        td.all_reduce(plain)  # torch's own API on the same default group
        return dist.get_backend(), mine, plain.item(), td.get_world_size()

    assert run_body(body, 3, "gloo") == [("gloo", 2.0, 3.0, 3), ("gloo", None, 3.0, 3), ("gloo", 2.0, 3.0, 3)]


@pytest.mark.skipif(KEEPS_ORDER, reason=f"torch {torch.__version__}'s new_group keeps the given order")
def test_an_unsorted_group_on_a_torch_that_sorts_every_group_is_refused_clearly() -> None:
    def body(rank: int):
        with pytest.raises(ValueError, match=r"new_group\(ranks=\[1, 0\], sort_ranks=False\).*increasing order"):
            dist.new_group([1, 0], sort_ranks=False)
        t = torch.tensor([1.0])
        dist.all_reduce(t)  # the world goes on
        return t.item()

    assert run_body(body, 2, "gloo") == [2.0, 2.0]


def test_reductions_gloo_lacks_are_done_by_gathering() -> None:
    """gloo has no int16 and no complex product: simdist gathers and reduces in rank order instead."""

    def body(rank: int):
        a = torch.tensor([rank + 2, -3], dtype=torch.int16)
        dist.all_reduce(a, op=dist.ReduceOp.PRODUCT)
        c = torch.tensor([1 + 1j * (rank + 1)], dtype=torch.complex64)
        dist.all_reduce(c, op=dist.ReduceOp.PRODUCT)
        u = np.array([rank + 1] * 4, dtype=np.uint8)
        out = np.zeros(2, dtype=np.uint8)
        dist.reduce_scatter_tensor(out, u, op=dist.ReduceOp.BXOR)
        return a.tolist(), c.tolist(), out.tolist()

    want_c = complex(np.prod([1 + 1j * (r + 1) for r in range(2)]).astype(np.complex64))
    for got in run_body(body, 2, "gloo"):
        assert got == ([6, 9], [want_c], [3, 3])


@pytest.mark.parametrize("world", [1, 2])
def test_empty_numpy_buffers_move_on_gloo(world: int) -> None:
    """A concatenation of empty numpy arrays can have stride 0, which torch will not view as bytes."""

    def body(rank: int):
        out = np.zeros((0,), dtype=np.float32)
        parts = [np.zeros((0,), dtype=np.float32) for _ in range(world)] if rank == 0 else None
        dist.scatter(out, parts, src=0)
        gathered = [np.zeros((0,), dtype=np.float32) for _ in range(world)] if rank == 0 else None
        dist.gather(out, gathered, dst=0)
        return out.shape, None if gathered is None else [g.shape for g in gathered]

    for rank, got in enumerate(run_body(body, world, "gloo")):
        assert got == ((0,), [(0,)] * world if rank == 0 else None)


def test_batch_isend_irecv_uses_torch_batches() -> None:
    def body(rank: int):
        peer = 1 - rank
        out = torch.zeros(1 << 18)
        works = dist.batch_isend_irecv(
            [dist.P2POp(dist.isend, torch.full((1 << 18,), float(rank)), peer), dist.P2POp(dist.irecv, out, peer)]
        )
        for w in works:
            w.wait()
        return out[0].item(), works[1].source_rank()

    assert run_body(body, 2, "gloo") == [(1.0, 1), (0.0, 0)]


def test_naming_one_of_simdists_algorithms_warns_once_and_runs() -> None:
    def body(rank: int):
        t = torch.ones(3)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dist.all_reduce(t, algorithm="ring")
            dist.all_reduce(t, algorithm="ring")
        return t.tolist(), [(str(w.message), w.filename) for w in caught]

    values, caught = run_body(body, 2, "gloo")[0]
    assert values == [4.0, 4.0, 4.0]
    assert len(caught) == 1, caught
    message, filename = caught[0]
    assert "all_reduce(algorithm='ring') is ignored on backend 'gloo'" in message
    assert filename == __file__  # the warning points at the user's call


@pytest.mark.skipif(td.is_nccl_available(), reason="this torch has NCCL")
def test_torch_nccl_without_nccl_says_so() -> None:
    with pytest.raises(RuntimeError, match="backend='torch-nccl' needs a build of torch with NCCL"):
        TorchNcclWorld.check_available()


@pytest.mark.skipif(td.is_mpi_available(), reason="this torch has MPI")
def test_mpi_without_mpi_says_so() -> None:
    with pytest.raises(RuntimeError, match="backend='mpi' needs a build of torch with MPI"):
        dist.init_process_group("mpi")  # mpirun, not env://, tells MPI's ranks where they are
    assert not dist.is_initialized()
    assert MpiWorld.name == "mpi"


def test_nccl_without_a_gpu_says_why_and_what_runs_instead() -> None:
    from simdist.backends.nccl import nccl_unavailable

    reason = nccl_unavailable()
    if reason is None:
        pytest.skip("NCCL can run here: tests/gpu covers it")
    with pytest.raises(RuntimeError, match="backend='nccl' cannot run here: .*backend='sim'"):
        dist.init_process_group("nccl", init_method="tcp://127.0.0.1:1", rank=0, world_size=1)
    assert not dist.is_initialized()


def test_simdist_run_launches_gloo(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent("""\
        import torch
        import simdist as dist
        from simdist.core._world import current_world

        dist.init_process_group("nccl")  # the launcher's --backend decides
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        print(f"{type(current_world().default_group).__name__} sum={int(t.item())}")
        dist.destroy_process_group()
    """)
    )
    proc = subprocess.run(
        [sys.executable, "-m", "simdist.run", "--nproc-per-node", "3", "--backend", "gloo", str(script)],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0, proc.stderr
    for r in range(3):
        assert f"[rank {r}] TorchGroup sum=6" in proc.stdout, proc.stdout
