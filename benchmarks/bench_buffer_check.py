"""(l) The cost of the buffer-race check (``simulate(..., check_buffers=True)``) on p2p ping-pong.

    python benchmarks/bench_buffer_check.py [--reps 7] [--quick] [--json PATH] [--profile]

Programs (world 2, seeded random strategy): a ping-pong with blocking ``send``/``recv``
(never checked: the check covers asynchronous operations), and ping-pongs with
``isend(...).wait()`` / ``irecv(...).wait()`` of 4 float32 and of 1 MiB. Each runs with the
check off and on, interleaved within every repetition; wall time of the whole
``simulate`` call, median over repetitions, ratio on/off; one torch intra-op thread. Above 10% the check is an
option (default off) that ``simdist.testing`` turns on.

Also: what one check costs, copy and compare (the check's way) against a
checksum taken at post and again at completion (``zlib.crc32``, ``hashlib.blake2b``), on
one buffer outside the simulator.
"""

from __future__ import annotations

import hashlib
import sys
import time
import zlib
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import torch
from _common import (
    base_parser,
    finish_info,
    fmt_ms,
    machine_info,
    markdown_table,
    median,
    profile_call,
    publish,
    run_sim,
    timed_cpu,
)

import simdist

LIMIT = 1.10  # above this ratio the check is an option, off by default


def ping_pong(rank: int, n: int, numel: int, blocking: bool) -> None:
    simdist.init_process_group("gloo")
    t = torch.zeros(numel)
    peer = 1 - rank
    for _ in range(n):
        for kind in ("send", "recv") if rank == 0 else ("recv", "send"):
            if blocking:
                (simdist.send if kind == "send" else simdist.recv)(t, peer)
            else:
                (simdist.isend if kind == "send" else simdist.irecv)(t, peer).wait()
    simdist.destroy_process_group()


# (label, numel, blocking, iterations, quick iterations)
PROGRAMS = [
    ("send/recv 4 floats (blocking, unchecked)", 4, True, 500, 100),
    ("isend/irecv + wait, 4 floats", 4, False, 500, 100),
    ("isend/irecv + wait, 1 MiB", 1 << 18, False, 100, 20),
]


def measure(reps: int, quick: bool) -> dict:
    raw: dict = {}
    for label, numel, blocking, n, nq in PROGRAMS:  # warm-up: imports, first allocations
        run_sim(ping_pong, 2, (2, numel, blocking), seed=0, check_buffers=True)
    for _ in range(reps):
        for label, numel, blocking, n, nq in PROGRAMS:
            iters = nq if quick else n
            e = raw.setdefault(
                label, {"iters": iters, "numel": numel, "off": [], "on": [], "cpu_off": [], "cpu_on": []}
            )
            for on in (False, True):
                call = partial(run_sim, ping_pong, 2, (iters, numel, blocking), seed=0, check_buffers=on)
                wall, cpu, res = timed_cpu(call)
                e["on" if on else "off"].append(wall)
                e["cpu_on" if on else "cpu_off"].append(cpu)
                e["points"] = res.points
    for e in raw.values():
        e["median_off"], e["median_on"] = median(e["off"]), median(e["on"])
        e["ratio"] = e["median_on"] / e["median_off"]
        e["cpu_ratio"] = median(e["cpu_on"]) / median(e["cpu_off"])
        e["ops"] = 4 * e["iters"]  # two operations per rank per iteration
    return raw


def per_byte(quick: bool) -> dict:
    """Seconds of one check of one buffer: copy + compare, or two checksums (post and completion)."""
    x = torch.randn(1 << 18)  # 1 MiB
    view = x.numpy().view(np.uint8)
    ways = {
        "copy + compare (the check)": lambda: np.array_equal(view, x.clone().numpy().view(np.uint8)),
        "crc32 twice": lambda: zlib.crc32(view) == zlib.crc32(view),
        "blake2b twice": lambda: hashlib.blake2b(view).digest() == hashlib.blake2b(view).digest(),
    }
    n = 20 if quick else 200
    out = {}
    for name, fn in ways.items():
        batches = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            batches.append((time.perf_counter() - t0) / n)
        out[name] = median(batches)
    return out


def report(raw: dict, ways: dict, reps: int) -> tuple[str, list[dict]]:
    rows, verdicts = [], []
    for label, e in raw.items():
        extra_us = (e["median_on"] - e["median_off"]) / e["ops"] * 1e6
        rows.append(
            [
                label,
                e["iters"],
                fmt_ms(e["median_off"], 1),
                fmt_ms(e["median_on"], 1),
                f"{e['ratio']:.2f}x",
                f"{e['cpu_ratio']:.2f}x",
                f"{extra_us:.1f}",
            ]
        )
        verdicts.append({"program": label, "ratio": e["ratio"], "under_limit": e["ratio"] <= LIMIT})
    table = markdown_table(
        [
            "program (world 2)",
            "iterations",
            "check off, ms",
            "check on, ms",
            "on/off (wall)",
            "on/off (CPU)",
            "extra us per operation",
        ],
        rows,
    )
    ways_table = markdown_table(["1 MiB buffer, one check", "us"], [[k, f"{v * 1e6:.0f}"] for k, v in ways.items()])
    worst = max(e["ratio"] for e in raw.values())
    decision = (
        "above 10%: the check is an option, `simulate(..., check_buffers=True)`, off by default and on in "
        "`simdist.testing`"
        if worst > LIMIT
        else "within 10%: the check can stay on"
    )
    text = (
        "### (l) the buffer-race check on p2p ping-pong\n\n"
        f"Median of {reps} repetitions, check off and on interleaved; wall time of the whole `simulate` call "
        "(CPU: process CPU time, all threads, less sensitive to other load). "
        f"Worst ratio {worst:.2f}x: {decision}.\n\n{table}\n\n{ways_table}\n"
    )
    return text, verdicts


def profile_checked(timer: str, quick: bool) -> str:
    label, numel, blocking, n, nq = PROGRAMS[1]
    call = partial(run_sim, ping_pong, 2, (nq if quick else n, numel, blocking), seed=0, check_buffers=True)
    return f"#### profile: {label}, check on\n\n```\n" + profile_call(call, timer=timer) + "```\n"


def main(argv=None) -> dict:
    args = base_parser(__doc__.splitlines()[0]).parse_args(argv)
    torch.set_num_threads(1)  # copies of 1 MiB would otherwise fork to intra-op threads, which the load slows
    reps = args.reps or (2 if args.quick else 7)
    info = machine_info()
    raw = measure(reps, args.quick)
    ways = per_byte(args.quick)
    finish_info(info)
    text, verdicts = report(raw, ways, reps)
    return publish(
        "buffer_check", args, info, reps, {"programs": raw, "one_check_1MiB": ways}, text, verdicts, profile_checked
    )


if __name__ == "__main__":
    main()
