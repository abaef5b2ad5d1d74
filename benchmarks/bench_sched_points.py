"""(b) Scheduling points per second of the simulator on typical programs.

    python benchmarks/bench_sched_points.py [--reps 3] [--quick] [--json PATH] [--profile]

Rate = ``res.points / wall``, where ``res.points`` is the number of scheduling points the
run passed (``SimResult.points``, counted by the engine) and ``wall`` is the wall-clock time
of the whole ``simdist.simulate`` call (thread start-up included; the runs are long enough,
0.3-1 s, for start-up to be a small share). Median wall time of ``--reps`` runs; the point
count of a seeded run is deterministic.

Programs: p2p ping-pong between 2 ranks (send/recv of 4 float32, blocking, synchronous
sends); many small all_reduces (4 float32) at world 4; a barrier loop at world 8. The
collective programs run at both levels of detail. Default strategy (seeded random).

Reference printed alongside: the ceiling of a thread-per-rank design on this machine,
baton hand-offs per second between 4 threads with one ``threading.Lock`` each (no
scheduler logic at all), measured in the same run. Targets (issue 18, item 1), as a share
of that baton: point-to-point >= 90%, collectives at ``detail="messages"`` >= 50%; the
``detail="collectives"`` rows are reported.
"""

from __future__ import annotations

import sys
import threading
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import (
    base_parser,
    finish_info,
    fmt_int,
    fmt_ms,
    machine_info,
    markdown_table,
    median,
    profile_call,
    publish,
    run_sim,
    timed_cpu,
    verdict,
)

import simdist

P2P_SHARE, COLLECTIVE_SHARE = 0.90, 0.50


def ping_pong(rank: int, n: int) -> None:
    simdist.init_process_group("gloo")
    t = torch.zeros(4)
    for _ in range(n):
        if rank == 0:
            simdist.send(t, 1)
            simdist.recv(t, 1)
        else:
            simdist.recv(t, 0)
            simdist.send(t, 0)
    simdist.destroy_process_group()


def small_all_reduces(rank: int, n: int) -> None:
    simdist.init_process_group("gloo")
    t = torch.zeros(4)
    for _ in range(n):
        simdist.all_reduce(t)
    simdist.destroy_process_group()


def barrier_loop(rank: int, n: int) -> None:
    simdist.init_process_group("gloo")
    for _ in range(n):
        simdist.barrier()
    simdist.destroy_process_group()


# (label, function, world, iterations, quick iterations, simulate options, target share of the baton or None)
PROGRAMS = [
    ("p2p ping-pong (4 floats)", ping_pong, 2, 500, 100, {}, P2P_SHARE),
    ("all_reduce 4 floats, messages", small_all_reduces, 4, 500, 100, {}, COLLECTIVE_SHARE),
    ('all_reduce 4 floats, detail="collectives"', small_all_reduces, 4, 500, 100, {"detail": "collectives"}, None),
    ("barrier loop, messages", barrier_loop, 8, 250, 50, {}, COLLECTIVE_SHARE),
    ('barrier loop, detail="collectives"', barrier_loop, 8, 250, 50, {"detail": "collectives"}, None),
]


def baton_ceiling(threads: int = 4, handoffs: int = 40_000) -> float:
    """Hand-offs per second of a bare baton (one Lock per thread) among ``threads`` threads."""
    locks = [threading.Lock() for _ in range(threads)]
    for lk in locks:
        lk.acquire()
    per = handoffs // threads
    done = threading.Event()

    def body(i: int) -> None:
        mine, nxt = locks[i], locks[(i + 1) % threads]
        for _ in range(per):
            mine.acquire()
            nxt.release()
        if i == threads - 1:
            done.set()

    ts = [threading.Thread(target=body, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    t0 = time.perf_counter()
    locks[0].release()
    done.wait()
    dt = time.perf_counter() - t0
    for t in ts:
        t.join()
    return per * threads / dt


def measure(reps: int, quick: bool) -> dict:
    raw: dict = {"programs": {}, "baton_ceiling": []}
    for _ in range(reps):
        raw["baton_ceiling"].append(baton_ceiling())
        for label, fn, world, n, nq, opts, share in PROGRAMS:
            iters = nq if quick else n
            wall, cpu, res = timed_cpu(partial(run_sim, fn, world, (iters,), seed=0, **opts))
            e = raw["programs"].setdefault(
                label,
                {
                    "world": world,
                    "iters": iters,
                    "points": res.points,
                    "options": opts,
                    "target_share": share,
                    "wall": [],
                    "cpu": [],
                },
            )
            e["wall"].append(wall)
            e["cpu"].append(cpu)
    for e in raw["programs"].values():
        e["median_wall"] = median(e["wall"])
        e["median_cpu"] = median(e["cpu"])
        e["points_per_s"] = e["points"] / e["median_wall"]
        e["points_per_cpu_s"] = e["points"] / e["median_cpu"]
    raw["median_baton_ceiling"] = median(raw["baton_ceiling"])
    return raw


def report(raw: dict, reps: int) -> tuple[str, list[dict]]:
    rows, verdicts = [], []
    ceiling = raw["median_baton_ceiling"]
    for label, e in raw["programs"].items():
        rate, share = e["points_per_s"], e.get("target_share")
        if share is None:
            mark = "reported"
        else:
            ok = rate / ceiling >= share
            verdicts.append(
                {"program": label, "points_per_s": rate, "share": rate / ceiling, "target_share": share, "met": ok}
            )
            mark = f">= {share:.0%}: {verdict(ok)}"
        rows.append(
            [
                label,
                e["world"],
                e["iters"],
                fmt_int(e["points"]),
                fmt_ms(e["median_wall"], 1),
                f"{e['median_wall'] / e['points'] * 1e6:.1f}",
                fmt_int(rate),
                fmt_int(e["points_per_cpu_s"]),
                f"{rate / ceiling * 100:.1f}%",
                mark,
            ]
        )
    table = markdown_table(
        [
            "program",
            "world",
            "iterations",
            "points",
            "wall ms (median)",
            "us/point",
            "points/s",
            "points/CPU-s",
            "of bare baton",
            "target (of the baton)",
        ],
        rows,
    )
    text = (
        "### (b) scheduling points per second\n\n"
        f"Median of {reps} repetitions; points/s = points / wall time of the whole `simulate` call "
        "(points/CPU-s: per second of process CPU time, all threads, less sensitive to other load); "
        "default strategy (seeded random).\n"
        f"Reference: a bare baton (one `threading.Lock` per thread, 4 threads, no scheduler) passes "
        f"{fmt_int(ceiling)} hand-offs/s on this machine in the same run.\n\n{table}\n"
    )
    return text, verdicts


def profile_worst(timer: str, quick: bool) -> str:
    out = []
    for label, fn, world, n, nq, opts in (PROGRAMS[0], PROGRAMS[1]):
        iters = nq if quick else n // 2
        out.append(
            f"#### profile: {label}, world {world}, {iters} iterations\n\n```\n"
            + profile_call(partial(run_sim, fn, world, (iters,), seed=0, **opts), timer=timer)
            + "```\n"
        )
    return "\n".join(out)


def main(argv=None) -> dict:
    args = base_parser(__doc__.splitlines()[0]).parse_args(argv)
    reps = args.reps or (2 if args.quick else 3)
    info = machine_info()
    raw = measure(reps, args.quick)
    finish_info(info)
    text, verdicts = report(raw, reps)
    return publish("sched_points", args, info, reps, raw, text, verdicts, profile_worst)


if __name__ == "__main__":
    main()
