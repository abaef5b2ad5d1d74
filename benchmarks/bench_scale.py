"""(c) Scale: thousands of ranks, each run in a fresh process (wall, CPU and peak memory).

    python benchmarks/bench_scale.py [--reps 3] [--quick] [--json PATH] [--profile]

Each figure is one whole ``simdist.simulate`` call in a fresh Python process (simdist and
torch imported, and one 2-rank run of the same program made, before timing: a process's
first call imports the simulator's modules, about 0.1-0.2 s, reported apart as "first
call"; torch's side makes its 2-thread run likewise): creating and starting the rank threads,
``init_process_group``, one ``all_reduce`` of a float32 tensor of ones,
``destroy_process_group`` and joining the threads (``leaks="ignore"``, default seeded
random strategy). The result is checked (every element equals the world size). Peak
memory is the process's peak resident set (``VmHWM``); the import alone is reported
beside it. The reference is torch's threaded group (``ProcessLocalGroup``, which moves no
messages and keeps no trace) running the same all_reduce in the same way.

Rows (median of ``--reps`` runs, each in its own process):
- world 1024, ring all_reduce of 1 KiB, ``detail="messages"``: target < 5 s and < 1 GB.
- the same with ``record_steps=True`` (step snapshots, off by default above 64 ranks): reported.
- the same with ``trace_file=`` (the trace streamed to disk): reported.
- world 4096, 1 KiB, ``detail="collectives"``: target < 1 s.
- world 1024, ``detail="collectives"``, and ``init``/``destroy`` only: reported.
- torch's threaded group at worlds 1024 and 4096 (one run at 4096: it takes tens of seconds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

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
    verdict,
)

TARGET_MESSAGES_S, TARGET_MEMORY_MB, TARGET_COLLECTIVES_S = 5.0, 1024.0, 1.0

# (key, label, world, side, options, targets (seconds, MB) or None, reps (None: --reps))
CASES = [
    (
        "w1024_ring_msgs",
        'world 1024, ring all_reduce 1 KiB, detail="messages"',
        1024,
        "sim",
        {"detail": "messages", "algorithm": "ring"},
        (TARGET_MESSAGES_S, TARGET_MEMORY_MB),
        None,
    ),
    (
        "w1024_ring_msgs_steps",
        "  the same, record_steps=True",
        1024,
        "sim",
        {"detail": "messages", "algorithm": "ring", "record_steps": True},
        None,
        1,
    ),
    (
        "w1024_ring_msgs_stream",
        "  the same, trace streamed to a file",
        1024,
        "sim",
        {"detail": "messages", "algorithm": "ring", "trace_file": True},
        None,
        1,
    ),
    (
        "w4096_coll",
        'world 4096, all_reduce 1 KiB, detail="collectives"',
        4096,
        "sim",
        {"detail": "collectives"},
        (TARGET_COLLECTIVES_S, None),
        None,
    ),
    (
        "w1024_coll",
        'world 1024, all_reduce 1 KiB, detail="collectives"',
        1024,
        "sim",
        {"detail": "collectives"},
        None,
        None,
    ),
    (
        "w1024_init",
        "world 1024, init + destroy only",
        1024,
        "sim",
        {"detail": "collectives", "init_only": True},
        None,
        None,
    ),
    ("torch_w1024", "torch threaded group, world 1024, all_reduce 1 KiB", 1024, "torch", {}, None, None),
    ("torch_w4096", "torch threaded group, world 4096, all_reduce 1 KiB", 4096, "torch", {}, None, 1),
]

CHILD = r"""
import json, os, resource, sys, time
sys.path.insert(0, {bench!r})
import torch
import simdist
from _common import run_threaded

world, side, opts = {world}, {side!r}, {opts!r}


def peak_mb():
    # VmHWM starts afresh at exec; ru_maxrss would keep the parent's size at fork as a floor
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


base = peak_mb()


def one(rank, numel, algorithm, init_only):
    simdist.init_process_group("gloo")
    t = torch.ones(numel, dtype=torch.float32)
    if not init_only:
        simdist.all_reduce(t, algorithm=algorithm)
    simdist.destroy_process_group()
    return float(t[0])


def threaded(rank, numel):
    import torch.distributed as dist
    t = torch.ones(numel, dtype=torch.float32)
    dist.all_reduce(t)
    return float(t[0])


init_only = opts.pop("init_only", False)
algorithm = opts.pop("algorithm", None)
if opts.pop("trace_file", False):
    opts["trace_file"] = {trace_path!r}
