"""Calibration across hosts: ``simdist calibrate --nnodes N`` run on each of N hosts, as ``simdist run`` is.

Each host's ``simdist calibrate`` starts its ranks with ``simdist run``'s launcher (socket backend, the
same ``--nnodes``, ``--node-rank``, ``--master-addr``, ``--master-port`` and ``SIMDIST_SECRET``; ports
``P`` and ``P + 1``), with the socket backend's cross-rank check of every collective. The ranks measure,
between hosts (the first rank of each host):

- **inter_bandwidth, inter_burst**: ping-pong between hosts 0 and 1, each message after both links have
  rested :data:`IDLE` seconds, at sizes from 256 KiB doubling until a one-way trip takes
  :data:`TARGET` seconds (at most 64 MiB); ``inter_bandwidth`` is the reciprocal of the least-squares
  slope of the one-way time over the three largest sizes. A link shaped by a token bucket (``tc tbf``,
  a cloud VM's allowance) passes its burst at once after resting, so that line meets the one-way time
  of 8 bytes ``inter_burst / inter_bandwidth`` seconds early: ``inter_burst`` is that gap in bytes.
- **send_buffer**: host 0 sends host 1 a message of at least :data:`SEND_BYTES` after the link rested;
  its send returns once the rest of it fits in the kernel's buffers (the socket backend's send is done
  when its bytes are written to the connection): what its burst and the link's rate leave unexplained
  of the time it took, in bytes (:func:`fit_send_buffer`).
- **inter_alpha**: 8-byte shifts around the ring of hosts, :data:`STEPS` back to back (as in the
  calibration on one host); ``inter_alpha`` is what each of the two uplinks of a route must add for the
  model's shift to take the measured time.
- **check_overhead**: a 4-byte all_gather of every rank after a barrier, with the check and without it
  (the two interleaved, every rank turning its check on and off at the same calls), the difference over
  the check's ``ceil(log2 p)`` rounds (here they cross the hosts' links).
- and, kept in the file's ``measured`` with the model's figure beside it: every rank of host 0 sending
  to the first rank of each other host at once (how the host's link is shared), and a large shift around
  the ring of hosts (both directions of each link at once).

Node 0 then measures the terms inside a host as ``simdist calibrate`` does on one machine (or reads
them from ``--host-file``) and writes a ``two_level`` topology file: a node per host of
``--nproc-per-node`` ranks, whose uplink the node's ranks share, with ``flows``: a collective's messages
are TCP flows, as the socket backend sends them: each leaves when it is posted (the receiver keeps it
until its receive is posted), messages that cross a link at once share its rate fairly, and a pair's
messages follow each other on its one connection; and with ``link_queues`` for the program's own sends
(each link of a route takes a message once it is free, rather than a message holding its whole route
while its far link is busy).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._calibrate import STEPS, Progress, _gathers, _slowest_median, _timed

__all__ = ["IDLE", "TARGET", "calibrate_hosts", "fit_hosts", "job"]

KIB, MIB = 1 << 10, 1 << 20
IDLE = 0.05
"""Seconds the links rest before each timed transfer between hosts (a token bucket refills meanwhile)."""
TARGET = 0.1
"""Ping-pong sizes double until a one-way trip takes this long (``--quick``: half of it)."""
FIRST, LARGEST = 256 * KIB, 64 * MIB
SEND_BYTES = 8 * MIB
"""The least size of the send whose return measures ``send_buffer`` (more than the kernel keeps)."""
RANK_SCRIPT = "from simdist.launch._calibrate_hosts import job\njob()\n"
"""What each rank runs (``simdist run`` starts a script; this one lives in a temporary folder)."""


def _rested(d: Any) -> None:
    """A barrier, then :data:`IDLE` seconds of rest, on every rank."""
    d.barrier()
    time.sleep(IDLE)


def _exchange(d: Any, sends: list, recvs: list) -> None:
    """Post every receive and send at once, then wait for all of them."""
    works = [d.irecv(buf, peer) for buf, peer in recvs] + [d.isend(buf, peer) for buf, peer in sends]
    for w in works:
        if w is not None:
            w.wait()


MEASUREMENTS = (
    "the cross-rank check across the hosts",
    "8-byte shifts around the hosts (latency)",
    "ping-pong between hosts 0 and 1, sizes doubling",
    "host 0's ranks sending to every other host at once",
    "a large shift around the hosts",
    "a large send from host 0 to host 1",
)
"""What the job measures, in order: rank 0 says each as it starts (node 0's console)."""


def _measure(rank: int, world: int, per_host: int, reps: int, target: float) -> dict[str, Any]:
    """One rank's figures (see the module doc); the same decisions on every rank."""
    import torch

    from simdist import api as d

    progress = Progress(MEASUREMENTS if rank == 0 else ())
    hosts = world // per_host
    leaders = [h * per_host for h in range(hosts)]
    progress.step(MEASUREMENTS[0])
    out: dict[str, Any] = {"all_gather": _gathers(reps * 5)}
    # 8-byte shifts around the ring of hosts, back to back
    small_a, small_b = torch.zeros(2), torch.zeros(2)
    me = leaders.index(rank) if rank in leaders else None
    right = leaders[(me + 1) % hosts] if me is not None else None
    left = leaders[(me - 1) % hosts] if me is not None else None

    def shifts() -> None:
        if me is not None:
            for _ in range(STEPS):
                _exchange(d, [(small_a, right)], [(small_b, left)])

    progress.step(MEASUREMENTS[1])
    out["shift8"] = [t / STEPS for t in _timed(shifts, reps * 3, d.barrier)]
    # ping-pong between hosts 0 and 1 after the links rest, sizes doubling up to the target
    peer = per_host

    def pingpong(buf: Any) -> None:
        if rank == 0:
            d.send(buf, peer)
            d.recv(buf, peer)
        elif rank == peer:
            d.recv(buf, 0)
            d.send(buf, 0)

    progress.step(MEASUREMENTS[2])
    out["one_way"] = {}
    sizes = [8]
    n = FIRST
    while True:
        buf = torch.zeros(max(1, sizes[-1] // 4))
        out["one_way"][sizes[-1]] = [t / 2 for t in _timed(lambda: pingpong(buf), reps, lambda: _rested(d))]  # noqa: B023
        if sizes[-1] == 8:
            sizes.append(n)
            continue
        more = torch.tensor([float(statistics.median(out["one_way"][sizes[-1]]) < target and sizes[-1] < LARGEST)])
        d.broadcast(more, src=0)  # rank 0's times decide for every rank
        if not more.item():
            break
        sizes.append(sizes[-1] * 2)
    largest = sizes[-1]
    # every rank of host 0 to the first rank of every other host at once: the host's link shared
    messages = per_host * (hosts - 1)
    share = max(4, largest // messages // 4 * 4)
    data = torch.zeros(share // 4)
    sinks = [torch.zeros(share // 4) for _ in range(per_host)]

    def fan_out() -> None:
        if rank < per_host:
            _exchange(d, [(data, leader) for leader in leaders[1:]], [])
        elif rank in leaders:
            _exchange(d, [], [(sinks[r], r) for r in range(per_host)])

    progress.step(MEASUREMENTS[3])
    out["fan_out"] = {"bytes": share, "seconds": _timed(fan_out, reps, lambda: _rested(d))}
    # a large shift around the ring of hosts: both directions of every host's link at once
    big_a, big_b = torch.zeros(largest // 4), torch.zeros(largest // 4)

    def big_shift() -> None:
        if me is not None:
            _exchange(d, [(big_a, right)], [(big_b, left)])

    progress.step(MEASUREMENTS[4])
    out["shift_large"] = {"bytes": largest, "seconds": _timed(big_shift, reps, lambda: _rested(d))}
    # host 0 sends a large message to host 1 after the link rests: how long until its send returns (the rest
    # of its bytes are then in its kernel's buffer)
    many = max(largest, SEND_BYTES)
    sent, into = torch.zeros(many // 4), torch.zeros(many // 4)

    def send_returns() -> None:
        if rank == 0:
            d.send(sent, peer)
        elif rank == peer:
            d.recv(into, 0)

    progress.step(MEASUREMENTS[5])
    out["send_returns"] = {"bytes": many, "seconds": _timed(send_returns, reps, lambda: _rested(d))}
    return out


def job(argv: Sequence[str] | None = None) -> None:
    """A rank of the calibration job: ``RESULTS PER_HOST REPS TARGET``; rank 0 writes every rank's figures to
    ``RESULTS`` (a JSON list by rank)."""
    import torch

    from simdist import api as d

    results, per_host, reps, target = list(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(1)
    d.init_process_group("socket")
    try:
        rank, world = d.get_rank(), d.get_world_size()
        mine = _measure(rank, world, int(per_host), int(reps), float(target))
        every: list[Any] = [None] * world
        d.all_gather_object(every, mine)
        if rank == 0:
            Path(results).write_text(json.dumps(every), encoding="utf-8")
        d.barrier()
    finally:
        d.destroy_process_group()


def _launch(opts: Any, port: int, folder: Path, reps: int, target: float) -> list[dict]:
    """Run the job on this node with ``simdist run``'s launcher; node 0 returns every rank's figures."""
    from ..backends.socket import CHECK_ENV
    from .run import main as run

    script, results = folder / "calibrate_rank.py", folder / "results.json"
    script.write_text(RANK_SCRIPT, encoding="utf-8")
    argv = ["--backend", "socket", "--nnodes", str(opts.nnodes), "--node-rank", str(opts.node_rank)]
    argv += ["--master-addr", opts.master_addr, "--master-port", str(port), "--store-port", str(port + 1)]
    argv += ["--nproc-per-node", str(opts.nproc_per_node), str(script)]
    argv += [str(results), str(opts.nproc_per_node), str(reps), str(target)]
    saved = os.environ.get(CHECK_ENV)
    os.environ[CHECK_ENV] = "1"
    try:
        status = run(argv)
    finally:
        if saved is None:
            os.environ.pop(CHECK_ENV, None)
        else:
            os.environ[CHECK_ENV] = saved
    if status:
        raise SystemExit(f"simdist calibrate: the calibration job across the hosts failed (exit status {status})")
    return json.loads(results.read_text(encoding="utf-8")) if opts.node_rank == 0 else []


def _line(one_way: dict[int, float]) -> tuple[float, float]:
    """``(slope, intercept)`` of the least-squares line of one-way seconds over bytes."""
    xs = sorted(one_way)
    ys = [one_way[n] for n in xs]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return slope, my - slope * mx


def _shift_model(topo: Any, leaders: list[int], nbytes: int, steps: int) -> float:
    """Seconds per step of ``steps`` shifts of ``nbytes`` around ``leaders`` on ``topo`` (from idle)."""
    ready = dict.fromkeys(leaders, 0.0)
    for _ in range(steps):
        after = dict.fromkeys(leaders, 0.0)
        for i, src in enumerate(leaders):
            dst = leaders[(i + 1) % len(leaders)]
            arrival = topo.transfer(src, dst, nbytes, ready[src])[1]
            after[src], after[dst] = max(after[src], arrival), max(after[dst], arrival)
        ready = after
    return max(ready.values()) / steps


def _fan_out_model(topo: Any, per_host: int, hosts: int, nbytes: int) -> float:
    """Seconds until every rank of host 0 has sent ``nbytes`` to the first rank of every other host (from idle)."""
    return max(topo.transfer(r, h * per_host, nbytes, 0.0)[1] for r in range(per_host) for h in range(1, hosts))


def fit_hosts(
    host: dict[str, Any],
    per_host: int,
    hosts: int,
    one_way: dict[int, float],
    shift8: float,
    gathers: tuple[float, float],
) -> dict[str, Any]:
    """The ``two_level`` file's object from a one-host file's object ``host`` (the terms inside a host) and
    the figures between hosts: ``one_way`` seconds by size (8 bytes and the ping-pong sizes), ``shift8``
    seconds per 8-byte shift around the hosts, ``gathers`` the 4-byte all_gather's seconds with and
    without the check (see the module doc)."""
    from ..core._topology_file import topology_from_spec

    big = dict(sorted(one_way.items())[-3:])
    slope, intercept = _line(big)
    if slope <= 0:  # a noisy link: the largest size's average rate, no burst
        slope, intercept = max(big.items())[1] / max(big), one_way[8]
    world = per_host * hosts
    spec = {
        **{k: v for k, v in host.items() if k not in ("measured", "comment", "sources")},
        "layout": "two_level",
        "alpha": host["alpha"] / 2,  # a pair inside a host crosses two links (rank to node to rank)
        "per_node": per_host,
        "ranks_per_host": per_host,
        "inter_bandwidth": 1.0 / slope,
        "inter_burst": max((one_way[8] - intercept) / slope, 0.0),
        "link_queues": True,  # TCP flows share a host's link: one message waiting for a far link leaves it free
        "flows": True,  # ... and the socket backend's sends leave at once, sharing the links they cross
        "check_overhead": max(gathers[0] - gathers[1], 0.0) / max((world - 1).bit_length(), 1),
    }
    leaders = [h * per_host for h in range(hosts)]
    bare = topology_from_spec({**spec, "inter_alpha": 0.0}, world)
    spec["inter_alpha"] = max((shift8 - _shift_model(bare, leaders, 8, STEPS)) / 2, 1e-7)
    return spec


def fit_send_buffer(nbytes: int, seconds: float, spec: dict[str, Any]) -> int:
    """Bytes of a send that its sender's kernel keeps: a send of ``nbytes`` after the link rested returned after
    ``seconds``, when its burst had passed at once and the rest but those bytes at ``inter_bandwidth``."""
    left = nbytes - spec.get("inter_burst", 0.0) - seconds * spec["inter_bandwidth"]
    return max(int(left), 0)


def calibrate_hosts(opts: Any) -> dict[str, Any] | None:
    """Run the calibration across hosts on this node (``opts``: ``simdist calibrate``'s); node 0 returns the
    topology file's object (not yet written), the other nodes ``None``."""
    from ._calibrate import calibrate
    from ..core._topology_file import FORMAT, read_topology_file, topology_from_spec

    reps = 3 if opts.quick else 5
    target = TARGET / 2 if opts.quick else TARGET
    port = opts.master_port or 29500
    with tempfile.TemporaryDirectory(prefix="simdist-calibrate-") as folder:
        ranks = _launch(opts, port, Path(folder), reps, target)
    if opts.node_rank != 0:
        return None
    host = (
        read_topology_file(opts.host_file)
        if opts.host_file
        else calibrate(quick=opts.quick, name=opts.name, progress=True)
    )
    if host["layout"] == "two_level":
        raise SystemExit(
            f"simdist calibrate: --host-file={opts.host_file!r} describes several hosts; give one host's file"
        )
    per_host, hosts = opts.nproc_per_node, opts.nnodes
    pair = (ranks[0], ranks[per_host])
    one_way = {
        int(n): statistics.median(max(ts) for ts in zip(*(r["one_way"][n] for r in pair))) for n in pair[0]["one_way"]
    }
    leaders = [ranks[h * per_host] for h in range(hosts)]
    shift8 = _slowest_median([r["shift8"] for r in leaders])
    gathers = (
        _slowest_median([r["all_gather"]["checked"] for r in ranks]),
        _slowest_median([r["all_gather"]["unchecked"] for r in ranks]),
    )
    spec = fit_hosts(host, per_host, hosts, one_way, shift8, gathers)
    sent = ranks[0]["send_returns"]
    spec["send_buffer"] = fit_send_buffer(sent["bytes"], statistics.median(sent["seconds"]), spec)
    world = per_host * hosts
    fan, large = ranks[0]["fan_out"], ranks[0]["shift_large"]
    fan_seconds = _slowest_median([r["fan_out"]["seconds"] for r in ranks[:per_host] + leaders[1:]])
    large_seconds = _slowest_median([r["shift_large"]["seconds"] for r in leaders])
    topo = topology_from_spec(spec, world)
    fan_model = _fan_out_model(topo, per_host, hosts, fan["bytes"])
    topo.reset()
    large_model = _shift_model(topo, [h * per_host for h in range(hosts)], large["bytes"], 1)
    spec.update(
        format=FORMAT,
        name=opts.name,
        comment=(
            f"Measured by 'simdist calibrate --nnodes {hosts}{' --quick' if opts.quick else ''}' on {hosts} hosts "
            f"of {per_host} rank{'s' if per_host > 1 else ''} (node 0: {platform.node()}) at "
            f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}: socket backend between the hosts; "
            + (
                f"terms inside a host from {opts.host_file}."
                if opts.host_file
                else "terms inside a host over loopback."
            )
        ),
        measured={
            "host": host.get("measured", {}),
            "one_way_seconds": {str(n): t for n, t in one_way.items()},
            "shift_8_bytes_seconds": shift8,
            "all_gather_4_bytes_seconds": {"checked": gathers[0], "unchecked": gathers[1]},
            "fan_out": {
                "bytes_each": fan["bytes"],
                "messages": per_host * (hosts - 1),
                "seconds": fan_seconds,
                "model_seconds": fan_model,
            },
            "shift_large": {"bytes": large["bytes"], "seconds": large_seconds, "model_seconds": large_model},
            "send_returns": {"bytes": sent["bytes"], "seconds": sent["seconds"]},
        },
    )
    return spec
