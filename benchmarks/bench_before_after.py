"""The simulator's figures of issue 30, each measured for two versions of simdist in one run, side by side.

    python benchmarks/bench_before_after.py --before PYTHON [--reps 5] [--quick] [--json PATH]

``--before`` is a Python interpreter whose ``import simdist`` is the version to compare with
(a virtual environment with another checkout installed, e.g. ``pip install -e OLD`` into
``python -m venv --system-site-packages VENV``); this interpreter's simdist is the one after. Each
case runs in a fresh process of each interpreter, the two alternating (which goes first flips
every repetition), and reports one figure; the table gives the median of ``--reps``:

- ``all_reduce`` at world 4, 4 KiB / 64 KiB / 1 MiB, simdist's defaults (``detail="messages"``,
  every check, the trace with step snapshots): ms per op, timed in rank 0 over n calls after a
  warm-up, and in the same process torch's threaded test group (``ProcessLocalGroup``) on the same
  loop: the ratio ours/torch (target <= 1.0x). Both at 1 torch intra-op thread.
- World 1024, ring all_reduce of 1 KiB: one whole ``simulate`` call at ``detail="messages"``,
  with ``record_steps=True``, and at ``detail="collectives"`` (targets: messages <= 2x collectives,
  < 1 GB peak; steps <= 1.3x without).
- ``explore`` of the 48-point program of ``bench_testing.py``, 200 runs, random and pct:
  schedules per second (target >= 3x before).
- World 4096 at ``detail="collectives"``: one whole ``simulate`` call (target <= 0.5x before).
- The socket backend's per-call overhead, as ``bench_socket_shm.py`` measures it (two processes,
  checks of collectives off): an all_reduce of one float against the same exchange posted on the
  ``PeerNetwork``, and a send/recv ping-pong against the raw one (target: halved).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from _common import base_parser, finish_info, fmt_ratio, machine_info, markdown_table, median, publish

HERE = Path(__file__).resolve().parent

PRELUDE = f"""
import json, resource, sys, time
sys.path.insert(0, {str(HERE)!r})
import torch
torch.set_num_threads(1)
import simdist
from _common import run_sim, run_threaded
"""

ALL_REDUCE = """
import torch.distributed as tdist
numel, n = {numel}, {n}

def loop(dist):
    t = torch.zeros(numel)
    dist.all_reduce(t)
    t0 = time.perf_counter()
    for _ in range(n):
        dist.all_reduce(t)
    return (time.perf_counter() - t0) / n

def sim_rank(rank):
    simdist.init_process_group("gloo")
    dt = loop(simdist)
    simdist.destroy_process_group()
    return dt

def torch_rank(rank):
    return loop(tdist)

ours = run_sim(sim_rank, 4, (), seed=0).values[0]
ref = run_threaded(torch_rank, 4, ())[0]
print(json.dumps({{"ours": ours, "torch": ref}}))
"""

SCALE = """
def ring(rank):
    simdist.init_process_group("gloo")
    t = torch.ones(256)
    simdist.all_reduce(t, algorithm="ring" if {ring} else None)
    simdist.destroy_process_group()
    return t[0].item()

simdist.simulate(ring, 2, leaks="ignore")  # what a first call imports
t0 = time.perf_counter()
res = simdist.simulate(ring, {world}, leaks="ignore", **{options})
wall = time.perf_counter() - t0
assert res.values[0] == {world}
with open("/proc/self/status") as f:
    peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024
