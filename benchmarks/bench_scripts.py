"""(u) A script under test: schedules per second of ``simdist.testing.explore_script`` (what ``simdist test`` runs),
ranks as processes against ranks as threads, measured in one run.

    python benchmarks/bench_scripts.py [--reps 3]

The script is the one of docs/testing-scripts.md with the fix (4 ranks; rank 0 receives from each other rank in
turn): every schedule passes, so an exploration of N schedules runs N whole runs of the script (``runpy`` of the
file on every rank, ``init_process_group``, 3 sends and receives, ``destroy_process_group``; each run in the
copy of the working directory, put back before it). The figure is the slope between a short and a long
exploration (their difference in runs over their difference in wall time), so the start-up of an exploration
(the copy, a template process for the ranks) cancels; median of ``--reps``, each repetition measuring both
isolations.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_markdown, markdown_table, median

import simdist.testing as sdt

SCRIPT = """\
import torch, torch.distributed as dist

dist.init_process_group("gloo")
r, w = dist.get_rank(), dist.get_world_size()
if r == 0:
    got = []
    for src in range(1, w):
        t = torch.zeros(1)
        dist.recv(t, src=src)
        got.append(int(t.item()))
    assert got == sorted(got), f"arrival order {got}"
else:
    dist.send(torch.tensor([float(r)]), dst=0)
dist.destroy_process_group()
"""
RUNS = {"threads": (100, 300), "processes": (10, 30)}  # the short and the long exploration


def _explore(isolation: str, runs: int) -> float:
    start = time.perf_counter()
    summary = sdt.explore_script("fixed.py", 4, max_runs=runs, isolation=isolation, progress=False)
    assert summary.runs == runs
    return time.perf_counter() - start


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    opts = parser.parse_args()
    rates: dict[str, list[float]] = {mode: [] for mode in RUNS}
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "fixed.py").write_text(SCRIPT)
        os.chdir(folder)
        for mode in RUNS:
            _explore(mode, 2)  # warm: imports, the fork server
        for _ in range(opts.reps):
            for mode, (short, long) in RUNS.items():
                a, b = _explore(mode, short), _explore(mode, long)
                rates[mode].append((long - short) / (b - a))
    rows = [
        [
            mode,
            f"{RUNS[mode][0]} / {RUNS[mode][1]}",
            f"{median(r):.1f}",
            f"{1e3 / median(r):.1f}",
            ", ".join(f"{x:.1f}" for x in r),
        ]
        for mode, r in rates.items()
    ]
    print(markdown_table(["ranks as", "runs (short / long)", "schedules/s", "ms a schedule", "each repetition"], rows))
    print(f"\nprocesses / threads: {median(rates['processes']) / median(rates['threads']):.4f}x")
    print(machine_markdown())


if __name__ == "__main__":
    main()
