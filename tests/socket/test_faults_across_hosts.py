"""A host dies in the middle of a job across hosts (tests/support/netns_hosts.py), while the machine is busy.

Two hosts, one rank each, all-reducing in a loop on the socket backend; every process of one host is
killed (SIGKILL, as when a machine dies): a worker's host, or the host of the job's store. The surviving
rank raises ``PeerLostError`` naming the dead rank and its host's address within 2 s, its launcher exits
non-zero naming the failure, and nothing of the job is left on the surviving host. Two busy processes load
the machine's cores meanwhile, as training does (a load that once let a survivor hang).

A host frozen (SIGSTOP) or whose link goes down keeps its TCP connections open: the survivors notice that its
heartbeat stands still, after the liveness interval (``SIMDIST_LIVENESS``, default 10 s; 3 s here), whatever
the operations' timeout (300 s here). A frozen host of the store: the survivors find the store silent for as long.
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


def _start(bed, script: Path, env_extra: dict[str, str] | None = None) -> list[subprocess.Popen]:
    """The loop on every host of ``bed``, one rank each; returns once rank 0 runs."""
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    env.update({"SIMDIST_SECRET": new_secret(), **(env_extra or {})})
    nodes = []
    for host in bed.hosts:
        argv = [sys.executable, "-m", "simdist.run", "--backend", "socket", "--nnodes", str(len(bed))]
        argv += ["--node-rank", str(host.index), "--master-addr", bed[0].address, "--master-port", "29710"]
        argv += ["--nproc-per-node", "1", "--timeout", "300", str(script)]
        nodes.append(host.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    stdout = nodes[0].stdout
    assert stdout is not None
    for line in stdout:
        if "running" in line:
            return nodes
    pytest.fail(f"the job did not start: {nodes[0].stderr.read() if nodes[0].stderr else ''}")


def _raised(out: str) -> tuple[int, float, str, str]:
    found = re.search(r"rank=(\d) raised at ([\d.]+): (\w+): (.*)", out)
    assert found, out
    return int(found[1]), float(found[2]), found[3], found[4]


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
        nodes = _start(bed, script)
        killed_at = time.time()
        for pid in subprocess.run(
            ["ip", "netns", "pids", bed[victim].ns], capture_output=True, text=True
        ).stdout.split():
            os.kill(int(pid), signal.SIGKILL)
        rest, err = nodes[survivor].communicate(timeout=120)
    finally:
        for proc in busy:
            proc.kill()
    rank, when, kind, message = _raised(rest + err)
    assert rank == survivor and kind == "PeerLostError", message
    assert when - killed_at <= 2.0, f"rank {survivor} raised {when - killed_at:.2f} s after the kill"
    assert f"rank {victim}" in message and bed[victim].address in message, message  # the rank and its host
    assert nodes[survivor].returncode != 0 and "simdist run:" in err and "failed" in err, err
    left = subprocess.run(["ip", "netns", "pids", bed[survivor].ns], capture_output=True, text=True).stdout.split()
    assert not left, f"processes left on the surviving host: {left}"
    assert _shm_files() == shm_before
    print(f"host {victim} killed: rank {survivor} raised after {when - killed_at:.2f} s")


LIVENESS = 3.0


@pytest.mark.parametrize("fault", ["frozen", "link-down", "stores-host-frozen"])
def test_a_frozen_host_or_a_downed_link_is_found_by_its_silence(testbed, tmp_path: Path, fault: str) -> None:
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    struck, survivor = (0, 1) if fault == "stores-host-frozen" else (1, 0)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        bed = testbed(2)
        nodes = _start(bed, script, {"SIMDIST_LIVENESS": str(LIVENESS)})
        struck_at = time.time()
        if fault == "link-down":
            bed[1].link(up=False)
        else:
            for pid in subprocess.run(
                ["ip", "netns", "pids", bed[struck].ns], capture_output=True, text=True
            ).stdout.split():
                os.kill(int(pid), signal.SIGSTOP)
        rest, err = nodes[survivor].communicate(timeout=120)
    finally:
        for proc in busy:
            proc.kill()
    rank, when, kind, message = _raised(rest + err)
    took = when - struck_at
    assert rank == survivor, message
    if fault == "stores-host-frozen":  # the store does not answer: the survivor says so, and for how long
        assert kind == "DistError" and "unreachable" in message and bed[0].address in message, message
        assert f"more than {LIVENESS:g} s" in message, message
    else:
        assert kind == "PeerLostError", message
        assert "rank 1" in message and "no sign of life" in message and bed[1].address in message, message
    assert took <= LIVENESS + 2.5, f"rank {survivor} raised {took:.2f} s after the host was {fault}: {message}"
    assert nodes[survivor].returncode != 0 and "simdist run:" in err, err
    if fault == "link-down":  # the cut-off host's rank cannot reach the store: it raises as well
        rest1, err1 = nodes[1].communicate(timeout=60)
        assert nodes[1].returncode != 0, rest1 + err1
        _, when1, kind1, message1 = _raised(rest1 + err1)
        assert kind1 in ("PeerLostError", "DistError", "DistTimeoutError"), message1
        # never held up in a send the downed link cannot take: its waits see the store's silence
        assert when1 - struck_at <= LIVENESS + 5, f"rank 1 raised {when1 - struck_at:.2f} s after: {message1}"
    left = subprocess.run(["ip", "netns", "pids", bed[survivor].ns], capture_output=True, text=True).stdout.split()
    assert not left, f"processes left on the surviving host: {left}"
    print(f"host {struck} {fault}: rank {survivor} raised after {took:.2f} s (liveness {LIVENESS:g} s)")
