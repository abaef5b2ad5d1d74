"""``init_process_group`` on the socket backend returns once every rank has joined, as torch's does.

A program (torch's own test harness among them) may time what follows ``init_process_group`` from
its return: with torch (gloo's rendezvous, the ``TCPStore`` waiting for its workers) no rank gets
there before the slowest rank has started. Each case runs real processes, one of them late.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from simdist.backends.socket import new_secret
from simdist.core import free_port

pytestmark = pytest.mark.timeout(180)

LATE_S = 2.0  # how long the late rank sleeps before it calls init_process_group

PROGRAM = """
import os, sys, time
engine, rank, world, flag = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if engine == "torch":
    import torch.distributed as dist
    backend = "gloo"
else:
    import simdist as dist
    backend = "socket"
if rank == world - 1:  # late: it joins LATE_S after rank 0 called init_process_group
    while not os.path.exists(flag + ".0"):
        time.sleep(0.01)
    time.sleep(float(os.environ["LATE_S"]))
    open(flag, "w").close()  # this rank is about to join
t = time.monotonic()
if rank == 0:
    open(flag + ".0", "w").close()
dist.init_process_group(backend, init_method="tcp://127.0.0.1:" + os.environ["PORT"], rank=rank, world_size=world)
print("rank", rank, "joined after the late rank:", os.path.exists(flag), "waited", round(time.monotonic() - t, 2))
dist.barrier()  # no rank leaves while a peer may still be finishing its connections (gloo reports a closed peer)
dist.destroy_process_group()
"""


def _run(engine: str, world: int, tmp_path) -> list[str]:
    env = dict(os.environ, PORT=str(free_port()), SIMDIST_SECRET=new_secret(), LATE_S=str(LATE_S))
    flag = str(tmp_path / f"{engine}-late-rank-started")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PROGRAM, engine, str(r), str(world), flag],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
        outs.append(out.strip())
    return outs


@pytest.mark.parametrize("engine", ["simdist", "torch"])
@pytest.mark.parametrize("world", [2, 3])
def test_init_returns_once_the_late_rank_has_joined(engine, world, tmp_path):
    """Every rank's init_process_group returns after the last rank called it (simdist's socket backend,
    and torch's gloo as the truth it follows)."""
    outs = _run(engine, world, tmp_path)
    for rank, out in enumerate(outs):
        assert f"rank {rank} joined after the late rank: True" in out, outs
    assert float(outs[0].rsplit(" ", 1)[1]) >= LATE_S, outs  # rank 0 waited for the late rank


def test_a_rank_that_never_joins_is_named_when_init_times_out(tmp_path):
    """Ranks 0 and 1 of 3 without rank 2: init_process_group ends at its timeout, naming rank 2 on rank 0.

    Rank 1 is in init_process_group (waiting for rank 0's store) before rank 0 starts, and waits longer than rank
    0 (a start, or a join under load, can take seconds): rank 0's 10 s are for rank 1's join once the store is up.
    """
    code = (
        "import datetime, os, sys, simdist\n"
        "rank, seconds = int(sys.argv[1]), int(sys.argv[2])\n"
        "print('ready', flush=True)\n"
        "simdist.init_process_group('socket', init_method='tcp://127.0.0.1:' + os.environ['PORT'],"
        " rank=rank, world_size=3, timeout=datetime.timedelta(seconds=seconds))\n"
    )
    env = dict(os.environ, PORT=str(free_port()), SIMDIST_SECRET=new_secret())
    t = time.monotonic()
    late = subprocess.Popen(
        [sys.executable, "-c", code, "1", "40"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert late.stdout is not None and late.stdout.readline() == "ready\n", late.communicate(timeout=120)
    first = subprocess.Popen([sys.executable, "-c", code, "0", "10"], env=env, stderr=subprocess.PIPE, text=True)
    procs = [first, late]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert all(p.returncode != 0 for p in procs), errs
    assert time.monotonic() - t < 90, errs
    assert "DistTimeoutError: init_process_group: rank 0 waited 10 s for every rank of 3 to join" in errs[0], errs[0]
    assert "rank(s) [2] did not" in errs[0], errs[0]
    # rank 1 timed out too, or lost the store when rank 0, which served it, exited first
    assert "init_process_group: rank 1" in errs[1], errs[1]
