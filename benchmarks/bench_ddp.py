"""(e) DistributedDataParallel step time: simdist DDP on the socket backend vs torch DDP on gloo.

    python benchmarks/bench_ddp.py [--reps 3] [--quick] [--json PATH] [--profile] [--profile-timer cpu|wall]

Issue item: step time of a ~10M-parameter MLP, batch 64, 2 processes: simdist DDP on the
socket backend against torch DDP on gloo in the same run. Target: at most 1.10x torch's
step time.

Model: ``Linear`` layers 1024 -> 2048 -> 2048 -> 1024 -> 1024 -> 1024 with ReLU between
(10,492,928 float32 parameters, 40 MiB), MSE loss against a random target, SGD (lr 1e-3),
default DDP arguments (25 MiB buckets, the first 1 MiB). Every rank holds its own seeded
batch of 64 rows and runs ``torch.set_num_threads(1)``.

Both sides run the same loop body in 2 real processes: simdist
(``simdist.spawn(..., backend="socket")``, ``init_process_group("gloo")``, which maps to the
socket backend, and ``simdist.DistributedDataParallel``) and torch
(``torch.multiprocessing`` forkserver processes, ``init_process_group("gloo",
init_method="tcp://127.0.0.1:PORT")``, ``torch.nn.parallel.DistributedDataParallel``).
After warm-up steps, each timed step is ``t0; zero_grad; forward; backward; opt.step; t1``
with no barrier (DDP's all-reduces keep the ranks in step, as in training); each rank
records its step times and rank 0's median is reported. The two sides alternate within
each repetition (order flipped every repetition); the figure is the median over
repetitions.

Floor, measured in the same run: one process (world 1) with the same model and batch,
timing the plain module (no wrapper: forward + backward + step only) and
``simdist.DistributedDataParallel`` over a world of 1 (the wrapper's bucket copies and
hooks, no communication). Both run alone on the machine, so they are a little faster
than either side's compute share in the 2-process runs.

``--profile`` re-runs the simdist side with rank 0's timed steps under cProfile (top 20 by
tottime; cProfile sees the main thread only, the socket transport's threads start at
``init_process_group``, before the profiler).
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import (
    base_parser,
    finish_info,
    fmt_int,
    fmt_ms,
    fmt_ratio,
    machine_info,
    markdown_table,
    median,
    profile_call,
    publish,
    verdict,
)
from torch import nn

import simdist

DIMS = (1024, 2048, 2048, 1024, 1024, 1024)
BATCH = 64
WORLD = 2
LR = 1e-3
TARGET = 1.10
STEPS = {False: (3, 15), True: (2, 5)}  # quick -> (warm-up steps, timed steps)


# --- the model and the loop (same body for simdist and torch) ------------------------------------


def make_model() -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(DIMS, DIMS[1:])):
        if i:
            layers.append(nn.ReLU())
        layers.append(nn.Linear(a, b))
    return nn.Sequential(*layers)


def param_count() -> int:
    return sum(a * b + b for a, b in zip(DIMS, DIMS[1:]))


def make_batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(BATCH, DIMS[0], generator=g), torch.randn(BATCH, DIMS[-1], generator=g)


def _step_fn(model: nn.Module, rank: int):
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = make_batch(rank)

    def step() -> None:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    return step


def _time_steps(step, warm: int, iters: int, cpu: list | None = None) -> list[float]:
    """Wall seconds of each timed step; with ``cpu``, also append each step's process CPU seconds to it."""
    for _ in range(warm):
        step()
    times = []
    for _ in range(iters):
        c0, t0 = time.process_time(), time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
        if cpu is not None:
            cpu.append(time.process_time() - c0)
    return times


def _checksum(model: nn.Module) -> float:
    with torch.no_grad():
        return float(sum(p.double().sum() for p in model.parameters()))


def _loop(ddp_class, rank: int, warm: int, iters: int) -> dict:
    model = ddp_class(make_model())
    cpu: list[float] = []
    times = _time_steps(_step_fn(model, rank), warm, iters, cpu)
    return {
        "rank": rank,
        "median_s": median(times),
        "times": times,
        "cpu_s": median(cpu),
        "cpu_times": cpu,
        "checksum": _checksum(model),
    }


# --- simdist side ----------------------------------------------------------------------------------


