"""(k) The cost of checking collectives across ranks on the socket backend: checked vs unchecked all_reduce.

    python benchmarks/bench_socket_checked.py [--reps 5] [--quick] [--json PATH] [--profile] [--profile-timer cpu|wall]

Issue 15, item 3. all_reduce (SUM, float32) of 4 KiB and 64 MiB at world 2 and 4, in real
processes on this machine (``simdist.spawn(..., backend="socket")``), with the check on (the
default) and off (what ``SIMDIST_CHECK_COLLECTIVES=0`` sets at ``init_process_group``), side
by side in the same processes: every rank flips its default group's setting before each
iteration, in the same order on every rank, so the two settings share connections, warm-up
and whatever else runs on the machine. The timing is bench_socket's (d): inside rank 0 each
timed iteration is ``barrier(); t0; all_reduce; t1`` (the barrier untimed); per-op time =
the median of ``t1 - t0`` per setting. The table gives the median over repetitions (one job
each), the ratio checked / unchecked of those medians, and the paired ratio: the median of
checked / unchecked over the iterations (each iteration times the two settings one right
after the other, so it holds up best when other work loads the machine). The extra time is one all-gather of 16-byte digests:
one round of messages at world 2, two at world 4.

``--profile`` runs the checked 4 KiB case at world 2 with rank 0's loop under cProfile.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_socket
import torch
from _common import KIB, MIB, base_parser, finish_info, fmt_ms, fmt_ratio, machine_info, markdown_table, median, publish

import simdist
from simdist.core._world import current_world

SIZES = (4 * KIB, 64 * MIB)
WORLDS = (2, 4)
# (warm-up calls per setting, timed iterations per setting) per size
ITERS = {4 * KIB: (10, 200), 64 * MIB: (1, 16)}
QUICK_ITERS = {4 * KIB: (5, 50), 64 * MIB: (1, 2)}


def rank_loop(rank: int, world: int, cases: list) -> dict:
    """Rank 0's median seconds per all_reduce per setting, and each iteration's checked / unchecked time.

    Keys ``"SIZE/checked"``, ``"SIZE/unchecked"`` (seconds) and ``"SIZE/pairs"`` (the ratios of
    the two settings' times in each iteration, which ran one right after the other).
    """
    torch.set_num_threads(1)
    simdist.init_process_group("socket")
    group = current_world().default_group
    out = {}
    try:
        for _, nbytes, warm, iters in cases:
            t = torch.ones(nbytes // 4)
            times: dict[bool, list] = {True: [], False: []}
            for i in range(warm + iters):
                for checked in (True, False) if i % 2 == 0 else (False, True):
                    group.checked = checked  # the same order on every rank
                    t.fill_(1.0)
                    simdist.barrier()
                    t0 = time.perf_counter()
                    simdist.all_reduce(t)
                    if i >= warm:
                        times[checked].append(time.perf_counter() - t0)
            assert float(t.min()) == float(t.max()) == world, "all_reduce result"
            out[f"{nbytes}/checked"] = median(times[True])
            out[f"{nbytes}/unchecked"] = median(times[False])
            out[f"{nbytes}/pairs"] = [a / b for a, b in zip(times[True], times[False])]
        group.checked = True
        simdist.barrier()
        return out
    finally:
        simdist.destroy_process_group()


def main(argv=None) -> dict:
    parser = base_parser(__doc__.splitlines()[0])
    args = parser.parse_args(argv)
    reps = args.reps or (1 if args.quick else 5)
    iters = QUICK_ITERS if args.quick else ITERS
    cases = [("all_reduce", s, *iters[s]) for s in SIZES]
    info = machine_info()
    t_start = time.perf_counter()

    runs: dict = {w: [] for w in WORLDS}
    for _ in range(reps):
        for w in WORLDS:
            runs[w].append(simdist.spawn(rank_loop, args=(w, cases), nprocs=w, backend="socket")[0])

    raw, rows = [], []
    for w in WORLDS:
        for s in SIZES:
            on = median(x[f"{s}/checked"] for x in runs[w])
            off = median(x[f"{s}/unchecked"] for x in runs[w])
            ratio = on / off
            paired = median(r for x in runs[w] for r in x[f"{s}/pairs"])
            rows.append(
                [
                    str(w),
                    bench_socket.size_label(s),
                    fmt_ms(off),
                    fmt_ms(on),
                    fmt_ms(on - off),
                    fmt_ratio(ratio),
                    fmt_ratio(paired),
                ]
            )
            raw.append(
                {
                    "world": w,
                    "bytes": s,
                    "size": bench_socket.size_label(s),
                    "unchecked_s": off,
                    "checked_s": on,
                    "ratio": ratio,
                    "paired_ratio": paired,
                    "checked_runs_s": [x[f"{s}/checked"] for x in runs[w]],
                    "unchecked_runs_s": [x[f"{s}/unchecked"] for x in runs[w]],
                }
            )
    elapsed = time.perf_counter() - t_start
    finish_info(info)

    headers = [
        "world",
        "size",
        "unchecked ms",
        "checked ms",
        "extra ms",
        "checked / unchecked",
        "paired ratio (median)",
    ]
    counts = ", ".join(f"{bench_socket.size_label(s)}: {iters[s][1]}" for s in SIZES)
    text = "\n\n".join(
        [
            (
                f"all_reduce (SUM, float32) per op = median over {counts} "
                "timed iterations per setting in rank 0 (barrier before each op), the settings alternating in the same "
                f"processes, after warm-up; median of {reps} job(s); every rank at 1 torch intra-op thread. "
                "Paired ratio: the median, over every iteration of every job, of checked / unchecked time of "
                "the two calls of one iteration (one right after the other)."
            ),
            markdown_table(headers, rows),
            f"Whole run: {elapsed:.0f} s of wall time.",
        ]
    )

    def profile(timer: str, quick: bool) -> str:
        case = ("all_reduce", 4 * KIB, *iters[4 * KIB])
        prof = simdist.spawn(bench_socket.simdist_rank, args=(2, [], case, timer), nprocs=2, backend="socket")[0]
        return (
            f"Profile of rank 0, socket backend, checked all_reduce 4 KiB world 2, {case[3]} iterations "
            f"(barrier + op), {timer} time:\n\n```\n{prof}```"
        )

    return publish("bench_socket_checked", args, info, reps, raw, text, [], profile, elapsed_s=elapsed)


if __name__ == "__main__":
    main()
