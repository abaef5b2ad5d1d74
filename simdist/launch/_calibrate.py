"""Calibration: measure this machine's latency, bandwidth, bandwidth sharing, reduction, memory and check costs.

``simdist calibrate`` (or :func:`calibrate`) starts real ranks of the socket backend on this
machine (loopback) and measures, in the ranks themselves, the terms of the topology model
(:mod:`simdist.core._topology`):

- **bandwidth**: ping-pong between 2 ranks; the slope of the one-way time (half a round
  trip) over the sizes from 1 to 64 MiB.
- **alpha, host_overhead**: every rank sends 8 bytes to its right neighbour and receives
  from its left at once (a *shift*, one step of a ring algorithm), :data:`STEPS` shifts
  back to back as the steps of a collective follow each other; a shift's time is their
  time over :data:`STEPS`. ``k`` such messages pass through the one host one after the
  other, so a shift takes ``alpha + k * host_overhead``: the shifts at worlds 2 and 4
  give both terms.
- **rank_bandwidth**: a shift of ``n`` bytes at world 2 has each rank send and receive ``n``
  bytes at once; the model makes that ``alpha + 2 n / rank_bandwidth``.
- **host_bandwidth**: the same shift at world 4 moves ``4 n`` bytes through one host at
  once: ``alpha + max(2 n / rank_bandwidth, 4 (host_overhead + n / host_bandwidth))``; the
  file takes the ``host_bandwidth`` that makes the second term the measured time, the
  largest value the measurement allows (on a machine where 4 ranks share bandwidth no
  worse than 2 it binds only at larger worlds; null where the overhead alone explains it).
- **gamma**: ``a.add_(b)`` on float32 tensors of 16 to 64 MiB in a rank process (one torch
  thread), seconds per byte of ``a``: larger than the caches, as a reduction of data just
  received from another process streams it from memory; **host_cores**: the CPUs this process may run on, so
  that ranks beyond them wait for a core to reduce.
- **fresh_memory, fresh_from, memcpy**: copying into a new buffer minus copying into a used
  one, per byte, at each size of :data:`FRESH_SIZES` (after a warm-up, as in a loop of
  collectives): the page faults that a new buffer costs the first time it is written.
  ``fresh_memory`` is that cost at the two largest sizes, ``fresh_from`` the smallest size
  from which every size costs at least half of it (the allocator's mmap threshold: smaller
  buffers reuse touched memory), ``memcpy`` the seconds per byte of copying into a used
  buffer from ``fresh_from`` (out of cache, as the staging of large lists copies).
- **check_overhead, call_overhead**: a 4-byte all_gather after a barrier (as a program
  calls a collective), timed with the socket backend's cross-rank check of every collective
  on and off, the two interleaved in one job, at worlds 2 and 4. ``check_overhead`` is the
  difference over the check's ``ceil(log2 p)`` rounds (the median of the two worlds); at
  world 2 the unchecked all_gather is one exchange, so what it takes beyond one shift of 8
  bytes after a barrier is ``call_overhead``.

Each figure is the median of several repetitions. It writes a topology file
(:mod:`simdist.core._topology_file`, layout ``fully_connected``, every rank on one host) that
``simulate(topology=path)`` and the app load. ``simdist calibrate --nnodes N`` run on each of N
hosts measures the links between them as well and writes a ``two_level`` file
(:mod:`simdist.launch._calibrate_hosts`).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core._topology_file import FORMAT, write_topology_file

__all__ = ["calibrate", "describe", "fit", "fit_check", "fit_memory", "main"]

KIB, MIB = 1 << 10, 1 << 20
PING_SIZES = (1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB)
QUICK_PING_SIZES = (1 * MIB, 4 * MIB)
SHIFT_SIZES = (8, 4 * MIB, 16 * MIB)
QUICK_SHIFT_SIZES = (8, 4 * MIB)
GAMMA_SIZES = (16 * MIB, 32 * MIB, 64 * MIB)
SMALL = 4 * KIB  # shifts up to this size measure alpha, larger ones the bandwidth sharing
STEPS = 8
"""Small shifts are timed this many back to back (steps of a collective follow each other)."""
FRESH_SIZES = (4 * MIB, 8 * MIB, 16 * MIB, 24 * MIB, 32 * MIB, 48 * MIB, 64 * MIB, 128 * MIB)
"""Sizes at which new buffers are timed against used ones (the mmap threshold lies between)."""

# The measurements' names, as the progress lines say them
_CHECK, _PING, _SHIFT = (
    "the cross-rank check ({world} ranks)",
    "ping-pong of {size} (2 ranks)",
    "ring shift of {size} ({world} ranks)",
)
_GAMMA, _COPIES = "reduction speed (gamma)", "copies into new and used buffers"


class Progress:
    """Says on stderr which measurement runs and how many are left: a line each, or on a terminal one bar.

    ``Progress(names)`` numbers the measurements ``names`` (in the order they run, as :func:`plan`
    lists them); ``step(name)`` announces one. Rank 0 of each calibration job announces its own, so
    the lines come from the processes that measure; without names nothing is said.
    """

    WIDTH = 24

    def __init__(self, names: Sequence[str], stream: Any = None):
        self.names = list(names)
        self.stream = sys.stderr if stream is None else stream

    def step(self, what: str) -> None:
        if not self.names:
            return
        total, i = len(self.names), self.names.index(what)
        if self.stream.isatty():
            filled = self.WIDTH * i // total
            bar = "#" * filled + "." * (self.WIDTH - filled)
            self.stream.write(f"\r\033[Ksimdist calibrate [{bar}] {i + 1}/{total} {what}")
            if i + 1 == total:
                self.stream.write("\n")
        else:
            left = total - i - 1
            self.stream.write(f"simdist calibrate: {i + 1}/{total} {what}; {f'{left} left' if left else 'the last'}\n")
        self.stream.flush()


def plan(ping: Sequence[int], shifts: Sequence[int]) -> list[str]:
    """The measurements of a calibration with these ping-pong and shift sizes, in the order they run."""
    job2 = [
        _CHECK.format(world=2),
        *(_PING.format(size=_label(n)) for n in ping),
        _GAMMA,
        _COPIES,
        *(_SHIFT.format(size=_label(n), world=2) for n in shifts),
    ]
    return job2 + [_CHECK.format(world=4), *(_SHIFT.format(size=_label(n), world=4) for n in shifts)]


def _label(nbytes: int) -> str:
    """``nbytes`` as people read a message size: bytes below 1 KiB, else KiB or MiB."""
    return f"{nbytes} bytes" if nbytes < KIB else _size(nbytes)


def _timed(fn: Any, reps: int, before: Any = None) -> list[float]:
    """Seconds of each of ``reps`` calls of ``fn()`` (after one warm-up call); ``before()`` runs untimed."""
    times = []
    for i in range(reps + 1):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        if i:
            times.append(time.perf_counter() - t0)
    return times


def _slowest_median(per_rank: list[list[float]]) -> float:
    """The median over repetitions of the slowest rank's time (how a collective's time is measured)."""
    return statistics.median(max(times) for times in zip(*per_rank))


def _copies(reps: int) -> dict[str, dict[int, float]]:
    """Seconds per byte of copying into a new buffer (``"fresh"``) and into a used one (``"used"``), by size."""
    import torch

    out: dict[str, dict[int, float]] = {"fresh": {}, "used": {}}
    for n in FRESH_SIZES:
        src, used = torch.ones(n // 4), torch.ones(n // 4)
        out["fresh"][n] = statistics.median(_timed(lambda: torch.empty(n // 4).copy_(src), reps)) / n  # noqa: B023
        out["used"][n] = statistics.median(_timed(lambda: used.copy_(src), reps)) / n  # noqa: B023
    return out


def fit_memory(fresh: dict[int, float], used: dict[int, float]) -> dict[str, Any]:
    """``fresh_memory``, ``fresh_from`` and ``memcpy`` from seconds per byte of copies into new and used
    buffers by size (see the module doc)."""
    sizes = sorted(fresh)
    faults = {n: max(fresh[n] - used[n], 0.0) for n in sizes}
    per_byte = statistics.median(faults[n] for n in sizes[-2:])
    start = len(sizes) - 1
    while start > 0 and faults[sizes[start - 1]] >= per_byte / 2:
        start -= 1
    return {
        "fresh_memory": per_byte,
        "fresh_from": sizes[start],
        "memcpy": statistics.median(used[n] for n in sizes[start:]),
    }


def _gamma(reps: int) -> float:
    """Seconds per byte of ``a.add_(b)`` on float32 (median over :data:`GAMMA_SIZES`)."""
    import torch

    per_byte = []
    for n in GAMMA_SIZES:
        a, b = torch.ones(n // 4), torch.ones(n // 4)
        per_byte.append(statistics.median(_timed(lambda: a.add_(b), reps)) / n)
    return statistics.median(per_byte)


def _gathers(reps: int) -> dict[str, list[float]]:
    """Seconds of ``reps`` 4-byte all_gathers after a barrier with the socket backend's cross-rank check
    (``"checked"``) and as many without it (``"unchecked"``), interleaved in one job (after one of each
    untimed): every rank turns its default group's check on and off at the same calls, so both see the
    machine in the same state."""
    import torch

    from simdist import api as d

    from ..core._world import require_world

    group: Any = require_world("simdist calibrate").default_group  # the socket backend's group: its ``checked``
    one, every = torch.ones(1), torch.zeros(d.get_world_size())
    times: dict[str, list[float]] = {"checked": [], "unchecked": []}
    saved = group.checked
    try:
        for i in range(reps + 1):
            for checked in (True, False) if i % 2 else (False, True):
                group.checked = checked
                d.barrier()
                t0 = time.perf_counter()
                d.all_gather_into_tensor(every, one)
                if i:
                    times["checked" if checked else "unchecked"].append(time.perf_counter() - t0)
    finally:
        group.checked = saved
    return times


def _rank(
    rank: int, world: int, ping: Sequence[int], shifts: Sequence[int], reps: int, names: Sequence[str] = ()
) -> dict[str, Any]:
    """One rank's part: ping-pong, gamma and copies (world 2), its times of a shift around the ring of each
    size, and of a 4-byte all_gather with the cross-rank check of every collective and without it. Rank 0
    announces each measurement through a :class:`Progress` of ``names``."""
    import torch

    from simdist import api as d

    from ..backends.socket import CHECK_ENV

    torch.set_num_threads(1)  # one intra-op thread per rank, as torchrun gives several ranks of one node
    os.environ[CHECK_ENV] = "1"
    d.init_process_group("socket")
    out: dict[str, Any] = {"one_way": {}, "shift": {}}
    progress = Progress(names if rank == 0 else ())
    try:
        progress.step(_CHECK.format(world=world))
        out["all_gather"] = _gathers(reps * 5)
        right, left = (rank + 1) % world, (rank - 1) % world
        if world == 2:
            for n in ping:
                progress.step(_PING.format(size=_label(n)))
                buf = torch.zeros(max(1, n // 4))

                def pingpong() -> None:
                    if rank == 0:
                        d.send(buf, 1)
                        d.recv(buf, 1)
                    else:
                        d.recv(buf, 0)
                        d.send(buf, 0)

                out["one_way"][n] = statistics.median(_timed(pingpong, reps, d.barrier)) / 2
            if rank == 0:
                progress.step(_GAMMA)
                out["gamma"] = _gamma(reps)
                progress.step(_COPIES)
                out["copies"] = _copies(reps)
        for n in shifts:
            progress.step(_SHIFT.format(size=_label(n), world=world))
            a, b = torch.zeros(max(1, n // 4)), torch.zeros(max(1, n // 4))

            def shift() -> None:
                for w in (d.irecv(b, left), d.isend(a, right)):
                    if w is not None:  # (every rank of the calibration is in the default group)
                        w.wait()

            def steps() -> None:
                for _ in range(STEPS):
                    shift()

            if n <= SMALL:
                out["shift"][n] = [t / STEPS for t in _timed(steps, reps * 3, d.barrier)]
                out["single"] = _timed(shift, reps * 5, d.barrier)
            else:
                out["shift"][n] = _timed(shift, reps, d.barrier)
        d.barrier()
    finally:
        d.destroy_process_group()
    return out


def _bandwidth(one_way: dict[int, float]) -> float:
    """Bytes per second: the least-squares slope of the one-way times over their sizes."""
    xs = sorted(one_way)
    ys = [one_way[n] for n in xs]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    if slope <= 0:  # a noisy machine: fall back to the largest size's average rate
        slope = ys[-1] / xs[-1]
    return 1.0 / slope


def fit(one_way: dict[int, float], shift2: dict[int, float], shift4: dict[int, float]) -> dict[str, Any]:
    """The model's terms from the measured times (seconds by size in bytes); see the module doc."""
    t2 = statistics.median(t for n, t in shift2.items() if n <= SMALL)
    t4 = statistics.median(t for n, t in shift4.items() if n <= SMALL)
    overhead = max((t4 - t2) / 2, 0.0)
    alpha = max(t2 - 2 * overhead, 1e-7)
    big = [n for n in shift2 if n > SMALL]
    host = [4 * n / (shift4[n] - alpha - 4 * overhead) for n in big if shift4[n] - alpha - 4 * overhead > 0]
    return {
        "alpha": alpha,
        "bandwidth": _bandwidth(one_way),
        "rank_bandwidth": statistics.median(2 * n / max(shift2[n] - alpha, 1e-9) for n in big),
        "host_bandwidth": statistics.median(host) if host else None,
        "host_overhead": overhead,
    }


