"""(d2) Socket backend with shared memory between same-host ranks vs over TCP only vs torch's gloo.

    python benchmarks/bench_socket_shm.py [--reps 1] [--quick] [--json PATH]

Issue 18, item 5. all_reduce, broadcast, all_gather and reduce_scatter on float32 at 1, 16
and 64 MiB, worlds 2 and 4, in real processes on this machine, three sides one after the
other in the same run with the same loop body as ``bench_socket.py`` (d): simdist with its
shared-memory path (the default), simdist with ``SIMDIST_SHM=0`` (every payload over TCP)
and torch.distributed on gloo. Per-op time is rank 0's median over the timed iterations
(``barrier(); t0; op; t1``), at least 5 per case; bytes and busbw as in (d) (nccl-tests).
Targets: shm busbw >= 2x gloo at >= 16 MiB, and >= 1.0x in every case.

Per-call overhead: two ranks, checks of collectives off, ``all_reduce`` of one float32 (one
exchange with the peer at world 2) and a ``send``/``recv`` ping-pong of one float32, each
against the same messages posted straight on the rank's ``PeerNetwork`` (``isend``,
``irecv``, ``wait``) in the same processes, blocks of each interleaved; overhead = median API
latency - median transport latency (per op).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import MIB, base_parser, finish_info, fmt_ms, fmt_ratio, machine_info, markdown_table, median, publish
from bench_socket import OPS, WORLDS, bus_factor, run_gloo, run_simdist, size_label

import simdist

SIZES = (1 * MIB, 16 * MIB, 64 * MIB)
ITERS = {1 * MIB: (3, 20), 16 * MIB: (2, 7), 64 * MIB: (1, 5)}  # (warm-up calls, timed iterations)
QUICK_ITERS = {1 * MIB: (2, 5), 16 * MIB: (1, 5), 64 * MIB: (1, 5)}
SIDES = ("shm", "tcp", "gloo")
TARGET_BIG, TARGET_ALL = 2.0, 1.0
OVERHEAD_TARGET_US = 5.0
LATENCY_ITERS = 4000


def run_side(side: str, world: int, cases: list) -> dict:
    """Rank 0's median seconds per case for one side (``SIMDIST_SHM`` set for the simdist sides)."""
    os.environ["SIMDIST_SHM"] = "0" if side == "tcp" else "1"
    try:
        return run_gloo(world, cases) if side == "gloo" else run_simdist(world, cases)
    finally:
        os.environ.pop("SIMDIST_SHM", None)


# --- per-call overhead ----------------------------------------------------------------------


def _per_op(fns: dict, iters: int, blocks: int = 10) -> dict:
    """Median seconds per call of each of ``fns`` over ``blocks`` blocks of ``iters // blocks`` calls,
    the functions' blocks interleaved (load that comes and goes hits them alike)."""
    n = iters // blocks
    times: dict = {name: [] for name in fns}
    for _ in range(blocks):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            times[name].append((time.perf_counter() - t0) / n)
    return {name: median(ts) for name, ts in times.items()}


def overhead_rank(rank: int, iters: int) -> dict | None:
    from simdist.core._world import current_world

    torch.set_num_threads(1)
    simdist.init_process_group("socket")
    try:
        net = current_world().network
        peer = 1 - rank
        one, got = torch.ones(1), torch.zeros(1)
        ctx = iter(range(1 << 50, 1 << 60))

        def exchange():  # what all_reduce of one element does at world 2: one send and one receive each way
            c = next(ctx)
            net.wait([net.irecv(got, peer, c, 0), net.isend(one, peer, c, 0)])
            got.add_(one)

        def raw_pingpong():
            c = next(ctx)
            if rank == 0:
                net.wait([net.isend(one, peer, c, 0)])
                net.wait([net.irecv(got, peer, c, 0)])
            else:
                net.wait([net.irecv(got, peer, c, 0)])
                net.wait([net.isend(one, peer, c, 0)])

        def api_pingpong():
            if rank == 0:
                simdist.send(one, peer)
                simdist.recv(got, peer)
            else:
                simdist.recv(got, peer)
                simdist.send(one, peer)

        fns = {
            "raw_exchange": exchange,
            "api_all_reduce": lambda: simdist.all_reduce(one),
            "raw_pingpong": raw_pingpong,
            "api_pingpong": api_pingpong,
        }
        for fn in fns.values():
            for _ in range(100):
                fn()
        simdist.barrier()
        out = _per_op(fns, iters)
        simdist.barrier()
        return out if rank == 0 else None
    finally:
        simdist.destroy_process_group()


def measure_overhead(iters: int = LATENCY_ITERS) -> dict:
    os.environ["SIMDIST_CHECK_COLLECTIVES"] = "0"
    try:
        out = simdist.spawn(overhead_rank, args=(iters,), nprocs=2, backend="socket")[0]
    finally:
        os.environ.pop("SIMDIST_CHECK_COLLECTIVES", None)
    out["all_reduce_overhead_s"] = out["api_all_reduce"] - out["raw_exchange"]
    out["p2p_overhead_s"] = (out["api_pingpong"] - out["raw_pingpong"]) / 2  # two API calls per round trip
    return out


