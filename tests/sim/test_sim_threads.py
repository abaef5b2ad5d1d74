"""A simulation leaves no thread behind, and its ranks do torch's intra-op work on their own thread.

Both matter to a process that forks after simulating (``spawn(..., start_method="fork")``, as
the backend tests do): a thread still ending, or an OpenMP worker team of a rank thread, can
hold a lock of MKL's allocator at the fork, and the forked rank then hangs in its first
matrix product.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

import simdist as dist

pytestmark = pytest.mark.timeout(120)


def _tasks() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def _matmuls(rank: int) -> int:
    x = torch.randn(128, 128, generator=torch.Generator().manual_seed(rank))
    for _ in range(3):
        x = torch.nn.functional.linear(x, x).tanh()
    return torch.get_num_threads()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc/self/task (Linux)")
def test_no_thread_outlives_the_simulation():
    _matmuls(0)  # the caller's own OpenMP team exists before the count
    before = _tasks()
    for seed in range(5):
        dist.simulate(_matmuls, 4, seed=seed)
        assert _tasks() == before, f"threads left after simulation {seed}: {sorted(_tasks() - before)}"


def test_ranks_run_intra_op_work_on_one_thread_and_the_caller_keeps_its_own():
    mine = torch.get_num_threads()
    assert dist.simulate(_matmuls, 3).values == [1, 1, 1]
    assert torch.get_num_threads() == mine
