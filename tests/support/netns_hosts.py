"""Hosts made as Linux network namespaces, for tests of jobs across machines.

A :class:`NetnsTestbed` of N hosts: each host is a network namespace with its own loopback and one
interface ``eth0`` holding an address of a private subnet that is the testbed's own; every
``eth0`` is one end of a veth pair whose other end is a port of a Linux bridge inside a switch
namespace. Nothing is attached to the namespace the tests run in, so all traffic stays inside the
testbed (and each host's loopback). A link may be shaped (``tc ... tbf``, both directions), set
down and up again. ``close()`` kills what runs in the namespaces and deletes them, which removes
their interfaces; it runs also when the test fails. Namespaces left by a run that was killed
(their names carry the creating process's pid) are removed by the next testbed.

Needs root and iproute2's ``ip`` and ``tc``; :func:`unavailable` says why a machine cannot. The
kernel here has no ``netem`` (delay, loss): a test that needs them says so.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import pytest

PREFIX = "sdtb"
"""Every namespace of a testbed is named ``sdtb<pid>-<tag>-<role>``."""

_subnets = itertools.count(1)


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def unavailable() -> str | None:
    """Why network namespaces cannot be made here (``None``: they can)."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux's; this is {sys.platform}"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"iproute2's {tool!r} is not installed"
    probe = f"{PREFIX}{os.getpid()}-probe-{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    if made.returncode != 0:
        return f"'ip netns add' failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return None


