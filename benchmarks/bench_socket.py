"""(d) Socket backend vs torch's gloo: all_reduce, broadcast, all_gather, reduce_scatter over loopback.

    python benchmarks/bench_socket.py [--reps 2] [--quick] [--json PATH] [--profile] [--profile-timer cpu|wall]

Issue 3, item 6. Every op on float32 at 4 KiB, 64 KiB, 1 MiB, 16 MiB and 64 MiB, world 2
and 4, in real processes on this machine: simdist (``simdist.spawn(..., backend="socket")``,
``init_process_group("socket")``) and torch.distributed with gloo (``torch.multiprocessing``
forkserver processes, ``init_process_group("gloo", init_method="tcp://127.0.0.1:PORT")``),
one after the other in the same run, with the same loop body.

Timing (both sides): inside rank 0, after warm-up calls, each timed iteration is
``barrier(); t0; op; t1`` and the per-op time is the median of ``t1 - t0`` over the
iterations (fewer at 16 and 64 MiB). Every rank process runs ``torch.set_num_threads(1)``.
Bytes per op follow nccl-tests: the per-rank tensor size (all_gather: the whole output,
reduce_scatter: the whole input); algbw = bytes / time; busbw = algbw x 2(n-1)/n
(all_reduce), x (n-1)/n (all_gather, reduce_scatter), x 1 (broadcast). The ratio is
ours/gloo busbw (higher is better); target >= 1.0x at 1 MiB and above, aim 1.5x.

Ceilings, measured in the same run: loopback TCP between two processes (plain sockets,
``sendall``/``recv_into`` of 1 MiB chunks) and numpy memcpy (``np.copyto`` of 64 MiB,
bytes copied per second).

``--profile`` re-runs the worst case (lowest ratio at >= 1 MiB) on the socket backend with
rank 0's op loop under cProfile (all threads of the rank process; top 15 by tottime).
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import torch
from _common import (
    KIB,
    MIB,
    base_parser,
    finish_info,
    fmt_ms,
    fmt_ratio,
    machine_info,
    markdown_table,
    median,
    profile_call,
    publish,
    verdict,
)

import simdist

OPS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")
SIZES = (4 * KIB, 64 * KIB, 1 * MIB, 16 * MIB, 64 * MIB)
QUICK_SIZES = (64 * KIB, 1 * MIB, 16 * MIB)
WORLDS = (2, 4)
TARGET, AIM = 1.0, 1.5
# (warm-up calls, timed iterations) per size
ITERS = {4 * KIB: (5, 50), 64 * KIB: (5, 40), 1 * MIB: (3, 20), 16 * MIB: (2, 8), 64 * MIB: (1, 4)}
QUICK_ITERS = {64 * KIB: (2, 10), 1 * MIB: (2, 6), 16 * MIB: (1, 3)}


def size_label(nbytes: int) -> str:
    return f"{nbytes // MIB} MiB" if nbytes >= MIB else f"{nbytes // KIB} KiB"


def bus_factor(op: str, n: int) -> float:
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    return 1.0


# --- the rank loop (same body for simdist and torch.distributed) ------------------------------


def _make_call(d, op: str, nbytes: int, world: int):
    """The op as a no-argument callable on fresh float32 zeros; ``nbytes`` as nccl-tests counts it."""
    numel = nbytes // 4
    if op == "all_reduce":
        t = torch.zeros(numel, dtype=torch.float32)
        return lambda: d.all_reduce(t)
    if op == "broadcast":
        t = torch.zeros(numel, dtype=torch.float32)
        return lambda: d.broadcast(t, src=0)
    if op == "all_gather":  # nbytes = the whole output
        out = torch.zeros(numel, dtype=torch.float32)
        inp = torch.zeros(numel // world, dtype=torch.float32)
        return lambda: d.all_gather_into_tensor(out, inp)
    if op == "reduce_scatter":  # nbytes = the whole input
        inp = torch.zeros(numel, dtype=torch.float32)
        out = torch.zeros(numel // world, dtype=torch.float32)
        return lambda: d.reduce_scatter_tensor(out, inp)
    raise ValueError(op)


def _check(d, rank: int, world: int) -> None:
    """One small correctness check per op (the figures are worthless if the results are wrong)."""
    t = torch.ones(1024)
    d.all_reduce(t)
    assert float(t.min()) == float(t.max()) == world, "all_reduce"
    t = torch.full((1024,), float(rank))
    d.broadcast(t, src=0)
    assert float(t.abs().max()) == 0.0, "broadcast"
    out = torch.empty(1024 * world)
    d.all_gather_into_tensor(out, torch.full((1024,), float(rank)))
    assert torch.equal(out, torch.arange(world, dtype=torch.float32).repeat_interleave(1024)), "all_gather"
    out = torch.empty(1024)
    d.reduce_scatter_tensor(out, torch.arange(world, dtype=torch.float32).repeat_interleave(1024))
    assert float(out.min()) == float(out.max()) == rank * world, "reduce_scatter"


def _loop(d, rank: int, world: int, cases: list) -> dict:
    """Per case: warm-up, then ``barrier; time op`` per iteration; rank 0's median seconds per op."""
    _check(d, rank, world)
    out = {}
    for op, nbytes, warm, iters in cases:
        call = _make_call(d, op, nbytes, world)
        for _ in range(warm):
            d.barrier()
            call()
        times = []
        for _ in range(iters):
            d.barrier()
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        out[f"{op}/{nbytes}"] = median(times)
        del call
    d.barrier()
    return out