def fit_check(gathers: dict[int, tuple[float, float]]) -> float:
    """``check_overhead``: seconds per round that a collective takes longer with the cross-rank check, from
    ``{world: (seconds checked, seconds unchecked)}`` of one small collective (the median over worlds)."""
    return statistics.median(max(c - u, 0.0) / (w - 1).bit_length() for w, (c, u) in gathers.items())


def calibrate(
    path: str | Path | None = None, *, quick: bool = False, name: str = "calibrated", progress: bool = False
) -> dict[str, Any]:
    """The topology file's object for this machine (loopback, socket backend), written to ``path`` if given.

    ``quick`` measures fewer sizes with fewer repetitions; ``progress`` says on stderr which measurement
    runs and how many are left (``simdist calibrate`` does).
    """
    from ._launch import spawn

    reps = 3 if quick else 9
    ping, shifts = (QUICK_PING_SIZES, QUICK_SHIFT_SIZES) if quick else (PING_SIZES, SHIFT_SIZES)
    names = plan(ping, shifts) if progress else ()
    ranks2 = spawn(_rank, args=(2, ping, shifts, reps, names), nprocs=2, backend="socket")
    ranks4 = spawn(_rank, args=(4, (), shifts, reps, names), nprocs=4, backend="socket")
    two, four = ranks2[0], {"shift": {n: _slowest_median([r["shift"][n] for r in ranks4]) for n in shifts}}
    two["shift"] = {n: _slowest_median([r["shift"][n] for r in ranks2]) for n in shifts}
    terms = fit(two["one_way"], two["shift"], four["shift"])
    gathers = {  # world -> (seconds with the check, seconds without)
        world: (
            _slowest_median([r["all_gather"]["checked"] for r in ranks]),
            _slowest_median([r["all_gather"]["unchecked"] for r in ranks]),
        )
        for world, ranks in ((2, ranks2), (4, ranks4))
    }
    single = _slowest_median([r["single"] for r in ranks2])  # one small shift after a barrier
    memory = fit_memory(two["copies"]["fresh"], two["copies"]["used"])
    spec = {
        "format": FORMAT,
        "name": name,
        "layout": "fully_connected",
        **terms,
        "gamma": two["gamma"],
        **memory,
        "check_overhead": fit_check(gathers),
        "call_overhead": max(gathers[2][1] - single, 0.0),
        "host_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
        "ranks_per_host": None,
        "comment": (
            f"Measured by 'simdist calibrate{' --quick' if quick else ''}' on {platform.node()} "
            f"({platform.machine()}, Python {platform.python_version()}) at "
            f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}: socket backend over loopback."
        ),
        "measured": {
            "one_way_seconds": {str(n): t for n, t in two["one_way"].items()},
            "shift_seconds_world2": {str(n): t for n, t in two["shift"].items()},
            "shift_seconds_world4": {str(n): t for n, t in four["shift"].items()},
            "copy_seconds_per_byte": {kind: {str(n): t for n, t in by.items()} for kind, by in two["copies"].items()},
            "one_shift_8_bytes_seconds_world2": single,
            "all_gather_4_bytes_seconds": {str(w): {"checked": c, "unchecked": u} for w, (c, u) in gathers.items()},
        },
    }
    if path is not None:
        write_topology_file(path, spec)
    return spec


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="simdist calibrate",
        description="Measure this machine's latency, bandwidth, host bandwidth sharing, reduction speed, page "
        "faults of new buffers, copy speed and the cost of each collective's cross-rank check with the socket "
        "backend over loopback, and write a topology file for simulate(topology=PATH) and the app.",
        epilog="examples:\n"
        "  simdist calibrate --out my-machine.json                 # this machine\n"
        "  simdist calibrate --quick --out laptop.json             # fewer sizes and repetitions\n"
        "  simdist calibrate --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --out cluster.json   # on host 0 of 2",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument(
        "--out",
        "-o",
        default="simdist-topology.json",
        metavar="PATH",
        help="where to write the topology file, a .json path (default simdist-topology.json)",
    )
    p.add_argument("--name", default="calibrated", help="the topology's name in reports (default 'calibrated')")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repetitions (about 15 s)")
    hosts = p.add_argument_group(
        "across hosts",
        "Run 'simdist calibrate' with these options on each of M hosts, as 'simdist run' runs a job (the same "
        "SIMDIST_SECRET on every host): the ranks measure the links between the hosts, and node 0 measures the "
        "terms inside a host and writes a two_level topology file (a node per host, whose link its ranks share).",
    )
    hosts.add_argument("--nnodes", type=int, default=1, metavar="M", help="number of hosts (default 1: this machine)")
    hosts.add_argument("--node-rank", type=int, default=0, metavar="K", help="this host's index in 0..M-1 (default 0)")
    hosts.add_argument(
        "--master-addr", default="127.0.0.1", metavar="HOST", help="the address of node 0 (default 127.0.0.1)"
    )
    hosts.add_argument(
        "--master-port",
        type=int,
        default=None,
        metavar="P",
        help="the job uses ports P and P+1 on node 0 (default 29500)",
    )
    hosts.add_argument(
        "--nproc-per-node", type=int, default=1, metavar="N", help="ranks per host, sharing its link (default 1)"
    )
    hosts.add_argument(
        "--host-file",
        metavar="PATH",
        help="take the terms inside a host from this file of 'simdist calibrate' on one of the hosts "
        "instead of measuring them on node 0",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``simdist calibrate``'s arguments; print what was measured; return the exit status."""
    parser = _parser()
    opts = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if not opts.out.endswith(".json"):
        parser.error(f"--out={opts.out!r} must end in .json (simulate(topology=...) loads .json paths as files)")
    if opts.nnodes < 1 or opts.nproc_per_node < 1:
        parser.error(f"--nnodes={opts.nnodes} and --nproc-per-node={opts.nproc_per_node} must be at least 1")
    if not 0 <= opts.node_rank < opts.nnodes:
        parser.error(f"--node-rank={opts.node_rank} must be in 0..{opts.nnodes - 1} for --nnodes={opts.nnodes}")
    if opts.nnodes == 1:
        if opts.host_file or opts.nproc_per_node != 1:
            parser.error("--host-file and --nproc-per-node calibrate across hosts: give --nnodes 2 or more")
        spec = calibrate(opts.out, quick=opts.quick, name=opts.name, progress=True)
    else:
        # a circle by choice: the command picks one host or several, and each node across hosts measures its
        # own host with calibrate()
        from ._calibrate_hosts import calibrate_hosts

        across = calibrate_hosts(opts)
        if across is None:
            sys.stdout.write(f"node {opts.node_rank}: done; node 0 writes the topology file\n")
            return 0
        write_topology_file(opts.out, across)
        spec = across
    sys.stdout.write(f"{describe(spec)}\nwrote {opts.out}\n")
    return 0


def describe(spec: dict[str, Any]) -> str:
    """One line of a topology file's terms, in the units people read (us, GB/s, ps per byte)."""

    def rate(key: str) -> str:
        return "unlimited" if spec.get(key) is None else f"{spec[key] / 1e9:.2f} GB/s"

    return (
        f"alpha {spec['alpha'] * 1e6:.1f} us, bandwidth {rate('bandwidth')}, rank bandwidth {rate('rank_bandwidth')}, "
        f"host bandwidth {rate('host_bandwidth')}, host overhead {(spec.get('host_overhead') or 0) * 1e6:.1f} us, "
        f"gamma {(spec.get('gamma') or 0) * 1e12:.1f} ps/byte, "
        f"fresh memory {(spec.get('fresh_memory') or 0) * 1e12:.1f} ps/byte from {_size(spec.get('fresh_from'))}, "
        f"memcpy {(spec.get('memcpy') or 0) * 1e12:.1f} ps/byte, "
        f"check {(spec.get('check_overhead') or 0) * 1e6:.1f} us/round, "
        f"call {(spec.get('call_overhead') or 0) * 1e6:.1f} us, "
        f"host cores {spec.get('host_cores') or 'unlimited'}"
        + (
            f"; between hosts ({spec['per_node']} rank{'s' if spec['per_node'] > 1 else ''} a host): "
            f"alpha {spec['inter_alpha'] * 1e6:.1f} us, bandwidth {spec['inter_bandwidth'] / 1e6:.2f} MB/s, "
            f"burst {(spec.get('inter_burst') or 0) / KIB:.0f} KiB"
            if spec.get("layout") == "two_level"
            else ""
        )
    )


def _size(nbytes: int | None) -> str:
    """``nbytes`` in KiB or MiB (the default threshold where ``None``)."""
    from ..core._topology import FRESH_BYTES

    nbytes = nbytes or FRESH_BYTES
    return f"{nbytes / MIB:g} MiB" if nbytes >= MIB else f"{nbytes / KIB:g} KiB"
