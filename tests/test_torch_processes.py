"""torch.distributed programs on real processes, their groups simdist socket groups through the process bridge.

Each test runs its ranks with ``simdist.spawn(..., backend="socket")``, which installs the bridge
(``simdist.torch_bridge.processes``) in every rank process: the groups torch creates there are
simdist socket groups, whatever backend the program names, and torch's own rendezvous is left to
the program. These are the cases torch's own distributed tests met on this path
(``benchmarks/torch_suite.py``, the socket side; docs/torch-suite.md).
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

import simdist

pytestmark = [pytest.mark.timeout(120), pytest.mark.torch_release]

TIMEOUT = 60.0
"""simdist's timeout for the ranks of each test (a hang is an error within it, never a stuck test)."""


def _socket(fn, *args, nprocs: int = 2) -> list:
    return simdist.spawn(fn, args=args, nprocs=nprocs, backend="socket", timeout=TIMEOUT)


def file_rendezvous(rank: int, path: str) -> tuple:
    """torch's own tests join through a ``file://`` store and set no MASTER_ADDR."""
    os.environ.pop("MASTER_ADDR", None)
    os.environ.pop("MASTER_PORT", None)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2)
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    on_simdist = simdist.is_initialized() and simdist.get_backend() == "socket"
    dist.destroy_process_group()
    return t.item(), on_simdist


def test_a_program_joining_through_a_file_store_meets_in_simdists_store(tmp_path):
    assert _socket(file_rendezvous, str(tmp_path / "init")) == [(3.0, True)] * 2
