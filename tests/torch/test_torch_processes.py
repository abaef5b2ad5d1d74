"""torch.distributed programs on real processes, their groups simdist socket groups through the process bridge.

Each test runs its ranks with ``simdist.spawn(..., backend="socket")``, which installs the bridge
(``simdist.torch_bridge.processes``) in every rank process: the groups torch creates there are
simdist socket groups, whatever backend the program names, and torch's own rendezvous is left to
the program. These are the cases torch's own distributed tests met on this path
(``benchmarks/torch_suite.py``, the socket side; docs/torch-suite.md).
"""

from __future__ import annotations

import os
import re
import time
from datetime import timedelta

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


def profiled_ops(rank: int) -> list:
    """torch's profiler around two collectives, as torch's tests check it (``get_profiling_event``)."""
    dist.init_process_group("gloo")
    t = torch.ones(2, 3)
    with torch.autograd.profiler.profile(record_shapes=True) as prof:
        dist.all_reduce(t)
        dist.broadcast(t, 0)
    events = [(e.name, e.is_async, e.input_shapes, e.count) for e in prof.function_events if e.name.startswith("gloo:")]
    dist.destroy_process_group()
    return events


def test_the_profiler_sees_each_op_as_gloo_records_it():
    expected = [("gloo:all_reduce", True, [[2, 3]], 1), ("gloo:broadcast", True, [[2, 3]], 1)]
    assert _socket(profiled_ops) == [expected] * 2


def barrier_alone(rank: int) -> tuple:
    """Rank 0 alone enters a barrier of a group made with a 1 s timeout (torch's test_barrier_timeout_full_group)."""
    dist.init_process_group("gloo")
    group = dist.new_group([0, 1], timeout=timedelta(seconds=1))
    outcome = (None, 0.0)
    if rank == 0:
        start = time.monotonic()
        try:
            dist.barrier(group)
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test checks
            outcome = (str(exc), time.monotonic() - start)
    dist.barrier()  # the default group (60 s) is still fine
    return outcome


def test_a_groups_own_timeout_ends_a_wait_on_it_with_a_timeout_error():
    (message, waited), _ = _socket(barrier_alone)
    assert message is not None and 1.0 <= waited < 10.0, (message, waited)
    assert re.search(" (Timed out|closed|timeout) ", message), message  # what torch's tests match on gloo's errors


def future_then_send(rank: int) -> list:
    """Rank 0 takes an all_reduce's future, then sends what rank 1 receives before it joins the all_reduce."""
    dist.init_process_group("gloo")
    t, x = torch.tensor([rank + 1.0]), torch.zeros(1)
    if rank == 0:
        fut = dist.all_reduce(t, async_op=True).get_future()  # returns at once, as on gloo
        dist.send(torch.tensor([7.0]), 1)
        result = [v.tolist() for v in fut.wait()]
    else:
        dist.recv(x, 0)
        dist.all_reduce(t)
        result = [t.tolist(), x.tolist()]
    dist.destroy_process_group()
    return result


def test_a_works_future_does_not_wait_for_the_work():
    assert _socket(future_then_send) == [[[3.0]], [[3.0], [7.0]]]


def failing_future(rank: int) -> str:
    """A collective that fails (a dtype mismatch) fails its future, which carries the error to who waits on it."""
    dist.init_process_group("gloo")
    t = torch.ones(2, dtype=torch.float32 if rank == 0 else torch.int32)
    fut = dist.all_reduce(t, async_op=True).get_future()
    try:
        fut.wait()
    except Exception as exc:  # noqa: BLE001 - the message is what the test checks
        return type(exc).__name__ + ": " + str(exc).splitlines()[0]
    return "no error"


def test_a_failed_work_fails_its_future():
    for message in _socket(failing_future):
        assert "collective mismatch" in message and "dtype" in message, message


PEER_GONE_IN_BACKWARD = """\
import os, time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(4, 4))
for _ in range(2):
    model(torch.ones(2, 4)).sum().backward()
loss = model(torch.ones(2, 4)).sum()
if dist.get_rank() == 1:
    os._exit(0)
time.sleep(1)
loss.backward()
"""


@pytest.mark.parametrize("checked", ["1", "0"])
def test_ddp_whose_peer_has_gone_raises_naming_the_peer_and_the_line(tmp_path, checked):
    """DDP's reducer waits on the all-reduce's future in C++: the op's error fails that future as an error (gloo raises
    "Connection closed by peer" there), not a value that C++ reads as tensors (a SIGSEGV of the rank)."""
    import subprocess
    import sys

    script = tmp_path / "peer_gone.py"
    script.write_text(PEER_GONE_IN_BACKWARD)
    env = {**os.environ, "SIMDIST_CHECK_COLLECTIVES": checked}
    proc = subprocess.run([sys.executable, "-m", "simdist.run", "--backend", "socket", "--nproc-per-node", "2",
                           str(script)], capture_output=True, text=True, timeout=100, env=env)  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "SIGSEGV" not in out and "killed by" not in out, out[-3000:]
    assert re.search(r'peer_gone\.py", line 11, in <module>', out), out[-3000:]
    assert re.search(r"RuntimeError: .*rank 1 failed: its process ended", out), out[-3000:]