def simdist_rank(rank: int, warm: int, iters: int, profile_timer: str | None = None):
    torch.set_num_threads(1)
    simdist.init_process_group("gloo")
    try:
        if profile_timer is None:
            return _loop(simdist.DistributedDataParallel, rank, warm, iters)
        step = _step_fn(simdist.DistributedDataParallel(make_model()), rank)
        _time_steps(step, warm, 0)

        def body() -> None:
            for _ in range(iters):
                step()

        if rank != 0:
            body()
            return None
        w0, c0 = time.perf_counter(), time.process_time()
        table = profile_call(body, top=20, timer=profile_timer)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        return (
            f"rank 0 over {iters} profiled steps: wall {wall * 1e3:.0f} ms ({wall / iters * 1e3:.1f} ms/step), "
            f"process CPU (all threads) {cpu * 1e3:.0f} ms (profiler overhead included)\n" + table
        )
    finally:
        simdist.destroy_process_group()


def floor_rank(rank: int, warm: int, iters: int) -> dict:
    """World 1: the plain module's step, then simdist DDP's step with nothing to communicate."""
    torch.set_num_threads(1)
    simdist.init_process_group("gloo")
    try:
        plain = median(_time_steps(_step_fn(make_model(), rank), warm, iters))
        ddp = median(_time_steps(_step_fn(simdist.DistributedDataParallel(make_model()), rank), warm, iters))
        return {"plain_s": plain, "ddp_world1_s": ddp}
    finally:
        simdist.destroy_process_group()


def run_simdist(warm: int, iters: int) -> list[dict]:
    return simdist.spawn(simdist_rank, args=(warm, iters), nprocs=WORLD, backend="socket")


def run_floor(warm: int, iters: int) -> dict:
    return simdist.spawn(floor_rank, args=(warm, iters), nprocs=1, backend="socket")[0]


# --- torch side ------------------------------------------------------------------------------------


def gloo_rank(rank: int, port: int, warm: int, iters: int, queue) -> None:
    import torch.distributed as tdist

    torch.set_num_threads(1)
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        res = _loop(torch.nn.parallel.DistributedDataParallel, rank, warm, iters)
    finally:
        tdist.destroy_process_group()
    queue.put(res)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_gloo(warm: int, iters: int) -> list[dict]:
    import torch.multiprocessing as tmp

    ctx = tmp.get_context("forkserver")
    queue = ctx.SimpleQueue()
    tmp.start_processes(gloo_rank, args=(_free_port(), warm, iters, queue), nprocs=WORLD, start_method="forkserver")
    return sorted((queue.get() for _ in range(WORLD)), key=lambda r: r["rank"])


# --- report ----------------------------------------------------------------------------------------


def _check(side: str, ranks: list[dict], ref: float | None) -> None:
    """Every rank ends with the same parameters, and both sides with the same as each other."""
    sums = [r["checksum"] for r in ranks]
    tol = 1e-6 * max(1.0, abs(sums[0]))
    if max(sums) - min(sums) > tol:
        raise AssertionError(f"{side}: ranks' parameters differ after training (checksums {sums})")
    if ref is not None and abs(sums[0] - ref) > 1e-4 * max(1.0, abs(ref)):
        raise AssertionError(f"{side}: parameters differ from the other side's (checksum {sums[0]} vs {ref})")