# the first call in a process pays for imports (the simulator's modules, torch.distributed): timed apart
f0 = time.perf_counter()
if side == "sim":
    simdist.simulate(one, 2, (256, None, False), leaks="ignore", detail="collectives")
else:
    run_threaded(threaded, 2, (256,))
first = time.perf_counter() - f0
c0, t0 = time.process_time(), time.perf_counter()
if side == "sim":
    res = simdist.simulate(one, world, (256, algorithm, init_only), leaks="ignore", **opts)
    values, events, points = res.values, len(res.trace), res.points
else:
    values, events, points = run_threaded(threaded, world, (256,)), 0, 0
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
want = 1.0 if init_only else float(world)
if any(v != want for v in values):
    raise SystemExit(f"wrong result: {{values[:4]}}")
peak = peak_mb()
print(json.dumps({{"wall": wall, "cpu": cpu, "peak_mb": peak, "import_mb": base, "events": events,
                  "points": points, "first_call": first}}))
"""


def run_case(world: int, side: str, opts: dict) -> dict:
    """One run of a case in a fresh process: its figures (``wall``, ``cpu``, ``peak_mb``, ...)."""
    with tempfile.TemporaryDirectory() as tmp:
        code = CHILD.format(
            bench=str(Path(__file__).resolve().parent),
            world=world,
            side=side,
            opts=dict(opts),
            trace_path=os.path.join(tmp, "trace.json"),
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"case world={world} {side} {opts} failed:\n{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])


def measure(reps: int, quick: bool) -> dict:
    raw: dict = {}
    for key, label, world, side, opts, targets, reps_override in CASES:
        if quick and key in ("torch_w4096", "w1024_ring_msgs_steps", "w1024_ring_msgs_stream"):
            continue
        runs = [run_case(world, side, opts) for _ in range(reps_override or reps)]
        e = raw[key] = {"label": label, "world": world, "side": side, "options": opts, "targets": targets, "runs": runs}
        for field in ("wall", "cpu", "peak_mb", "import_mb", "first_call"):
            e["median_" + field] = median([r[field] for r in runs])
        e["events"], e["points"] = runs[-1]["events"], runs[-1]["points"]
    return raw


def report(raw: dict, reps: int) -> tuple[str, list[dict]]:
    rows, verdicts = [], []
    for e in raw.values():
        marks = []
        if e["targets"] is not None:
            seconds, mb = e["targets"]
            ok = e["median_wall"] < seconds
            verdicts.append({"case": e["label"], "seconds": e["median_wall"], "target_s": seconds, "met": ok})
            marks.append(f"< {seconds:g} s: {verdict(ok)}")
            if mb is not None:
                ok = e["median_peak_mb"] < mb
                verdicts.append({"case": e["label"], "peak_mb": e["median_peak_mb"], "target_mb": mb, "met": ok})
                marks.append(f"< {mb / 1024:g} GB: {verdict(ok)}")
        rows.append(
            [
                e["label"],
                len(e["runs"]),
                fmt_ms(e["median_wall"], 0),
                fmt_ms(e["median_cpu"], 0),
                fmt_ms(e["median_first_call"], 0),
                f"{e['median_peak_mb']:.0f}",
                f"{e['median_import_mb']:.0f}",
                fmt_int(e["points"]),
                fmt_int(e["events"]),
                "; ".join(marks) or "reported",
            ]
        )
    table = markdown_table(
        [
            "case",
            "runs",
            "wall ms (median)",
            "CPU ms (median)",
            "first call ms",
            "peak MB",
            "of which import MB",
            "points",
            "trace events",
            "target",
        ],
        rows,
    )
    text = (
        "### (c) scale\n\n"
        f"One whole `simulate` call per fresh process, thread start-up and join included; median of {reps} run(s) "
        "unless the table says otherwise. Before it, the process made one 2-rank run (the same program; torch's "
        "side likewise), which imports what a first call imports: its time is the 'first call' column. Peak MB: "
        "the process's peak resident set, the import of torch and simdist included (its own column).\n\n"
        f"{table}\n"
    )
    return text, verdicts


def profile_worst(timer: str, quick: bool) -> str:
    import torch

    import simdist

    def one(rank: int) -> float:
        simdist.init_process_group("gloo")
        t = torch.ones(256, dtype=torch.float32)
        simdist.all_reduce(t, algorithm="ring")
        simdist.destroy_process_group()
        return float(t[0])

    world = 256 if quick else 1024
    return (
        f"#### profile: world {world}, ring all_reduce 1 KiB, messages\n\n```\n"
        + profile_call(lambda: simdist.simulate(one, world, leaks="ignore"), timer=timer)
        + "```\n"
    )


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
