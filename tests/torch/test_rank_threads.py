"""Threads a simulated rank starts: they see the rank's world, and their communication is refused, never wrong.

A thread started on a rank (``threading.Thread``, a ``ThreadPoolExecutor``'s worker) sees what a thread
of a torchrun rank's process sees: the rank's process groups, its environment, its current GPU, its
output. The simulator schedules each rank's own thread only, so a collective from such a thread is a
``RuntimeError`` naming the call and the thread (``dcp.async_save`` saves on one): before, the thread
saw no process group and each rank wrote a one-rank checkpoint over the others', exit status 0.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import torch
import torch.distributed as dist

import simdist

pytestmark = [
    pytest.mark.torch_release,
    pytest.mark.timeout(180),
    pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is unavailable"),
]


def seen_from_a_thread(rank: int) -> dict:
    dist.init_process_group("gloo")
    torch.cuda.set_device(rank)
    os.environ["MINE"] = f"rank {rank}"
    seen: dict = {}

    def work() -> None:
        seen.update(rank=dist.get_rank(), world=dist.get_world_size(), env=os.environ.get("MINE"),
                    gpu=torch.cuda.current_device(), gpus=torch.cuda.device_count())  # fmt: skip
        try:
            dist.all_reduce(torch.ones(1))
        except RuntimeError as exc:
            seen["error"] = str(exc)

    thread = threading.Thread(target=work, name="helper")
    thread.start()
    thread.join()
    dist.all_reduce(torch.ones(1))  # the rank's own thread goes on communicating
    dist.destroy_process_group()
    return seen


@pytest.mark.parametrize("isolation", ["threads", "processes"])
def test_a_thread_a_rank_starts_sees_the_ranks_world_and_may_not_communicate(isolation):
    for rank, seen in enumerate(simdist.simulate(seen_from_a_thread, 2, cuda_as_cpu=True, isolation=isolation).values):
        error = seen.pop("error")
        assert seen == {"rank": rank, "world": 2, "env": f"rank {rank}", "gpu": rank, "gpus": 2}
        assert error.startswith("simdist: torch.distributed all_reduce called from thread 'helper'"), error
        assert "async_save" in error and "--backend socket" in error


ASYNC_SAVE = """\
import sys, torch, torch.distributed as dist
import torch.distributed.checkpoint as dcp
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
dcp.async_save({"model": model.state_dict()}, checkpoint_id=sys.argv[1]).result()
state = {"model": torch.nn.Linear(4, 2).state_dict()}
dcp.load(state, checkpoint_id=sys.argv[1])
print("LOADED", round(state["model"]["weight"].sum().item(), 6))
dist.destroy_process_group()
"""


@pytest.mark.parametrize("isolation", ["threads", "processes"])
def test_an_async_checkpoint_fails_clearly_instead_of_saving_one_rank_over_another(tmp_path, isolation):
    script = tmp_path / "async_ckpt.py"
    script.write_text(ASYNC_SAVE)
    proc = subprocess.run(
        [sys.executable, "-m", "simdist.run", "--backend", "sim", "--isolation", isolation, "--nproc-per-node", "2",
         str(script), str(tmp_path / "checkpoint")], capture_output=True, text=True, timeout=150,
    )  # fmt: skip
    assert proc.returncode == 1 and "LOADED" not in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "called from thread 'AsyncCheckpointExecutor" in proc.stderr, proc.stderr[-3000:]
