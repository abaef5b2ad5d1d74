"""The testbed of hosts as network namespaces (tests/support/netns_hosts.py): hosts reach each other over their links
and nothing else, links shape and go down, and nothing is left behind, also when a test fails."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from netns_hosts import PREFIX, NetnsTestbed, namespaces, remove_stale, testbed, unavailable

__all__ = ["testbed"]  # the fixture, used below

pytestmark = pytest.mark.timeout(120)

SERVER = r"""
import socket, sys
srv = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
conn, peer = srv.accept()
total = 0
while True:
    data = conn.recv(1 << 20)
    if not data:
        break
    total += len(data)
conn.sendall(f"{peer[0]} {total}".encode())
conn.close()
"""

CLIENT = r"""
import socket, sys, time
size = int(sys.argv[3])
start = time.perf_counter()
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30) as s:
    s.sendall(b"x" * size)
    s.shutdown(socket.SHUT_WR)
    answer = s.recv(100).decode()
print(answer, time.perf_counter() - start)
"""


def _send(bed: NetnsTestbed, size: int, port: int = 5555) -> tuple[str, int, float]:
    """``size`` bytes from host 1 to a server on host 0: (the sender's address the server saw, bytes, seconds)."""
    server = bed[0].popen([sys.executable, "-c", SERVER, bed[0].address, str(port)], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None and server.stdout.readline().strip() == "listening"
    sent = bed[1].python(CLIENT, bed[0].address, str(port), str(size))
    assert sent.returncode == 0, sent.stderr
    peer, total, seconds = sent.stdout.split()
    server.wait(timeout=30)
    return peer, int(total), float(seconds)


def test_hosts_reach_each_other_over_their_link_and_have_loopbacks_of_their_own(testbed) -> None:
    bed = testbed(3)
    assert len({h.address for h in bed.hosts}) == 3 and all(h.ns in namespaces() for h in bed.hosts)
    peer, total, _ = _send(bed, 1 << 20)
    assert (peer, total) == (bed[1].address, 1 << 20)  # the server saw host 1's address: TCP over the link
    # host 0's loopback is its own: a server there is not reachable at 127.0.0.1 from host 1
    server = bed[0].popen([sys.executable, "-c", SERVER, "127.0.0.1", "5557"], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None and server.stdout.readline().strip() == "listening"
    probe = bed[1].python("import socket; socket.create_connection(('127.0.0.1', 5557), timeout=2)")
    assert probe.returncode != 0 and "ConnectionRefusedError" in probe.stderr, probe.stderr
    # and the testbed is not attached to the machine: none of its interfaces is in the test's own namespace
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, timeout=30).stdout
    assert bed.tag[-5:] not in links, links


def test_a_shaped_link_carries_no_more_than_its_rate(testbed) -> None:
    rate_bits, size = 40_000_000, 4 << 20
    bed = testbed(2, rate="40mbit")
    _, total, seconds = _send(bed, size)
    assert total == size
    floor = size * 8 / rate_bits * 0.85  # the token bucket's burst lets a little through at once
    assert seconds >= floor, f"{size} bytes over a 40 Mbit/s link in {seconds:.2f} s (at least {floor:.2f} s)"
    bed[1].shape(None)
    bed[0].shape(None)
    _, _, unshaped = _send(bed, size, port=5556)
    print(f"4 MiB: {seconds:.2f} s at 40 Mbit/s, {unshaped:.3f} s unshaped")


def test_a_link_goes_down_and_up(testbed) -> None:
    bed = testbed(2)
    bed[1].link(up=False)
    probe = bed[1].python("import socket, sys; socket.create_connection((sys.argv[1], 9), timeout=2)", bed[0].address)
    assert probe.returncode != 0 and "Network is unreachable" in probe.stderr, probe.stderr
    bed[1].link(up=True)
    deadline = time.monotonic() + 10
    while True:  # the link's carrier comes back within moments
        peer, total, _ = _send(bed, 1000, port=5560 + int(time.monotonic() * 10) % 100)
        if total == 1000 or time.monotonic() > deadline:
            break
    assert (peer, total) == (bed[1].address, 1000)


def test_everything_is_removed_also_when_the_test_fails() -> None:
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"hosts as network namespaces: {reason}")
    with pytest.raises(RuntimeError, match="the test failed"):
        with NetnsTestbed(2) as bed:
            names = [bed.switch, *(h.ns for h in bed.hosts)]
            sleeper = bed[0].popen([sys.executable, "-c", "import time; time.sleep(600)"])
            assert set(names) <= set(namespaces())
            raise RuntimeError("the test failed")
    assert not set(names) & set(namespaces())
    assert sleeper.poll() is not None  # killed with its host


def test_namespaces_of_a_killed_run_are_removed_by_the_next() -> None:
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"hosts as network namespaces: {reason}")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = f"{PREFIX}{gone.pid}-dead0-host0"
    subprocess.run(["ip", "netns", "add", stale], check=True, timeout=30)
    assert stale in namespaces()
    assert stale in remove_stale()
    assert stale not in namespaces()