def main(argv=None) -> dict:
    parser = base_parser(__doc__.splitlines()[0])
    args = parser.parse_args(argv)
    reps = args.reps or (1 if args.quick else 3)
    warm, iters = STEPS[args.quick]
    n_params = param_count()
    assert n_params == sum(p.numel() for p in make_model().parameters())
    print(
        f"<!-- bench_ddp: MLP {' -> '.join(map(str, DIMS))}, {n_params:,} parameters "
        f"({n_params * 4 / 2**20:.1f} MiB float32), batch {BATCH} per rank, world {WORLD} -->",
        flush=True,
    )
    info = machine_info()
    t_start = time.perf_counter()

    runs: dict = {"torch": [], "simdist": [], "floor": []}
    checksum = None
    for r in range(reps):
        order = ("simdist", "torch") if r % 2 == 0 else ("torch", "simdist")
        for side in order:
            ranks = run_simdist(warm, iters) if side == "simdist" else run_gloo(warm, iters)
            _check(side, ranks, checksum)
            checksum = ranks[0]["checksum"]
            runs[side].append(ranks)
        runs["floor"].append(run_floor(warm, iters))

    t_torch = median(x[0]["median_s"] for x in runs["torch"])
    t_ours = median(x[0]["median_s"] for x in runs["simdist"])
    c_torch = median(x[0]["cpu_s"] for x in runs["torch"])
    c_ours = median(x[0]["cpu_s"] for x in runs["simdist"])
    t_plain = median(x["plain_s"] for x in runs["floor"])
    t_world1 = median(x["ddp_world1_s"] for x in runs["floor"])
    ratio = t_ours / t_torch
    met = ratio <= TARGET
    elapsed = time.perf_counter() - t_start
    finish_info(info)

    per_rep = markdown_table(
        ["repetition", "torch DDP gloo ms/step", "simdist DDP socket ms/step", "ratio", "rank 1: torch / simdist ms"],
        [
            [
                str(i + 1),
                fmt_ms(t[0]["median_s"], 1),
                fmt_ms(s[0]["median_s"], 1),
                fmt_ratio(s[0]["median_s"] / t[0]["median_s"]),
                f"{fmt_ms(t[1]['median_s'], 1)} / {fmt_ms(s[1]['median_s'], 1)}",
            ]
            for i, (t, s) in enumerate(zip(runs["torch"], runs["simdist"]))
        ],
    )
    main_table = markdown_table(
        [
            "model",
            "torch DDP gloo ms/step",
            "simdist DDP socket ms/step",
            "ours/torch",
            f"target <= {TARGET:.2f}x",
            "torch CPU ms/step",
            "simdist CPU ms/step",
            "CPU ours/torch",
        ],
        [
            [
                f"MLP {fmt_int(n_params)} params, batch {BATCH}, world {WORLD}",
                fmt_ms(t_torch, 1),
                fmt_ms(t_ours, 1),
                fmt_ratio(ratio),
                verdict(met),
                fmt_ms(c_torch, 1),
                fmt_ms(c_ours, 1),
                fmt_ratio(c_ours / c_torch),
            ]
        ],
    )
    floor_table = markdown_table(
        ["world 1 (one process, no communication)", "ms/step"],
        [
            ["plain module (no DDP wrapper)", fmt_ms(t_plain, 1)],
            ["simdist DDP, world 1 (bucket copies + hooks)", fmt_ms(t_world1, 1)],
        ],
    )
    parts = [
        (
            f"Model: MLP {' -> '.join(map(str, DIMS))} (ReLU between), {n_params:,} float32 parameters "
            f"({n_params * 4 / 2**20:.1f} MiB), MSE loss, SGD, default DDP arguments; batch {BATCH} per rank; "
            f"step = zero_grad + forward + backward + opt.step. Per-step time = rank 0's median over {iters} timed "
            f"steps after {warm} warm-up steps; median of {reps} repetition(s) per side, the sides alternating; "
            "every rank at 1 torch intra-op thread. CPU ms/step: rank 0's process CPU time per step (all its "
            "threads: compute and the transport's), median likewise; on a busy machine it moves less than wall time."
        ),
        main_table,
        "Per repetition (rank 0's median; rank 1's for comparison):\n\n" + per_rep,
        "Floor, same run:\n\n" + floor_table,
        (
            f"Verdict: simdist DDP on the socket backend takes {fmt_ratio(ratio)} torch DDP on gloo's step time "
            f"(target <= {TARGET:.2f}x: {verdict(met)})."
        ),
        f"Whole run: {elapsed:.0f} s of wall time.",
    ]
    text = "\n\n".join(parts)
    raw = {
        "params": n_params,
        "dims": list(DIMS),
        "batch": BATCH,
        "world": WORLD,
        "warmup": warm,
        "iters": iters,
        "torch_s": t_torch,
        "simdist_s": t_ours,
        "ratio": ratio,
        "torch_cpu_s": c_torch,
        "simdist_cpu_s": c_ours,
        "plain_world1_s": t_plain,
        "simdist_ddp_world1_s": t_world1,
        "runs": runs,
    }
    verdicts = [
        {
            "case": f"MLP {n_params:,} params, batch {BATCH}, world {WORLD}",
            "torch_s": t_torch,
            "simdist_s": t_ours,
            "ratio": ratio,
            "target": TARGET,
            "met": met,
        }
    ]

    def profile(timer: str, quick: bool) -> str:
        prof = simdist.spawn(simdist_rank, args=(warm, iters, timer), nprocs=WORLD, backend="socket")[0]
        return f"Profile of rank 0, simdist DDP on the socket backend, {iters} steps, {timer} time:\n\n```\n{prof}```"

    return publish("bench_ddp", args, info, reps, raw, text, verdicts, profile, elapsed_s=elapsed)


if __name__ == "__main__":
    main()