def _profiled_loop(d, rank: int, world: int, case: tuple, timer: str) -> str | None:
    op, nbytes, warm, iters = case
    call = _make_call(d, op, nbytes, world)
    for _ in range(warm):
        d.barrier()
        call()

    def body():
        for _ in range(iters):
            d.barrier()
            call()

    if rank != 0:
        body()
        return None
    w0, c0, m0 = time.perf_counter(), time.process_time(), time.thread_time()
    table = profile_call(body, top=15, timer=timer)
    wall, cpu, main_cpu = time.perf_counter() - w0, time.process_time() - c0, time.thread_time() - m0
    # the transport's threads were started at init, before the profiler: cProfile sees the main thread only
    return (
        f"rank 0 over the profiled loop: wall {wall * 1e3:.0f} ms, process CPU (all threads) {cpu * 1e3:.0f} ms, "
        f"main-thread CPU {main_cpu * 1e3:.0f} ms (profiler overhead included)\n" + table
    )


def simdist_rank(rank: int, world: int, cases: list, profile: tuple | None = None, timer: str = "cpu"):
    torch.set_num_threads(1)
    simdist.init_process_group("socket")
    try:
        if profile is not None:
            return _profiled_loop(simdist, rank, world, profile, timer)
        return _loop(simdist, rank, world, cases)
    finally:
        simdist.destroy_process_group()


def gloo_rank(rank: int, world: int, port: int, cases: list, queue) -> None:
    import warnings

    import torch.distributed as tdist

    warnings.filterwarnings("ignore", category=FutureWarning)  # reduce_scatter_tensor's deprecation notice
    torch.set_num_threads(1)
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        res = _loop(tdist, rank, world, cases)
    finally:
        tdist.destroy_process_group()
    if rank == 0:
        queue.put(res)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_simdist(world: int, cases: list) -> dict:
    return simdist.spawn(simdist_rank, args=(world, cases), nprocs=world, backend="socket")[0]


def run_gloo(world: int, cases: list) -> dict:
    import torch.multiprocessing as tmp

    ctx = tmp.get_context("forkserver")
    queue = ctx.SimpleQueue()
    tmp.start_processes(gloo_rank, args=(world, _free_port(), cases, queue), nprocs=world, start_method="forkserver")
    return queue.get()


# --- ceilings -----------------------------------------------------------------------------------