print(json.dumps({{"wall": wall, "peak_mb": peak}}))
"""

EXPLORE = """
import simdist.testing as sdt
from bench_testing import exchange_program
sdt.explore(exchange_program, 4, args=(2,), strategy={strategy!r}, max_runs=20, seed=0)  # warm
t0 = time.perf_counter()
sdt.explore(exchange_program, 4, args=(2,), strategy={strategy!r}, max_runs={runs}, seed=0)
print(json.dumps({{"rate": {runs} / (time.perf_counter() - t0)}}))
"""

OVERHEAD = """
from bench_socket_shm import measure_overhead
print(json.dumps(measure_overhead({iters})))
"""

KIB = 1024
CASES = {  # name -> (child code, the figure it reports, its unit)
    **{
        f"all_reduce {label}": (ALL_REDUCE.format(numel=nbytes // 4, n=n), "ours", "ms/op")
        for nbytes, label, n in ((4 * KIB, "4 KiB", 200), (64 * KIB, "64 KiB", 200), (1024 * KIB, "1 MiB", 100))
    },
    "world 1024 ring, messages": (SCALE.format(ring=True, world=1024, options={"detail": "messages"}), "wall", "s"),
    "world 1024 ring, messages, record_steps": (
        SCALE.format(ring=True, world=1024, options={"detail": "messages", "record_steps": True}),
        "wall",
        "s",
    ),
    "world 1024 ring, collectives": (
        SCALE.format(ring=True, world=1024, options={"detail": "collectives"}),
        "wall",
        "s",
    ),
    "explore random": (EXPLORE.format(strategy="random", runs=200), "rate", "schedules/s"),
    "explore pct": (EXPLORE.format(strategy="pct", runs=200), "rate", "schedules/s"),
    "world 4096, collectives": (SCALE.format(ring=False, world=4096, options={"detail": "collectives"}), "wall", "s"),
    "socket per-call overhead": (OVERHEAD.format(iters=4000), "all_reduce_overhead_s", "µs/call"),
}
QUICK = ("all_reduce 4 KiB", "world 1024 ring, collectives", "explore random", "socket per-call overhead")


def run_case(python: str, code: str) -> dict:
    out = subprocess.run(
        [python, "-c", PRELUDE + code], capture_output=True, text=True, timeout=900, check=False, cwd=HERE
    )
    if out.returncode != 0:
        raise RuntimeError(f"{python}: case failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(before: str, reps: int, quick: bool) -> dict:
    raw: dict = {name: {"before": [], "after": []} for name in CASES if not quick or name in QUICK}
    for rep in range(reps):
        for name in raw:
            code = CASES[name][0]
            sides = [("before", before), ("after", sys.executable)]
            for side, python in sides if rep % 2 == 0 else sides[::-1]:
                raw[name][side].append(run_case(python, code))
    return raw


def _median(runs: list[dict], field: str) -> float:
    return median([r[field] for r in runs])


def report(raw: dict, reps: int) -> tuple[str, list[dict]]:
    rows, verdicts = [], []
    for name, sides in raw.items():
        _, field, unit = CASES[name]
        scale = {"ms/op": 1e3, "µs/call": 1e6}.get(unit, 1.0)
        b, a = _median(sides["before"], field) * scale, _median(sides["after"], field) * scale
        ref = ""
        if name.startswith("all_reduce"):
            tb, ta = (_median(sides[s], "torch") * 1e3 for s in ("before", "after"))
            ref = f"torch threaded {tb:.3f} / {ta:.3f} ms/op: ours/torch {b / tb:.2f}x / {a / ta:.2f}x"
            verdicts.append({"case": name, "ratio_to_torch": a / ta, "target": 1.0, "met": a / ta <= 1.0})
        if name == "socket per-call overhead":
            ab, aa, pb, pa = (
                _median(sides[side], field) * 1e6
                for field in ("api_all_reduce", "p2p_overhead_s")
                for side in ("before", "after")
            )
            ref = f"all_reduce {ab:.0f} / {aa:.0f} µs a call; send/recv overhead {pb:.1f} / {pa:.1f} µs a call"
            verdicts.append({"case": name, "after_before": a / b, "target": 0.5, "met": a / b <= 0.5})
        if name.startswith("world 1024 ring, messages") and "world 1024 ring, collectives" in raw:
            coll = _median(raw["world 1024 ring, collectives"]["after"], "wall")
            peak = _median(sides["after"], "peak_mb")
            ref = f"after / collectives detail {a / coll:.1f}x; peak {peak:.0f} MB"
        rows.append([name, unit, f"{b:.3f}" if b < 100 else f"{b:.0f}", f"{a:.3f}" if a < 100 else f"{a:.0f}",
                     fmt_ratio(a / b), ref])  # fmt: skip
    table = markdown_table(["case", "unit", "before (median)", "after (median)", "after/before", "reference"], rows)
    text = (
        "### Before and after, measured in one run\n\n"
        f"Each case in a fresh process of each version, alternating; median of {reps}.\n\n{table}\n"
    )
    return text, verdicts


def main(argv: list[str] | None = None) -> dict:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="a Python interpreter whose simdist is the version before")
    args = parser.parse_args(argv)
    reps = args.reps or (1 if args.quick else 5)
    info = machine_info()
    raw = measure(args.before, reps, args.quick)
    finish_info(info)
    text, verdicts = report(raw, reps)
    return publish("before-after", args, info, reps, raw, text, verdicts, lambda timer, quick: "", before=args.before)


if __name__ == "__main__":
    main()
