"""(s) Ranks as processes against ranks as threads: per scheduling point, start-up, explore, memory.

    python benchmarks/bench_isolation.py --reps 5 [--quick] [--json PATH] [--profile]

Every figure is measured for both isolations in the same run, the two interleaved in each repetition;
the table gives medians and the ratio processes / threads (targets of issue 43, item 5):

- **per scheduling point**: p2p ping-pong between 2 ranks (send/recv of 4 float32). The cost of one point
  is the difference of two runs' wall times divided by the difference of their point counts
  (``SimResult.points``), so what a run costs once (starting its ranks, ending them) cancels out.
  Target: processes <= 2x threads.
- **8 ranks ready**: a run of 8 ranks whose function returns the time it started, after a first run of
  the same function (the fork server and the template are made then). Ready = the last rank's start
  minus the moment ``simulate`` was called; the whole call is given too. Target: <= 0.3 s.
- **explore**: ``simdist.testing.explore`` of the 48-point exchange program of (f) at 4 ranks (PCT),
  schedules per second. Target: processes >= 100 schedules/s.
- **the floor of a run**: a run of 4 ranks whose function only returns (what every schedule of
  ``explore`` at 4 ranks costs before its first point; 1 / it bounds the schedules per second of any
  program), and, for ping-pong, the CPU time per scheduling point of the coordinator's process
  (``getrusage``) and of the rank processes (``time.process_time`` read by each rank around its loop).
- **memory per rank**: what a rank process holds on its own (Private_Clean + Private_Dirty of
  ``/proc/self/smaps_rollup``, read by the rank after ``init_process_group``) and its proportional
  share (Pss), beside a process that imports torch as a torchrun rank does, measured the same way.
  A rank thread's memory is its stack and the torch world it makes: the coordinator's resident memory
  read inside a run of 64 ranks less that inside a run of 2, per rank.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import bench_main, markdown_table, median, profile_call, verdict
from bench_sched_points import ping_pong
from bench_testing import ROUNDS, WORLD, exchange_program

import simdist
import simdist.testing as sdt

ISOLATIONS = ("threads", "processes")
POINT_RATIO, READY_S, EXPLORE_RATE = 2.0, 0.3, 100.0
SHORT, LONG = 200, 1200  # ping-pong round trips of the two runs whose difference is the per-point cost
READY_WORLD, THREAD_WORLD = 8, 64
EXPLORE_RUNS = 100


def started(rank: int) -> float:
    """The moment this rank's function began (``time.time`` is one clock for every process of the machine)."""
    return time.time()


def own_memory(rank: int) -> dict[str, int]:
    """This process's own memory and proportional share, in KiB, after joining the group."""
    simdist.init_process_group("gloo")
    simdist.barrier()
    memory = smaps_rollup(os.getpid())
    simdist.destroy_process_group()
    return memory


def smaps_rollup(pid: int) -> dict[str, int]:
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup", encoding="utf-8") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if rest.strip().endswith("kB"):
                fields[name] = int(rest.split()[0])
    return {"rss": fields["Rss"], "pss": fields["Pss"], "private": fields["Private_Clean"] + fields["Private_Dirty"]}


TORCHRUN_RANK = """\
import os, sys, torch, torch.distributed
sys.path.insert(0, sys.argv[1])
from bench_isolation import smaps_rollup
print(smaps_rollup(os.getpid()))
"""