# --- report -------------------------------------------------------------------------------------


def _gbs(x: float) -> str:
    return f"{x / 1e9:.2f}"


def main(argv=None) -> dict:
    args = base_parser(__doc__.splitlines()[0]).parse_args(argv)
    reps = args.reps or 1
    iters = QUICK_ITERS if args.quick else ITERS
    cases = [(op, s, *iters[s]) for s in SIZES for op in OPS]
    info = machine_info()
    t_start = time.perf_counter()
    runs: dict = {w: {side: [] for side in SIDES} for w in WORLDS}
    for r in range(reps):
        for w in WORLDS:
            for side in SIDES if r % 2 == 0 else SIDES[::-1]:
                runs[w][side].append(run_side(side, w, cases))
    overhead = measure_overhead(200 if args.quick else LATENCY_ITERS)

    raw, verdicts, parts = [], [], []
    headers = [
        "op",
        "size",
        "gloo ms",
        "tcp ms",
        "shm ms",
        "gloo busbw GB/s",
        "tcp busbw GB/s",
        "shm busbw GB/s",
        "shm/tcp",
        "shm/gloo",
        "target",
    ]
    for w in WORLDS:
        rows = []
        for op in OPS:
            for s in SIZES:
                key = f"{op}/{s}"
                t = {side: median(x[key] for x in runs[w][side]) for side in SIDES}
                bus = {side: s / t[side] * bus_factor(op, w) for side in SIDES}
                ratio = bus["shm"] / bus["gloo"]
                goal = TARGET_BIG if s >= 16 * MIB else TARGET_ALL
                met = ratio >= goal
                rows.append(
                    [
                        op,
                        size_label(s),
                        fmt_ms(t["gloo"]),
                        fmt_ms(t["tcp"]),
                        fmt_ms(t["shm"]),
                        _gbs(bus["gloo"]),
                        _gbs(bus["tcp"]),
                        _gbs(bus["shm"]),
                        fmt_ratio(bus["shm"] / bus["tcp"]),
                        fmt_ratio(ratio),
                        f">= {goal:g}x: " + ("met" if met else "**missed**"),
                    ]
                )
                entry = {
                    "world": w,
                    "op": op,
                    "bytes": s,
                    **{f"{side}_s": t[side] for side in SIDES},
                    **{f"{side}_busbw": bus[side] for side in SIDES},
                    "ratio": ratio,
                    "goal": goal,
                    "met": met,
                }
                raw.append(entry)
                verdicts.append(entry)
        parts.append(
            f"World {w} (busbw factor: all_reduce x{bus_factor('all_reduce', w):g}, "
            f"all_gather / reduce_scatter x{bus_factor('all_gather', w):g}, broadcast x1):\n\n"
            + markdown_table(headers, rows)
        )
    elapsed = time.perf_counter() - t_start
    finish_info(info)
    missed = [v for v in verdicts if not v["met"]]
    head = (
        f"Per-op time = rank 0's median over {', '.join(f'{size_label(s)}: {iters[s][1]}' for s in SIZES)} "
        f"timed iterations (barrier before each op), after warm-up; {reps} run(s) per side, interleaved; "
        "GB/s = 1e9 bytes/s; every rank at 1 torch intra-op thread."
    )
    us = 1e6
    lat = (
        f"Per-call overhead (world 2, checks off, median of 10 interleaved blocks of {LATENCY_ITERS // 10} calls): all_reduce "
        f"of one float32 {overhead['api_all_reduce'] * us:.1f} µs against {overhead['raw_exchange'] * us:.1f} µs "
        f"for the same exchange on the PeerNetwork: overhead {overhead['all_reduce_overhead_s'] * us:.1f} µs; "
        f"send/recv ping-pong {overhead['api_pingpong'] * us:.1f} µs per round trip against "
        f"{overhead['raw_pingpong'] * us:.1f} µs: overhead {overhead['p2p_overhead_s'] * us:.1f} µs per call. "
        f"Target <= {OVERHEAD_TARGET_US:g} µs: "
        + (
            "met."
            if max(overhead["all_reduce_overhead_s"], overhead["p2p_overhead_s"]) * us <= OVERHEAD_TARGET_US
            else "**missed**."
        )
    )
    summary = (
        f"Verdict: {len(verdicts) - len(missed)} of {len(verdicts)} cases meet their target (>= 2x gloo "
        "busbw at 16 and 64 MiB, >= 1x at 1 MiB)."
        + (
            " Missed: "
            + ", ".join(
                f"{v['op']} {size_label(v['bytes'])} world {v['world']} ({fmt_ratio(v['ratio'])})" for v in missed
            )
            + "."
            if missed
            else ""
        )
    )
    text = "\n\n".join([head, *parts, summary, lat, f"Whole run: {elapsed:.0f} s of wall time."])
    return publish(
        "bench_socket_shm",
        args,
        info,
        reps,
        raw,
        text,
        verdicts,
        lambda timer, quick: "no profile for this benchmark",
        overhead=overhead,
        elapsed_s=elapsed,
    )


if __name__ == "__main__":
    main()