def _tcp_sender(port: int, total: int, chunk: int) -> None:
    buf = bytearray(chunk)
    with socket.create_connection(("127.0.0.1", port)) as s:
        for _ in range(total // chunk):
            s.sendall(buf)


def tcp_ceiling(total: int = 512 * MIB, chunk: int = MIB, reps: int = 3) -> float:
    """Loopback TCP bytes/s between two processes: 1 MiB ``sendall`` into 1 MiB ``recv_into``."""
    ctx = mp.get_context("fork")
    rates = []
    buf = bytearray(chunk)
    view = memoryview(buf)
    for _ in range(reps):
        with socket.socket() as srv:
            srv.bind(("127.0.0.1", 0))
            srv.listen(1)
            p = ctx.Process(target=_tcp_sender, args=(srv.getsockname()[1], total, chunk))
            p.start()
            conn, _ = srv.accept()
            with conn:
                got = conn.recv_into(view, chunk)
                t0 = time.perf_counter()
                while got < total:
                    n = conn.recv_into(view, chunk)
                    if n == 0:
                        break
                    got += n
                dt = time.perf_counter() - t0
            p.join()
        rates.append(got / dt)
    return median(rates)


def memcpy_ceiling(nbytes: int = 64 * MIB, reps: int = 10) -> float:
    """numpy memcpy: bytes copied per second (``np.copyto`` of 64 MiB; each byte read once, written once)."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return nbytes / median(times)


# --- report -------------------------------------------------------------------------------------


def _gbs(x: float) -> str:
    return f"{x / 1e9:.2f}"


def main(argv=None) -> dict:
    parser = base_parser(__doc__.splitlines()[0])
    args = parser.parse_args(argv)
    reps = args.reps or (1 if args.quick else 2)
    sizes = QUICK_SIZES if args.quick else SIZES
    iters = QUICK_ITERS if args.quick else ITERS
    cases = [(op, s, *iters[s]) for s in sizes for op in OPS]
    info = machine_info()
    t_start = time.perf_counter()

    tcp = tcp_ceiling(total=(128 if args.quick else 512) * MIB)
    mem = memcpy_ceiling()

    runs: dict = {w: {"simdist": [], "gloo": []} for w in WORLDS}
    for r in range(reps):
        for w in WORLDS:
            order = ("simdist", "gloo") if r % 2 == 0 else ("gloo", "simdist")
            for side in order:
                runs[w][side].append(run_simdist(w, cases) if side == "simdist" else run_gloo(w, cases))

    raw, rows_by_world, verdicts = [], {}, []
    for w in WORLDS:
        rows = []
        for op in OPS:
            for s in sizes:
                key = f"{op}/{s}"
                t_ours = median(x[key] for x in runs[w]["simdist"])
                t_gloo = median(x[key] for x in runs[w]["gloo"])
                f = bus_factor(op, w)
                bus_ours, bus_gloo = s / t_ours * f, s / t_gloo * f
                ratio = bus_ours / bus_gloo
                judged = s >= MIB
                met = ratio >= TARGET
                mark = "-" if not judged else (verdict(met) + (" (aim 1.5x met)" if ratio >= AIM else ""))
                rows.append(
                    [
                        op,
                        size_label(s),
                        fmt_ms(t_gloo),
                        fmt_ms(t_ours),
                        _gbs(s / t_gloo),
                        _gbs(s / t_ours),
                        _gbs(bus_gloo),
                        _gbs(bus_ours),
                        fmt_ratio(ratio),
                        mark,
                    ]
                )
                entry = {
                    "world": w,
                    "op": op,
                    "bytes": s,
                    "size": size_label(s),
                    "gloo_s": t_gloo,
                    "simdist_s": t_ours,
                    "gloo_busbw": bus_gloo,
                    "simdist_busbw": bus_ours,
                    "ratio": ratio,
                }
                raw.append(entry)
                if judged:
                    verdicts.append({**entry, "met": met, "aim_met": ratio >= AIM})
        rows_by_world[w] = rows
    elapsed = time.perf_counter() - t_start
    finish_info(info)

    headers = [
        "op",
        "size",
        "gloo ms",
        "ours ms",
        "gloo algbw GB/s",
        "ours algbw GB/s",
        "gloo busbw GB/s",
        "ours busbw GB/s",
        "busbw ours/gloo",
        "target >= 1.0x (>= 1 MiB)",
    ]
    parts = [
        (
            f"Per-op time = median over {', '.join(f'{size_label(s)}: {iters[s][1]}' for s in sizes)} timed "
            f"iterations in rank 0 (barrier before each op), after warm-up; median of {reps} run(s) per side; "
            "GB/s = 1e9 bytes/s; every rank at 1 torch intra-op thread."
        ),
        (
            f"Ceilings in the same run: loopback TCP between two processes (1 MiB chunks) {_gbs(tcp)} GB/s; "
            f"numpy memcpy (64 MiB, bytes copied per second) {_gbs(mem)} GB/s."
        ),
    ]
    for w in WORLDS:
        parts.append(
            f"World {w} (busbw factor: all_reduce x{bus_factor('all_reduce', w):g}, "
            f"all_gather / reduce_scatter x{bus_factor('all_gather', w):g}, broadcast x1):\n\n"
            + markdown_table(headers, rows_by_world[w])
        )
    missed = [v for v in verdicts if not v["met"]]
    worst = min(verdicts, key=lambda v: v["ratio"]) if verdicts else None
    summary = (
        f"Verdict (>= 1 MiB): {len(verdicts) - len(missed)} of {len(verdicts)} cases meet 1.0x gloo busbw, "
        f"{sum(v['aim_met'] for v in verdicts)} reach 1.5x."
        + (
            f" Worst: {worst['op']} {worst['size']} world {worst['world']} at {fmt_ratio(worst['ratio'])}."
            if worst
            else ""
        )
    )
    parts.append(summary)
    parts.append(f"Whole run: {elapsed:.0f} s of wall time.")
    text = "\n\n".join(parts)

    def profile(timer: str, quick: bool) -> str:
        if worst is None:
            return "nothing to profile"
        s = worst["bytes"]
        case = (worst["op"], s, *iters[s])
        prof = simdist.spawn(
            simdist_rank, args=(worst["world"], [], case, timer), nprocs=worst["world"], backend="socket"
        )[0]
        return (
            f"Profile of rank 0, socket backend, {worst['op']} {worst['size']} world {worst['world']}, "
            f"{case[3]} iterations (barrier + op), {timer} time:\n\n```\n{prof}```"
        )

    return publish(
        "bench_socket",
        args,
        info,
        reps,
        raw,
        text,
        verdicts,
        profile,
        ceilings={"tcp_loopback_Bps": tcp, "memcpy_Bps": mem},
        elapsed_s=elapsed,
    )


if __name__ == "__main__":
    main()
