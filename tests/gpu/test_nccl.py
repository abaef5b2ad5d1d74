"""NCCL, torch's NCCL, and CUDA tensors on every backend, against the numpy reference.

On one GPU: every op at world 1 on ``nccl`` (CUDA tensors, cupy arrays, CPU tensors and
numpy arrays, every dtype with every reduce op), several ranks sharing the GPU where NCCL
permits it, the same cases on ``torch-nccl``, on the simulator and on the socket backend
with CUDA tensors, and one DDP step on NCCL equal to the simulator's.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from nccl_emulation import ddp_steps
from reference import ARRAY_TYPES, TORCH_DTYPES
from test_api_collectives import OPS, REDUCING, Case, _dtype_batch, _subgroup_batch, check

import simdist as dist
from simdist.core._errors import RankError

pytestmark = pytest.mark.timeout(600)

GPU_KINDS = [("cuda", d) for d in TORCH_DTYPES] + [("cupy", d) for d in ("float32", "int64", "bool")]
"""CUDA tensors of every dtype and cupy arrays, as the CPU suite's ARRAY_TYPES."""


def _batch(world: int, kinds: list[tuple[str, str]]) -> list[Case]:
    batch = [c for kind, dtype in kinds for c in _dtype_batch(kind, dtype, world)]
    for layout in ("transposed", "strided"):
        batch += [
            Case(op=op, kind="cuda", world=world, layout=layout, rop=dist.ReduceOp.SUM if op in REDUCING else None)
            for op in OPS
        ]
    return batch


REFUSED_SHARING = ("Duplicate GPU", "ncclInvalidUsage", "NCCL_ERROR_INVALID_USAGE")
"""How NCCL's refusal of two ranks on one GPU reads: simdist's nccl says "Duplicate GPU detected" with the
ranks; torch's ProcessGroupNCCL says ``ncclInvalidUsage`` (and NCCL's log line where it has it)."""


def _skip_if_nccl_refused_sharing(exc: RankError, world: int) -> None:
    """Skip, with NCCL's reason, when ``world`` ranks share fewer GPUs and NCCL refused that; else return."""
    text = f"{exc} {exc.__cause__}"
    if world > torch.cuda.device_count() and any(words in text for words in REFUSED_SHARING):
        pytest.skip(f"needs {world} GPUs, {torch.cuda.device_count()} here; NCCL refuses a shared GPU: {exc.__cause__}")


def _run_or_skip_shared_gpu(batch: list[Case], world: int, backend: str) -> None:
    """Several ranks on the one GPU: run, or skip with NCCL's own reason if it refuses to share a GPU."""
    try:
        check(batch, world, "messages", backend=backend)
    except RankError as exc:
        _skip_if_nccl_refused_sharing(exc, world)
        raise


@pytest.mark.parametrize("backend", ["nccl", "torch-nccl"])
def test_every_op_dtype_and_reduce_op_at_world_1(backend: str) -> None:
    kinds = GPU_KINDS + ARRAY_TYPES  # host arrays too: staged to the GPU and back
    check(_batch(1, kinds), 1, "messages", backend=backend)


@pytest.mark.parametrize("backend", ["nccl", "torch-nccl"])
@pytest.mark.parametrize("world", [2, 3])
def test_several_ranks_on_one_gpu(world: int, backend: str) -> None:
    batch = _batch(world, [("cuda", "float32"), ("cuda", "int64"), ("cuda", "bool"), ("cupy", "float32")])
    _run_or_skip_shared_gpu(batch + _subgroup_batch(world), world, backend)


@pytest.mark.parametrize("backend", ["sim", "socket"])
def test_cuda_tensors_and_cupy_arrays_on_the_simulator_and_the_socket_backend(backend: str) -> None:
    batch = _batch(3, [("cuda", d) for d in TORCH_DTYPES] + [("cupy", "float32"), ("cupy", "int64")])
    if backend == "sim":
        check(batch, 3, "messages")
        check([replace(c, detail="collectives") for c in batch], 3, "collectives")
    else:
        check(batch, 3, "messages", backend="socket")


@pytest.mark.parametrize("world", [1, 2])
def test_ddp_step_on_nccl_equals_the_simulator(world: int) -> None:
    want = dist.simulate(ddp_steps, world).values  # inside a simulation "nccl" binds to the simulator
    try:
        got = dist.spawn(ddp_steps, args=("cuda",), nprocs=world, backend="nccl", start_method="spawn")
    except RankError as exc:
        _skip_if_nccl_refused_sharing(exc, world)
        raise
    for rank in range(world):
        for a, b in zip(got[rank], want[rank]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _stream_order(rank: int) -> float:
    dist.init_process_group("nccl")
    side = torch.cuda.Stream()
    x = torch.ones(1 << 20, device="cuda")
    with torch.cuda.stream(side):
        work = dist.all_reduce(x, async_op=True)
    work.wait()  # the default stream now waits for the all-reduce enqueued on the side stream
    total = float(x.sum().item())
    dist.destroy_process_group()
    return total


def test_work_wait_orders_the_current_stream_after_the_op() -> None:
    assert dist.spawn(_stream_order, nprocs=1, backend="nccl", start_method="spawn") == [float(1 << 20)]


def _any_source(rank: int) -> str:
    dist.init_process_group("nccl")
    try:
        dist.irecv(torch.zeros(1, device="cuda"))
    except ValueError as exc:
        return str(exc)
    finally:
        dist.destroy_process_group()
    return "accepted"


def test_recv_from_any_source_is_refused_with_a_reason() -> None:
    assert "any source" in dist.spawn(_any_source, nprocs=1, backend="nccl", start_method="spawn")[0]


def test_tutorial_06_trains_the_same_on_gpus() -> None:
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "tutorials/06_to_gpus.py", "--gpu"], cwd=root, capture_output=True, text=True, timeout=500
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("nccl", "torch-nccl"))]
    assert len(lines) == 2 and all(line.endswith("True") for line in lines), proc.stdout