def namespaces() -> list[str]:
    """The network namespaces of this machine, by name."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _remove_namespace(ns: str) -> None:
    """Kill every process in ``ns``, then delete it (its interfaces go with it)."""
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def remove_stale() -> list[str]:
    """Delete the testbed namespaces whose creating process is gone (a run killed before its cleanup)."""
    removed = []
    for ns in namespaces():
        if not ns.startswith(PREFIX):
            continue
        pid = ns[len(PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            _remove_namespace(ns)
            removed.append(ns)
    return removed


def _tbf(dev: str, ns: str, rate: str) -> None:
    """Shape ``dev``'s egress to ``rate`` (``'100mbit'``) with a token bucket of a few ms of traffic."""
    per_second = _bits(rate) // 8
    burst = max(32 * 1024, per_second // 200)
    cmd = ["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate]
    proc = subprocess.run([*cmd, "burst", str(burst), "latency", "100ms"], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")


def _bits(rate: str) -> int:
    """Bits per second of a tc rate: ``'100mbit'``, ``'1gbit'``, ``'500kbit'``."""
    units = {"gbit": 10**9, "mbit": 10**6, "kbit": 10**3, "bit": 1}
    for unit, factor in units.items():
        if rate.endswith(unit):
            return int(float(rate[: -len(unit)]) * factor)
    raise ValueError(f"rate={rate!r}: expected a number with gbit, mbit, kbit or bit")


@dataclass
class Host:
    """One host of a testbed: a network namespace with ``eth0`` at ``address``."""

    index: int
    ns: str
    address: str
    switch_port: str  # the bridge's end of this host's link, in the switch namespace
    switch_ns: str
    processes: list[subprocess.Popen] = field(default_factory=list)

    def command(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *argv]

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen:
        """Start ``argv`` on this host (killed at the testbed's close if still running)."""
        proc = subprocess.Popen(self.command(argv), **kwargs)
        self.processes.append(proc)
        return proc

    def run(self, argv: list[str], timeout: float = 60, **kwargs: Any) -> subprocess.CompletedProcess:
        """Run ``argv`` on this host to its end; its output as text."""
        return subprocess.run(self.command(argv), capture_output=True, text=True, timeout=timeout, **kwargs)

    def python(self, code: str, *args: str, timeout: float = 60, **kwargs: Any) -> subprocess.CompletedProcess:
        """Run Python ``code`` (with ``sys.argv[1:] == args``) on this host, with the test's interpreter."""
        return self.run([sys.executable, "-c", code, *args], timeout=timeout, **kwargs)

    def shape(self, rate: str | None) -> None:
        """Limit this host's link to ``rate`` in both directions (``None``: unlimited again)."""
        for dev, ns in (("eth0", self.ns), (self.switch_port, self.switch_ns)):
            if rate is None:
                subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], capture_output=True, timeout=30)
            else:
                _tbf(dev, ns, rate)

    def link(self, up: bool) -> None:
        """Set this host's link down (a pulled cable: the host sees its interface go) or up again."""
        _ip("link", "set", "eth0", "up" if up else "down", ns=self.ns)


class NetnsTestbed:
    """``n`` hosts on one switch, each link optionally shaped to ``rate``; a context manager."""

    def __init__(self, n: int, rate: str | None = None):
        if not 1 <= n <= 250:
            raise ValueError(f"n={n}: expected 1 to 250 hosts")
        remove_stale()
        self.tag = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:5]}"
        self.switch = f"{self.tag}-switch"
        self.subnet = f"10.{200 + os.getpid() % 50}.{next(_subnets) % 250}"
        self.hosts: list[Host] = []
        self._made: list[str] = []
        try:
            self._make(n, rate)
        except BaseException:
            self.close()
            raise

    def _make(self, n: int, rate: str | None) -> None:
        short = self.tag[-5:]  # interface names: at most 15 characters
        _ip("netns", "add", self.switch)
        self._made.append(self.switch)
        _ip("link", "add", "br0", "type", "bridge", ns=self.switch)
        _ip("link", "set", "br0", "up", ns=self.switch)
        for i in range(n):
            ns = f"{self.tag}-host{i}"
            _ip("netns", "add", ns)
            self._made.append(ns)
            port, end = f"sw{short}p{i}", f"h{short}e{i}"
            _ip("link", "add", end, "netns", ns, "type", "veth", "peer", "name", port, "netns", self.switch)
            _ip("link", "set", end, "name", "eth0", ns=ns)
            address = f"{self.subnet}.{i + 1}"
            _ip("addr", "add", f"{address}/24", "dev", "eth0", ns=ns)
            _ip("link", "set", "eth0", "up", ns=ns)
            _ip("link", "set", "lo", "up", ns=ns)
            _ip("link", "set", port, "master", "br0", ns=self.switch)
            _ip("link", "set", port, "up", ns=self.switch)
            host = Host(i, ns, address, port, self.switch)
            self.hosts.append(host)
            if rate is not None:
                host.shape(rate)

    def close(self) -> None:
        """Kill what runs on the hosts and delete every namespace of the testbed (idempotent)."""
        for host in self.hosts:
            for proc in host.processes:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=10)
        for ns in reversed(self._made):
            _remove_namespace(ns)
        self._made.clear()

    def __enter__(self) -> "NetnsTestbed":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def launch(
        self,
        script: str,
        *,
        per_host: int = 1,
        port: int,
        env: dict[str, str],
        options: Sequence[str] = (),
        launcher: Sequence[str] = ("-m", "simdist.run"),
    ) -> list[subprocess.Popen]:
        """``simdist run --nnodes N --node-rank i --master-addr HOST0 ... script`` started on every host ``i``,
        ``per_host`` ranks each, with ``env`` (which must hold ``SIMDIST_SECRET``) and further launcher
        ``options``; output piped, as text. ``options`` may name ``{host}``, this host's index; ``launcher``:
        the interpreter's arguments that start simdist run."""
        nodes = []
        for host in self.hosts:
            argv = [
                sys.executable,
                *launcher,
                "--nnodes",
                str(len(self.hosts)),
                "--node-rank",
                str(host.index),
            ]
            argv += ["--master-addr", self.hosts[0].address, "--master-port", str(port)]
            argv += ["--nproc-per-node", str(per_host), *(o.format(host=host.index) for o in options), script]
            nodes.append(host.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
        return nodes

    def __getitem__(self, i: int) -> Host:
        return self.hosts[i]

    def __len__(self) -> int:
        return len(self.hosts)


@pytest.fixture
def testbed() -> Iterator[Any]:
    """``make(n, rate=None)`` -> a :class:`NetnsTestbed`; every testbed made is removed after the test, passed or not.
    Skips the test, with the reason, where network namespaces cannot be made."""
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"hosts as network namespaces: {reason}")
    made: list[NetnsTestbed] = []

    def make(n: int, rate: str | None = None) -> NetnsTestbed:
        bed = NetnsTestbed(n, rate)
        made.append(bed)
        return bed

    try:
        yield make
    finally:
        for bed in made:
            bed.close()
