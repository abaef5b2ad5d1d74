"""``simdist run`` with the GPU backends: an unmodified ``torch.distributed`` NCCL script and a simdist one.

One GPU, so one rank per job (NCCL refuses two ranks on one device). ``simdist.run.ENGINES``: torch
code runs on the backend it names under ``nccl`` and ``torch-nccl`` and without ``--backend``; on
simdist's socket backend (CUDA tensors staged through the host) under ``--backend socket``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

TORCH_NCCL = """\
import os
import torch
import torch.distributed as dist

local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl")
t = torch.full((4,), float(dist.get_rank() + 1), device="cuda")
dist.all_reduce(t)
dist.broadcast(t, src=0)
print(f"rank={dist.get_rank()} sum={t.sum().item()} backend={dist.get_backend()} "
      f"engine={type(dist.group.WORLD).__name__}")
dist.destroy_process_group()
"""

SIMDIST_CUDA = """\
import torch
import simdist as dist

dist.init_process_group("nccl")
t = torch.full((4,), float(dist.get_rank() + 1), device="cuda")
dist.all_reduce(t)
print(f"rank={dist.get_rank()} sum={t.sum().item()} backend={dist.get_backend()}")
dist.destroy_process_group()
"""


def _launch(tmp_path: Path, text: str, *flags: str) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(text))
    return subprocess.run(
        [sys.executable, "-m", "simdist.run", *flags, "--nproc-per-node", "1", str(script)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env=dict(os.environ),
    )


@pytest.mark.parametrize(
    ("flags", "engine"),
    [
        ((), "ProcessGroup"),
        (("--backend", "nccl"), "ProcessGroup"),
        (("--backend", "torch-nccl"), "ProcessGroup"),
        (("--backend", "socket"), "BridgeGroup"),
    ],  # fmt: skip
    ids=["default", "nccl", "torch-nccl", "socket"],
)
def test_an_unmodified_torch_nccl_script(tmp_path: Path, flags: tuple, engine: str) -> None:
    proc = _launch(tmp_path, TORCH_NCCL, *flags)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"[rank 0] rank=0 sum=4.0 backend=nccl engine={engine}" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("backend", ["nccl", "torch-nccl", "socket"])
def test_a_simdist_script_with_cuda_tensors(tmp_path: Path, backend: str) -> None:
    proc = _launch(tmp_path, SIMDIST_CUDA, "--backend", backend)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[rank 0] rank=0 sum=4.0" in proc.stdout, proc.stdout + proc.stderr
