"""(c) Scale: world 1024 all_reduce (detail="collectives") and world 128 ring all_reduce (messages).

    python benchmarks/bench_scale.py [--reps 3] [--quick] [--json PATH] [--profile]

Each figure is the wall time of the *whole* ``simdist.simulate`` call: creating and
starting the rank threads, ``init_process_group``, one ``all_reduce`` of a float32 tensor
of ones, ``destroy_process_group`` and joining the threads (``leaks="ignore"``, default
seeded random strategy, ``record_steps`` on). The result is checked (every element equals
the world size). Median of ``--reps`` runs; process CPU time (all threads) alongside.

Rows:
- world 1024, 1 KiB, ``detail="collectives"`` (automatic algorithm): target < 1 s.
- world 4096, the same: target < 1 s (issue 18, item 2; each rank's thread, generators and world
  are now most of it).
- world 1024, ``init_process_group`` + ``destroy_process_group`` only: the fixed cost of
  1024 rank threads, for the engine's owner (no target).
- world 128, 1 KiB, ``algorithm="ring"``, ``detail="messages"``: reported (no target).
- world 128, 1 MiB, ring, messages: reported, one run (``--quick`` skips it).
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import (
    KIB,
    MIB,
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

TARGET_S = 1.0


def one_all_reduce(rank: int, numel: int, algorithm: str | None) -> float:
    simdist.init_process_group("gloo")
    t = torch.ones(numel, dtype=torch.float32)
    simdist.all_reduce(t, algorithm=algorithm)
    simdist.destroy_process_group()
    return float(t[0])


def init_only(rank: int, numel: int, algorithm: str | None) -> float:
    simdist.init_process_group("gloo")
    simdist.destroy_process_group()
    return 0.0


# (key, label, fn, world, nbytes, algorithm, detail, target seconds or None, reps override)
CASES = [
    ("w1024_coll_1k", "world 1024, all_reduce 1 KiB, detail=\"collectives\"", one_all_reduce, 1024, 1 * KIB, None,
     "collectives", TARGET_S, None),
    ("w4096_coll_1k", "world 4096, all_reduce 1 KiB, detail=\"collectives\"", one_all_reduce, 4096, 1 * KIB, None,
     "collectives", TARGET_S, None),
    ("w1024_init_only", "world 1024, init + destroy only (thread start-up)", init_only, 1024, 1 * KIB, None,
     "collectives", None, None),
    ("w128_ring_1k", "world 128, ring all_reduce 1 KiB, detail=\"messages\"", one_all_reduce, 128, 1 * KIB, "ring",
     "messages", None, None),
    ("w128_ring_1m", "world 128, ring all_reduce 1 MiB, detail=\"messages\"", one_all_reduce, 128, 1 * MIB, "ring",
     "messages", None, 1),
]


def measure(reps: int, quick: bool) -> dict:
    raw: dict = {}
    for key, label, fn, world, nbytes, algorithm, detail, target, reps_override in CASES:
        if quick and key == "w128_ring_1m":
            continue
        n = reps_override or reps
        e = raw[key] = {"label": label, "world": world, "nbytes": nbytes, "algorithm": algorithm,
                        "detail": detail, "target_s": target, "wall": [], "cpu": []}
        for _ in range(n):
            wall, cpu, res = timed_cpu(partial(run_sim, fn, world, (nbytes // 4, algorithm), seed=0, detail=detail))
            if fn is one_all_reduce and any(v != float(world) for v in res.values):
                raise AssertionError(f"{label}: wrong all_reduce result {res.values[:4]}...")
            e["wall"].append(wall)
            e["cpu"].append(cpu)
            e["points"] = res.points
            e["events"] = len(res.trace.events)
            e["virtual_time_s"] = res.time
        e["median_wall"] = median(e["wall"])
        e["median_cpu"] = median(e["cpu"])
    return raw


def report(raw: dict, reps: int) -> tuple[str, list[dict]]:
    rows, verdicts = [], []
    for e in raw.values():
        target = e["target_s"]
        if target is None:
            mark = "reported"
        else:
            ok = e["median_wall"] < target
            verdicts.append({"case": e["label"], "seconds": e["median_wall"], "target_s": target, "met": ok})
            mark = f"< {target:g} s: {verdict(ok)}"
        rows.append([e["label"], len(e["wall"]), fmt_ms(e["median_wall"], 0), fmt_ms(e["median_cpu"], 0),
                     fmt_int(e["points"]), fmt_int(e["events"]), mark])
    table = markdown_table(["case", "runs", "wall ms (median)", "CPU ms (median)", "points", "trace events",
                            "target"], rows)
    text = (
        "### (c) scale\n\n"
        f"Whole `simulate` call including thread start-up and join; median of {reps} run(s) unless the table "
        "says otherwise.\n\n"
        f"{table}\n"
    )
    return text, verdicts


def profile_worst(timer: str, quick: bool) -> str:
    out = []
    for key, label, fn, world, nbytes, algorithm, detail, _, _ in CASES:
        if key not in ("w4096_coll_1k", "w128_ring_1k"):
            continue
        out.append(f"#### profile: {label}\n\n```\n" + profile_call(
            partial(run_sim, fn, world, (nbytes // 4, algorithm), seed=0, detail=detail), timer=timer) + "```\n")
    return "\n".join(out)


def main(argv=None) -> dict:
    args = base_parser(__doc__.splitlines()[0]).parse_args(argv)
    reps = args.reps or (1 if args.quick else 3)
    info = machine_info()
    raw = measure(reps, args.quick)
    finish_info(info)
    text, verdicts = report(raw, reps)
    return publish("scale", args, info, reps, raw, text, verdicts, profile_worst)


if __name__ == "__main__":
    main()
