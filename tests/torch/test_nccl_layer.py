"""simdist's NCCL layer (``NcclGroup``, ``NcclWorld``) on CPU, over a stand-in for NCCL.

NCCL needs a GPU; tests/gpu runs the real thing where one exists. Here tests/support/nccl_emulation.py
runs, in a process of its own, the collectives suite's batches, point-to-point and DDP on
``backend="nccl"`` with NCCL's calls replaced by byte copies through the store. It checks
what simdist builds on NCCL (grouped send/recv for gather, scatter, all_to_all and p2p,
staging, the local reductions for what NCCL lacks, unique ids per group), not NCCL or CUDA.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "support" / "nccl_emulation.py"


@pytest.mark.timeout(300)
def test_every_op_dtype_and_reduce_op_on_the_nccl_layer() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "1", "2", "3", "4"], capture_output=True, text=True, timeout=280
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for world in (1, 2, 3, 4):
        assert re.search(rf"^world {world}: \d+ cases: ok$", proc.stdout, re.MULTILINE), proc.stdout
    assert "point-to-point: ok" in proc.stdout and "DDP: ok" in proc.stdout, proc.stdout
    assert "one GPU for two ranks: refused" in proc.stdout, proc.stdout
