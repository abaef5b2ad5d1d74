"""Large-model training code written for GPUs, unchanged on simulated GPUs, against the same code on CPUs.

``tests/programs/gpu_style.py`` makes the calls of nanoGPT's ``train.py`` and of pytorch/examples'
FSDP2 and tensor-parallel examples (bfloat16 and float16 autocast with a ``GradScaler``, fused AdamW,
``torch.accelerator`` devices and the optimizers' graph-capture check, FSDP2 on a model built on the
meta device with bfloat16 parameters, DTensors on a ``cuda`` device mesh, a 2-D mesh of FSDP2 and
tensor parallelism). Under ``simdist run --backend sim`` its ranks take the GPU path on simulated
GPUs; under ``simdist run --backend gloo`` (torch's gloo, real processes) they take the CPU path.
Losses and parameters must agree. The public programs themselves run from a folder fetched elsewhere
(``tests/support/public_programs.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import simdist

pytestmark = [pytest.mark.torch_release, pytest.mark.filterwarnings("ignore::FutureWarning")]

PROGRAM = Path(__file__).resolve().parents[1] / "programs" / "gpu_style.py"
WORLD = 4
NAMES = ("nanogpt", "nanogpt_fp16", "fsdp2", "tensor_parallel", "sequence_parallel", "fsdp_tp")


def _launch(backend: str, out: Path, extra: tuple[str, ...] = ()) -> list[dict]:
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")}
    if backend == "gloo":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU path, also on a machine with GPUs
    cmd = [sys.executable, "-m", "simdist.run", "--backend", backend, *extra, "--nproc-per-node", str(WORLD)]
    proc = subprocess.run([*cmd, str(PROGRAM), str(out)], capture_output=True, text=True, timeout=280, env=env, cwd=out)
    assert proc.returncode == 0, f"{backend}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]


@pytest.mark.timeout(300)
def test_gpu_code_on_simulated_gpus_equals_the_cpu_code_on_gloo(tmp_path: Path) -> None:
    simulated = _launch("sim", tmp_path / "sim", ("--cuda-as-cpu",))
    gloo = _launch("gloo", tmp_path / "gloo")
    for rank in range(WORLD):
        assert simulated[rank]["device"] == "cuda" and gloo[rank]["device"] == "cpu", rank
        for name in NAMES:
            got, want = simulated[rank][name], gloo[rank][name]
            assert got.keys() == want.keys(), name
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}, rank {rank}: {m}")
            assert all(map(torch.isfinite, map(torch.tensor, got["losses"]))), (name, got["losses"])
    # the programs do something: losses move, and float16 with its GradScaler is not bfloat16
    for name in NAMES:
        assert simulated[0][name]["losses"][0] != simulated[0][name]["losses"][-1], name
    assert simulated[0]["nanogpt"]["losses"] != simulated[0]["nanogpt_fp16"]["losses"]


# -- attention of DTensors on simulated GPUs (flash attention's sharding rule on a GPU) --------------------------


def _attention(rank: int, placement: str) -> dict:
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    torch.distributed.init_process_group("nccl")
    mesh = init_device_mesh("cuda", (2,))
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 6, 8, device="cuda") for _ in range(3))
    whole = [t.clone().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*whole, is_causal=True).pow(2).sum().backward()
    place = {"heads": Shard(1), "batch": Shard(0), "replicated": Replicate(), "sequence": Shard(2)}[placement]
    parts = [distribute_tensor(t, mesh, [place]).requires_grad_() for t in (q, k, v)]
    try:
        out = F.scaled_dot_product_attention(*parts, is_causal=True)
    except NotImplementedError as exc:
        torch.distributed.destroy_process_group()
        return {"refused": str(exc)}
    out.full_tensor().pow(2).sum().backward()
    result = {
        "placements": out.placements,
        "mesh": mesh.device_type,
        "out": out.full_tensor().detach(),
        "want": F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "grads": [p.grad.full_tensor() for p in parts],
        "want_grads": [t.grad for t in whole],
    }
    torch.distributed.destroy_process_group()
    return result


@pytest.mark.timeout(120)
@pytest.mark.parametrize("placement", ["heads", "batch", "replicated"])
def test_attention_of_dtensors_on_simulated_gpus_is_the_whole_attention(placement: str) -> None:
    for got in simdist.simulate(_attention, 2, args=(placement,), cuda_as_cpu=True).values:
        assert got["mesh"] == "cpu"  # a cuda mesh on simulated GPUs is the CPU's, as its tensors are
        assert len(got["placements"]) == 1
        torch.testing.assert_close(got["out"], got["want"])
        torch.testing.assert_close(got["grads"], got["want_grads"])


@pytest.mark.timeout(120)
def test_attention_sharded_over_the_sequence_is_left_to_torch() -> None:
    """Sharding the sequence needs communication (context parallelism): torch's own answer, not a local one."""
    for got in simdist.simulate(_attention, 2, args=("sequence",), cuda_as_cpu=True).values:
        assert "does not have a sharding strategy" in got["refused"], got
