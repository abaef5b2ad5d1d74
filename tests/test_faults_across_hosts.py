"""A host dies in the middle of a job across hosts (tests/netns_hosts.py), while the machine is busy.

Two hosts, one rank each, all-reducing in a loop on the socket backend; every process of one host is
killed (SIGKILL, as when a machine dies): a worker's host, or the host of the job's store. The surviving
rank raises ``PeerLostError`` naming the dead rank and its host's address within 2 s, its launcher exits
non-zero naming the failure, and nothing of the job is left on the surviving host. Two busy processes load
the machine's cores meanwhile, as training does (a load that once let a survivor hang).

Not covered here: a host frozen (SIGSTOP) or a link set down, which keep the TCP connections open; the
socket backend notices those only when an operation times out (``--timeout``, ``SIMDIST_TIMEOUT``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from netns_hosts import testbed
from simdist.backends.socket import new_secret

__all__ = ["testbed"]  # the fixture, used below

pytestmark = pytest.mark.timeout(180)

LOOP = """\
import time
import torch
import simdist as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1 << 16)
for i in range(10**9):
    try:
        dist.all_reduce(t)
    except Exception as exc:
        print(f"rank={rank} raised at {time.time():.3f}: {type(exc).__name__}: {exc}", flush=True)
        raise
    t.fill_(1.0)
    if i == 50:
        print(f"rank={rank} running", flush=True)
"""


def _shm_files() -> set[str]:
    return {f for f in os.listdir("/dev/shm") if "simdist" in f} if os.path.isdir("/dev/shm") else set()


@pytest.mark.parametrize("victim", [1, 0], ids=["a-workers-host", "the-stores-host"])
def test_a_killed_host_is_named_by_the_survivor_within_2_s_on_a_busy_machine(
    testbed, tmp_path: Path, victim: int
) -> None:
    survivor = 1 - victim
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    shm_before = _shm_files()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        bed = testbed(2)
        env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
        env["SIMDIST_SECRET"] = new_secret()
        nodes = []
        for host in bed.hosts:
            argv = [sys.executable, "-m", "simdist.run", "--backend", "socket", "--nnodes", "2"]
            argv += ["--node-rank", str(host.index), "--master-addr", bed[0].address, "--master-port", "29710"]
            argv += ["--nproc-per-node", "1", str(script)]
            nodes.append(host.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
        stdout = nodes[survivor].stdout
        assert stdout is not None
        for line in stdout:
            if "running" in line:
                break
        else:
            pytest.fail(f"the job did not start: {nodes[survivor].stderr.read() if nodes[survivor].stderr else ''}")
        killed_at = time.time()
        for pid in subprocess.run(
            ["ip", "netns", "pids", bed[victim].ns], capture_output=True, text=True
        ).stdout.split():
            os.kill(int(pid), signal.SIGKILL)
        rest, err = nodes[survivor].communicate(timeout=120)
    finally:
        for proc in busy:
            proc.kill()
    raised = re.search(r"rank=(\d) raised at ([\d.]+): (\w+): (.*)", rest)
    assert raised, rest + err
    rank, when, kind, message = int(raised[1]), float(raised[2]), raised[3], raised[4]
    assert rank == survivor and kind == "PeerLostError", raised[0]
    assert when - killed_at <= 2.0, f"rank {survivor} raised {when - killed_at:.2f} s after the kill"
    assert f"rank {victim}" in message and bed[victim].address in message, message  # the rank and its host
    assert nodes[survivor].returncode != 0 and "simdist run:" in err and "failed" in err, err
    left = subprocess.run(["ip", "netns", "pids", bed[survivor].ns], capture_output=True, text=True).stdout.split()
    assert not left, f"processes left on the surviving host: {left}"
    assert _shm_files() == shm_before
    print(f"host {victim} killed: rank {survivor} raised after {when - killed_at:.2f} s")
