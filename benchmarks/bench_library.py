"""(h) simdist over a communication library vs the library called directly, in the same processes.

    python benchmarks/bench_library.py --backend nccl [--world N] [--reps 5] [--quick] [--json PATH]
    python benchmarks/bench_library.py --backend gloo [--world N] ...

Issue 8, item 6. ``--backend nccl`` (the default): each rank process holds both torch.distributed
initialized with ``nccl`` and simdist initialized with ``backend="nccl"`` (cupy's NCCL
bindings), on the device ``rank % device_count``. ``--backend gloo``: simdist's ``gloo``
wraps torch's gloo group, so the two sides run on the very same group and the difference is
what simdist's layer costs. For every op (all_reduce, broadcast, reduce,
all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single) on float32, at 4 KiB
(latency) and at 256 MiB on NCCL / 64 MiB on gloo (bandwidth), the sides alternate within
each repetition.

Timing (both sides, rank 0's clock): ``synchronize; barrier; t0; N ops; synchronize; t1``
(``torch.cuda.synchronize`` on NCCL, nothing on gloo, whose ops return done), per-op time
``(t1 - t0) / N`` (N = 200 at 4 KiB, 10 at the large size); the median over repetitions is
reported. Bytes per op as nccl-tests count them (the per-rank tensor; all_gather the whole
output, reduce_scatter the whole input); algbw = bytes / time. Targets: latency ours/torch
<= 1.2x at 4 KiB, bandwidth ours/torch >= 0.95x at the large size.

Several NCCL ranks need as many GPUs, or an NCCL that lets ranks share one (``--world 2`` on
one GPU tries). Without a usable GPU ``--backend nccl`` says why and exits 0.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import KIB, MIB, base_parser, finish_info, fmt_ratio, machine_info, markdown_table, median, publish

OPS = ["all_reduce", "broadcast", "reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single"]
SIZES = {"nccl": {"latency": 4 * KIB, "bandwidth": 256 * MIB}, "gloo": {"latency": 4 * KIB, "bandwidth": 64 * MIB}}
ITERS = {"latency": 200, "bandwidth": 10}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _op(lib, op: str, x: torch.Tensor, out: torch.Tensor | None):
    """One call of ``op`` through ``lib`` (``torch.distributed`` or ``simdist``)."""
    if op == "all_reduce":
        return lib.all_reduce(x)
    if op == "broadcast":
        return lib.broadcast(x, 0)
    if op == "reduce":
        return lib.reduce(x, 0)
    if op == "all_gather_into_tensor":
        return lib.all_gather_into_tensor(out, x)
    if op == "reduce_scatter_tensor":
        return lib.reduce_scatter_tensor(out, x)
    return lib.all_to_all_single(out, x)


def _tensors(op: str, nbytes: int, world: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    n = nbytes // 4
    if op == "all_gather_into_tensor":
        return torch.ones(n // world, device=device), torch.empty(n, device=device)
    if op == "reduce_scatter_tensor":
        return torch.ones(n, device=device), torch.empty(n // world, device=device)
    if op == "all_to_all_single":
        return torch.ones(n, device=device), torch.empty(n, device=device)
    return torch.ones(n, device=device), None


def _rank(backend: str, rank: int, world: int, ports: tuple[int, int], reps: int, iters: dict, queue) -> None:
    import torch.distributed as td

    import simdist

    if backend == "nccl":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        os.environ.setdefault("SIMDIST_SECRET", "bench-library")
        td.init_process_group(
            "nccl", init_method=f"tcp://127.0.0.1:{ports[0]}", rank=rank, world_size=world, device_id=device
        )
        sync = torch.cuda.synchronize
    else:  # simdist's gloo initializes torch's default group and wraps it
        device = torch.device("cpu")
        torch.set_num_threads(1)
        sync = lambda: None  # noqa: E731 - gloo's ops return done
    simdist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{ports[1]}", rank=rank, world_size=world)
    results = []
    for kind, nbytes in SIZES[backend].items():
        for op in OPS:
            x, out = _tensors(op, nbytes, world, device)
            times = {"torch": [], "simdist": []}
            for _ in range(reps):
                for name, lib in (("torch", td), ("simdist", simdist)):
                    for _ in range(3):
                        _op(lib, op, x, out)
                    sync()
                    td.barrier()
                    t0 = time.perf_counter()
                    for _ in range(iters[kind]):
                        _op(lib, op, x, out)
                    sync()
                    times[name].append((time.perf_counter() - t0) / iters[kind])
            results.append(
                {
                    "kind": kind,
                    "op": op,
                    "bytes": nbytes,
                    "world": world,
                    "torch_s": median(times["torch"]),
                    "simdist_s": median(times["simdist"]),
                    "torch_runs": times["torch"],
                    "simdist_runs": times["simdist"],
                }
            )
    simdist.destroy_process_group()
    if td.is_initialized():
        td.destroy_process_group()
    if rank == 0:
        queue.put(results)


def _size(nbytes: int) -> str:
    return f"{nbytes // MIB} MiB" if nbytes >= MIB else f"{nbytes // KIB} KiB"


def _table(backend: str, results: list[dict]) -> tuple[str, list]:
    rows, verdicts = [], []
    for r in results:
        ratio_lat = r["simdist_s"] / r["torch_s"]
        if r["kind"] == "latency":
            ok = ratio_lat <= 1.2
            rows.append(
                [
                    r["op"],
                    _size(r["bytes"]),
                    f"{r['torch_s'] * 1e6:.1f} µs",
                    f"{r['simdist_s'] * 1e6:.1f} µs",
                    fmt_ratio(ratio_lat),
                    "met" if ok else "**missed**",
                ]
            )
        else:
            bw_t, bw_s = r["bytes"] / r["torch_s"] / 1e9, r["bytes"] / r["simdist_s"] / 1e9
            ok = bw_s / bw_t >= 0.95
            rows.append(
                [
                    r["op"],
                    _size(r["bytes"]),
                    f"{bw_t:.2f} GB/s",
                    f"{bw_s:.2f} GB/s",
                    fmt_ratio(bw_s / bw_t),
                    "met" if ok else "**missed**",
                ]
            )
        verdicts.append({"op": r["op"], "kind": r["kind"], "ok": ok})
    names = ["torch NCCL", "simdist nccl"] if backend == "nccl" else ["torch gloo", "simdist on gloo"]
    text = markdown_table(["op", "size", *names, "ours/torch", "target"], rows)
    return text, verdicts


def main() -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("nccl", "gloo"), default="nccl", help="the library (default nccl)")
    p.add_argument("--world", type=int, default=None, help="ranks, one process each (default: 1 on nccl, 2 on gloo)")
    args = p.parse_args()
    world = args.world or (1 if args.backend == "nccl" else 2)
    if args.backend == "nccl":
        from simdist.backends.nccl import nccl_unavailable

        reason = nccl_unavailable()
        if reason is not None:
            print(f"bench_library: nccl skipped: {reason}")
            return 0
    reps = args.reps or (2 if args.quick else 5)
    iters = {k: max(2, v // 10) for k, v in ITERS.items()} if args.quick else ITERS
    info = machine_info()
    info["device"] = torch.cuda.get_device_name(0) if args.backend == "nccl" else "CPU"
    ctx = torch.multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    ports = (_free_port(), _free_port())
    procs = [ctx.Process(target=_rank, args=(args.backend, r, world, ports, reps, iters, queue)) for r in range(world)]
    for proc in procs:
        proc.start()
    results = queue.get(timeout=1800)
    for proc in procs:
        proc.join(60)
    text, verdicts = _table(args.backend, results)
    publish(
        f"library-{args.backend}",
        args,
        finish_info(info),
        reps,
        results,
        f"{args.backend} on {info['device']}, world {world}\n\n{text}",
        verdicts,
        profile=lambda name, wall: "",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
