"""Run every simdist benchmark and print the figures as markdown (for BENCHMARKS.md).

    python benchmarks/run_all.py [--quick] [--json PATH] [--profile] [--profile-timer cpu|wall]

Runs (a) ``bench_sim_allreduce``, (b) ``bench_sched_points``, (c) ``bench_scale``,
(d) ``bench_socket`` (socket backend vs gloo, real processes; ``--no-socket`` skips it),
(e) ``bench_ddp`` (DistributedDataParallel step time, simdist on the socket backend vs torch on
gloo, real processes; ``--no-ddp`` skips it) and (f) ``bench_testing`` (``simdist.testing``:
schedules explored per second, and how often PCT finds the demonstration race; ``--no-testing``
skips it, ~5-15 s) in this process, one after the other, then prints a summary of the targets.
40-60 s on a 2-core machine for (a)-(c), 1-3 min more for (d), 1-2 min for (e) (``--quick``:
~20 s; figures from a quick run are smoke figures, not results). ``--json PATH`` writes every raw figure to one file;
``--profile`` adds cProfile tables (top 25 by tottime, all threads) of the slowest cases.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_ddp
import bench_scale
import bench_sched_points
import bench_sim_allreduce
import bench_socket
import bench_testing
from _common import (
    base_parser,
    finish_info,
    fmt_int,
    fmt_ratio,
    machine_info,
    machine_markdown,
    markdown_table,
    verdict,
    write_json,
)


def _summary(results: dict) -> str:
    rows = []
    a = [v for v in results["a"]["verdicts"] if "threads" not in v]
    for mode in dict.fromkeys(v["mode"] for v in a):
        cells = [v for v in a if v["mode"] == mode]
        worst = max(cells, key=lambda v: v["ratio"] or 0.0)
        ok = all(v["met"] for v in cells)
        figures = ", ".join(f"{v['size']} {fmt_ratio(v['ratio'])}" for v in cells)
        rows.append(
            [
                f"(a) all_reduce world 4, {mode}: ours/torch <= 1.0x",
                figures,
                verdict(ok) + ("" if ok else f" (worst {worst['size']})"),
            ]
        )
    for v in results["b"]["verdicts"]:
        rows.append(
            [
                f"(b) {v['program']}: >= {v['target_share']:.0%} of a bare baton",
                f"{fmt_int(v['points_per_s'])} points/s = {v['share']:.0%}",
                verdict(v["met"]),
            ]
        )
    for v in results["c"]["verdicts"]:
        if "target_s" in v:
            rows.append([f"(c) {v['case']}: < {v['target_s']:g} s", f"{v['seconds']:.2f} s", verdict(v["met"])])
        else:
            rows.append(
                [f"(c) {v['case']}: < {v['target_mb'] / 1024:g} GB peak", f"{v['peak_mb']:.0f} MB", verdict(v["met"])]
            )
    if "d" in results:
        d = results["d"]["verdicts"]
        for key in dict.fromkeys((v["world"], v["op"]) for v in d):
            cells = [v for v in d if (v["world"], v["op"]) == key]
            ok = all(v["met"] for v in cells)
            figures = ", ".join(f"{v['size']} {fmt_ratio(v['ratio'])}" for v in cells)
            rows.append([f"(d) socket {key[1]} world {key[0]}, >= 1 MiB: busbw >= 1.0x gloo", figures, verdict(ok)])
    if "e" in results:
        for v in results["e"]["verdicts"]:
            rows.append(
                [
                    f"(e) DDP step, {v['case']}: simdist socket / torch gloo <= {v['target']:.2f}x",
                    f"{v['simdist_s'] * 1e3:.1f} / {v['torch_s'] * 1e3:.1f} ms = {fmt_ratio(v['ratio'])}",
                    verdict(v["met"]),
                ]
            )
    if "f" in results:
        for v in results["f"]["verdicts"]:
            if "schedules_per_s" in v:
                rows.append(
                    [
                        f"(f) {v['case']}, 4 ranks, ~50 points: >= {bench_testing.RATE_TARGET} schedules/s",
                        f"{fmt_int(v['schedules_per_s'])} schedules/s",
                        verdict(v["met"]),
                    ]
                )
            else:
                rows.append(
                    [
                        f"(f) {v['case']} within 100 runs: >= {bench_testing.FOUND_TARGET:.0%} of seeds",
                        f"{v['share']:.0%} (median {v['median_runs']} runs)",
                        verdict(v["met"]),
                    ]
                )
    if "g" in results:
        for v in results["g"]["verdicts"]:
            rows.append(
                [f"(g) app, world 16, 1 MiB: {v['case']} < 1 s", f"{v['median_s'] * 1e3:.0f} ms", verdict(v["met"])]
            )
    return markdown_table(["target", "measured (median)", "verdict"], rows)


def main(argv=None) -> dict:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--no-socket", action="store_true", help="skip (d) bench_socket (real processes, ~2 min)")
    parser.add_argument("--no-ddp", action="store_true", help="skip (e) bench_ddp (real processes, ~1-2 min)")
    parser.add_argument(
        "--no-testing", action="store_true", help="skip (f) bench_testing (simdist.testing exploration, ~5-15 s)"
    )
    parser.add_argument("--no-app", action="store_true", help="skip (g) bench_app (the visualizer, ~20 s)")
    args = parser.parse_args(argv)
    common = []
    if args.quick:
        common.append("--quick")
    if args.reps:
        common += ["--reps", str(args.reps)]
    if args.profile:
        common += ["--profile", "--profile-timer", args.profile_timer]
    info = machine_info()
    t0 = time.perf_counter()
    results = {}
    benches = [("a", bench_sim_allreduce), ("b", bench_sched_points), ("c", bench_scale)]
    if not args.no_socket:
        benches.append(("d", bench_socket))
    if not args.no_ddp:
        benches.append(("e", bench_ddp))
    if not args.no_testing:
        benches.append(("f", bench_testing))
    if not args.no_app:
        import bench_app

        benches.append(("g", bench_app))
    for key, mod in benches:
        print(f"<!-- running {mod.__name__} {' '.join(common)} -->", flush=True)
        results[key] = mod.main(common)
        print(flush=True)
    elapsed = time.perf_counter() - t0
    finish_info(info)
    summary = _summary(results)
    print("## Summary of targets\n")
    print(summary)
    print()
    print(machine_markdown(info))
    print(f"\nAll benchmarks took {elapsed:.0f} s of wall time.")
    if args.json:
        write_json(args.json, {"machine": info, "elapsed_s": elapsed, "summary": summary, "results": results})
    return results


if __name__ == "__main__":
    main()