def torch_process_memory() -> dict[str, int]:
    """What a process that imported torch and torch.distributed holds (a torchrun rank before its first call)."""
    out = subprocess.run(
        [sys.executable, "-c", TORCHRUN_RANK, str(Path(__file__).resolve().parent)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return eval(out.stdout.strip().splitlines()[-1])  # noqa: S307 - the dict our own child printed


def sim(fn, world: int, args: tuple = (), **options):
    return simdist.simulate(fn, world, args, seed=0, leaks="ignore", **options)


def per_point(isolation: str) -> tuple[float, float, float]:
    """Seconds per scheduling point of ping-pong (from two runs), and the two runs' wall times."""
    walls, points = [], []
    for n in (SHORT, LONG):
        t0 = time.perf_counter()
        res = sim(ping_pong, 2, (n,), isolation=isolation)
        walls.append(time.perf_counter() - t0)
        points.append(res.points)
    return (walls[1] - walls[0]) / (points[1] - points[0]), walls[0], walls[1]


def returns(rank: int) -> int:
    return rank


def timed_ping_pong(rank: int, n: int) -> float:
    """:func:`ping_pong`, returning the CPU seconds its process spent in it (joining and leaving included)."""
    c0 = time.process_time()
    ping_pong(rank, n)
    return time.process_time() - c0


def empty_run(isolation: str) -> float:
    """Seconds of a run of 4 ranks whose function only returns."""
    t0 = time.perf_counter()
    sim(returns, WORLD, isolation=isolation)
    return time.perf_counter() - t0


def cpu_per_point() -> tuple[float, float]:
    """CPU seconds per scheduling point of ping-pong in processes mode: the coordinator's, the rank processes'."""
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    res = sim(timed_ping_pong, 2, (LONG,), isolation="processes")
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    coordinator = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return coordinator / res.points, sum(res.values) / res.points


def ready(isolation: str) -> tuple[float, float]:
    """Seconds until the last of 8 ranks started, and of the whole ``simulate`` call."""
    t0 = time.time()
    res = sim(started, READY_WORLD, isolation=isolation)
    end = time.time()
    return max(res.values) - t0, end - t0


def explore_rate(isolation: str, runs: int) -> float:
    t0 = time.perf_counter()
    summary = sdt.explore(exchange_program, WORLD, args=(ROUNDS,), max_runs=runs, seed=0, progress=False,
                          isolation=isolation)  # fmt: skip
    wall = time.perf_counter() - t0
    assert summary.runs == runs, summary
    return runs / wall


def thread_rank_memory() -> float:
    """KiB of resident memory one rank thread adds: the coordinator's Rss read inside runs of 2 and of 64 ranks."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import bench_isolation as b; "
        "small = b.sim(b.own_memory, 2).values[0]['rss']; "
        f"big = b.sim(b.own_memory, {THREAD_WORLD}).values[0]['rss']; "
        f"print((big - small) / ({THREAD_WORLD} - 2))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).resolve().parent)], capture_output=True,
                         text=True, check=True, timeout=600)  # fmt: skip
    return float(out.stdout.strip().splitlines()[-1])


def measure(reps: int, quick: bool) -> dict:
    runs = 20 if quick else EXPLORE_RUNS
    for isolation in ISOLATIONS:  # warm-up: the fork server, the template, torch's lazy imports
        sim(ping_pong, 2, (10,), isolation=isolation)
        sim(started, READY_WORLD, isolation=isolation)
        explore_rate(isolation, 5)
    raw: dict = {iso: {"per_point": [], "short": [], "long": [], "ready": [], "call": [], "explore": [],
                   "empty": []}
                 for iso in ISOLATIONS}  # fmt: skip
    for _ in range(reps):
        for isolation in ISOLATIONS:
            e = raw[isolation]
            point, short, long = per_point(isolation)
            e["per_point"].append(point)
            e["short"].append(short)
            e["long"].append(long)
            r, call = ready(isolation)
            e["ready"].append(r)
            e["call"].append(call)
            e["explore"].append(explore_rate(isolation, runs))
            e["empty"].append(empty_run(isolation))
        split = cpu_per_point()
        raw.setdefault("cpu_split", []).append(split)
    ranks = sim(own_memory, 4, isolation="processes").values
    raw["memory"] = {
        "rank_process": ranks,
        "torch_process": torch_process_memory(),
        "rank_thread_kib": thread_rank_memory(),
    }
    return raw


def report(raw: dict, reps: int) -> tuple[str, list[dict]]:
    t, p = raw["threads"], raw["processes"]
    med = {iso: {k: median(v) for k, v in raw[iso].items()} for iso in ISOLATIONS}
    point_ratio = median(b / a for a, b in zip(t["per_point"], p["per_point"]))
    explore_ratio = median(b / a for a, b in zip(t["explore"], p["explore"]))
    verdicts = [
        {"figure": "per point, processes / threads", "value": point_ratio, "target": POINT_RATIO,
         "met": point_ratio <= POINT_RATIO},
        {"figure": "8 ranks ready, processes (s)", "value": med["processes"]["ready"], "target": READY_S,
         "met": med["processes"]["ready"] <= READY_S},
        {"figure": "explore, processes (schedules/s)", "value": med["processes"]["explore"], "target": EXPLORE_RATE,
         "met": med["processes"]["explore"] >= EXPLORE_RATE},
    ]  # fmt: skip
    rows = [
        ["p2p ping-pong, µs per scheduling point", f"{med['threads']['per_point'] * 1e6:.1f}",
         f"{med['processes']['per_point'] * 1e6:.1f}", f"{point_ratio:.2f}",
         f"processes <= {POINT_RATIO:g}x: {verdict(verdicts[0]['met'])}"],
        [f"ping-pong runs of {SHORT} and {LONG} round trips, ms",
         f"{med['threads']['short'] * 1e3:.0f} / {med['threads']['long'] * 1e3:.0f}",
         f"{med['processes']['short'] * 1e3:.0f} / {med['processes']['long'] * 1e3:.0f}", "", "reported"],
        [f"{READY_WORLD} ranks ready after the first run, ms", f"{med['threads']['ready'] * 1e3:.1f}",
         f"{med['processes']['ready'] * 1e3:.1f}", f"{med['processes']['ready'] / med['threads']['ready']:.1f}",
         f"processes <= {READY_S * 1e3:.0f} ms: {verdict(verdicts[1]['met'])}"],
        [f"the whole call of {READY_WORLD} ranks, ms", f"{med['threads']['call'] * 1e3:.1f}",
         f"{med['processes']['call'] * 1e3:.1f}", f"{med['processes']['call'] / med['threads']['call']:.1f}",
         "reported"],
        [f"explore, 48-point program at {WORLD} ranks, schedules/s", f"{med['threads']['explore']:.0f}",
         f"{med['processes']['explore']:.0f}", f"{explore_ratio:.2f}",
         f"processes >= {EXPLORE_RATE:g}/s: {verdict(verdicts[2]['met'])}"],
        [f"a run of {WORLD} ranks that only return, ms", f"{med['threads']['empty'] * 1e3:.1f}",
         f"{med['processes']['empty'] * 1e3:.1f}", f"{med['processes']['empty'] / med['threads']['empty']:.0f}",
         f"reported (at most {1 / med['processes']['empty']:.0f} schedules/s in processes)"],
        ["ping-pong, CPU µs per point: the coordinator / the rank processes", "",
         f"{median(c for c, _ in raw['cpu_split']) * 1e6:.1f} / {median(r for _, r in raw['cpu_split']) * 1e6:.1f}",
         "", "reported"],
    ]  # fmt: skip
    table = markdown_table(["figure", "threads", "processes", "processes / threads", "target"], rows)
    mem = raw["memory"]
    rank = {k: median(r[k] for r in mem["rank_process"]) for k in ("rss", "pss", "private")}
    torch_proc = mem["torch_process"]
    mem_rows = [
        ["a rank process (median of 4 ranks)", f"{rank['rss'] / 1024:.0f}", f"{rank['pss'] / 1024:.0f}",
         f"{rank['private'] / 1024:.1f}"],
        ["a process that imported torch (a torchrun rank before its first call)", f"{torch_proc['rss'] / 1024:.0f}",
         f"{torch_proc['pss'] / 1024:.0f}", f"{torch_proc['private'] / 1024:.1f}"],
        [f"a rank thread (the coordinator's growth per rank over {THREAD_WORLD} ranks)", "", "",
         f"{mem['rank_thread_kib'] / 1024:.1f}"],
    ]  # fmt: skip
    mem_table = markdown_table(["memory, MiB", "Rss", "Pss", "own (private)"], mem_rows)
    text = (
        "### (s) ranks as processes against ranks as threads\n\n"
        f"Median of {reps} repetitions, the two isolations interleaved in each; ratios are the median of the "
        "per-repetition ratios.\n\n"
        f"{table}\n\n{mem_table}\n"
    )
    return text, verdicts


def profile_worst(timer: str, quick: bool) -> str:
    prof = profile_call(partial(sim, ping_pong, 2, (SHORT,), isolation="processes"), timer=timer)
    return f"#### profile: ping-pong, processes, {SHORT} round trips (the coordinator's threads)\n\n```\n{prof}```\n"


def main(argv=None) -> dict:
    return bench_main(__doc__, "isolation", measure, report, profile_worst, argv)


if __name__ == "__main__":
    main()
