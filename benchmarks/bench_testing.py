"""(f) simdist.testing: schedules explored per second, and how often PCT finds a depth-2 bug.

    python benchmarks/bench_testing.py [--reps 3] [--quick] [--json PATH] [--profile]

(i) Schedules per second of ``simdist.testing.explore`` on a 4-rank program with about 50
scheduling points (two rounds of an all_reduce of 4 float32 followed by a ring exchange
with isend/irecv, then a broadcast and a barrier; ``SimResult.points`` of a seeded run is
printed). ``explore(..., strategy=S, max_runs=N, seed=0)`` runs the program under N
schedules and every run passes, so the figure is N / wall time of the whole call (its runs
reuse one pool of rank threads). Median of ``--reps``. Target: >= 1,000 schedules/s (issue 18;
it was 200 in issue 5).

(ii) Detection: the race of the testing demonstrations (tests/testing/test_testing_demos.py (a)):
3 ranks, rank 0 takes one message with ``recv(src=None)`` and asserts it came from rank 1.
For each of 100 seeds ``s`` we count the runs that ``explore(strategy="pct", depth=2,
max_runs=100, seed=s * 1000)`` needs to meet the failure. ``explore`` does not report how
many runs it made before failing (and calling it with growing ``max_runs`` would cost
quadratic time), so its loop is replicated: run ``i`` simulates under
``PCTStrategy(run_seed(seed, i), depth, steps)`` with ``steps = 1000`` for the first run and
``max(len(first_run.choices), depth)`` after it, exactly as ``explore`` does; the count is
the index of the first run that raises, plus one. A few seeds are cross-checked against
``explore`` itself (``max_runs = count`` raises, ``max_runs = count - 1`` does not).
Target: found within 100 runs for >= 95% of the seeds. (This race needs no preemption under
PCT, only the wrong priority order, so about half the runs hit it; the figure is a check
that the search works, not a measure of PCT on deep bugs.)
"""

from __future__ import annotations

import sys
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
import simdist.testing as sdt
from simdist.backends.sim import PCTStrategy
from simdist.testing._explore import run_seed

RATE_TARGET = 1000  # schedules/s (issue 18, item 3)
FOUND_TARGET = 0.95  # share of seeds
WORLD, ROUNDS = 4, 2
RACE_WORLD, DEPTH, MAX_RUNS = 3, 2, 100


def exchange_program(rank: int, rounds: int) -> float:
    """all_reduce, then a ring exchange, ``rounds`` times; a broadcast and a barrier. ~50 points at 4 ranks."""
    simdist.init_process_group("gloo")
    world = simdist.get_world_size()
    t, buf = torch.ones(4), torch.zeros(4)
    for _ in range(rounds):
        simdist.all_reduce(t)
        works = [simdist.isend(t, dst=(rank + 1) % world), simdist.irecv(buf, src=(rank - 1) % world)]
        for work in works:
            work.wait()
    simdist.broadcast(buf, src=0)
    simdist.barrier()
    simdist.destroy_process_group()
    return buf[0].item()


def first_message_race(rank: int) -> None:
    """Rank 0 assumes rank 1's message arrives first (the demonstration (a))."""
    simdist.init_process_group("gloo")
    t = torch.zeros(1)
    if rank == 0:
        first = simdist.recv(t)
        assert first == 1, f"expected rank 1's message first, got rank {first}'s"
        for _ in range(simdist.get_world_size() - 2):
            simdist.recv(t)
    else:
        simdist.send(t, dst=0)
    simdist.destroy_process_group()


def explore_rate(strategy: str, runs: int) -> tuple[float, float]:
    wall, cpu, summary = timed_cpu(
        partial(
            sdt.explore,
            exchange_program,
            WORLD,
            args=(ROUNDS,),
            strategy=strategy,
            max_runs=runs,
            seed=0,
            progress=False,
        )
    )
    assert summary.runs == runs, summary
    return wall, cpu


def runs_to_find(seed: int, depth: int = DEPTH, max_runs: int = MAX_RUNS) -> int | None:
    """The runs ``explore(first_message_race, 3, strategy='pct', depth, max_runs, seed)`` makes up to its failure."""
    steps = 1000
    for i in range(max_runs):
        try:
            res = run_sim(first_message_race, RACE_WORLD, strategy=PCTStrategy(run_seed(seed, i), depth, steps))
        except simdist.DistError:
            return i + 1
        if i == 0:
            steps = max(len(res.choices), depth)
    return None


def cross_check(seed: int, count: int) -> bool:
    """``explore`` itself fails within ``count`` runs, and (if ``count > 1``) not within ``count - 1``."""

    def fails(k: int) -> bool:
        try:
            sdt.explore(
                first_message_race, RACE_WORLD, strategy="pct", depth=DEPTH, max_runs=k, seed=seed, progress=False
            )
        except simdist.DistError:
            return True
        return False

    return fails(count) and (count == 1 or not fails(count - 1))


def measure(reps: int, quick: bool) -> dict:
    runs = 50 if quick else 200
    seeds = 20 if quick else 100
    points = run_sim(exchange_program, WORLD, (ROUNDS,), seed=0).points
    raw: dict = {
        "rate": {"world": WORLD, "rounds": ROUNDS, "points_seed0": points, "runs": runs, "strategies": {}},
        "find": {"world": RACE_WORLD, "depth": DEPTH, "max_runs": MAX_RUNS, "seeds": seeds},
    }
    for _ in range(reps):
        for strategy in ("random", "pct"):
            wall, cpu = explore_rate(strategy, runs)
            e = raw["rate"]["strategies"].setdefault(strategy, {"wall": [], "cpu": []})
            e["wall"].append(wall)
            e["cpu"].append(cpu)
    for e in raw["rate"]["strategies"].values():
        e["median_wall"], e["median_cpu"] = median(e["wall"]), median(e["cpu"])
        e["schedules_per_s"] = runs / e["median_wall"]
        e["schedules_per_cpu_s"] = runs / e["median_cpu"]
    wall, _, counts = timed_cpu(lambda: [runs_to_find(s * 1000) for s in range(seeds)])
    found = [c for c in counts if c is not None]
    checked = [(s * 1000, c) for s, c in enumerate(counts) if c is not None][:5]
    raw["find"].update(
        counts=counts,
        wall=wall,
        found=len(found),
        share=len(found) / seeds,
        median_runs=median(found) if found else None,
        max_runs_seen=max(found) if found else None,
        cross_checked={str(s): cross_check(s, c) for s, c in checked},
    )
    return raw


def report(raw: dict, reps: int) -> tuple[str, list[dict]]:
    rate, find = raw["rate"], raw["find"]
    rows, verdicts = [], []
    for strategy, e in rate["strategies"].items():
        ok = e["schedules_per_s"] >= RATE_TARGET
        verdicts.append({"case": f"explore {strategy}", "schedules_per_s": e["schedules_per_s"], "met": ok})
        rows.append(
            [
                strategy,
                WORLD,
                rate["points_seed0"],
                rate["runs"],
                fmt_ms(e["median_wall"], 0),
                f"{e['median_wall'] / rate['runs'] * 1e3:.2f}",
                fmt_int(e["schedules_per_s"]),
                fmt_int(e["schedules_per_cpu_s"]),
                fmt_int(e["schedules_per_s"] * rate["points_seed0"]),
                verdict(ok),
            ]
        )
    table = markdown_table(
        [
            "strategy",
            "world",
            "points/run (seed 0)",
            "runs",
            "wall ms (median)",
            "ms/schedule",
            "schedules/s",
            "schedules/CPU-s",
            "~points/s",
            f"target >= {RATE_TARGET}",
        ],
        rows,
    )
    ok = find["share"] >= FOUND_TARGET
    verdicts.append(
        {"case": "pct depth 2 finds the race", "share": find["share"], "median_runs": find["median_runs"], "met": ok}
    )
    checks = find["cross_checked"]
    find_table = markdown_table(
        [
            "bug",
            "world",
            "depth",
            "seeds",
            "found within 100 runs",
            "runs to find (median)",
            "(max)",
            "wall s (all seeds)",
            f"target >= {FOUND_TARGET:.0%}",
        ],
        [
            [
                "recv(src=None) race (demo (a))",
                find["world"],
                find["depth"],
                find["seeds"],
                f"{find['found']} ({find['share']:.0%})",
                find["median_runs"] if find["median_runs"] is not None else "-",
                find["max_runs_seen"] if find["max_runs_seen"] is not None else "-",
                f"{find['wall']:.2f}",
                verdict(ok),
            ]
        ],
    )
    text = (
        "### (f) simdist.testing: exploration speed and detection\n\n"
        f"Schedules/s = runs / wall time of one `explore(program, {WORLD}, strategy=S, max_runs={rate['runs']}, "
        f"seed=0)` call (every run passes); median of {reps} repetitions. The program: {ROUNDS} rounds of "
        "all_reduce (4 float32) + ring isend/irecv, then broadcast and barrier; ~points/s = schedules/s x the "
        "points of the seed-0 run.\n\n"
        f"{table}\n\n"
        f"Detection: for seeds s = 0, 1000, ..., the runs of `explore(race, {find['world']}, strategy='pct', "
        f"depth={find['depth']}, max_runs={find['max_runs']}, seed=s)` up to the first failure, counted by "
        "replicating explore's loop (PCTStrategy(run_seed(seed, i), depth, steps)); cross-checked against `explore` on "
        f"{len(checks)} seeds: {'all agree' if all(checks.values()) else 'MISMATCH ' + str(checks)}.\n\n"
        f"{find_table}\n"
    )
    return text, verdicts


def profile_worst(timer: str, quick: bool) -> str:
    runs = 20 if quick else 100
    return (
        f"#### profile: explore pct, {runs} runs of the {WORLD}-rank program\n\n```\n"
        + profile_call(partial(explore_rate, "pct", runs), timer=timer)
        + "```\n"
    )


def main(argv=None) -> dict:
    args = base_parser(__doc__.splitlines()[0]).parse_args(argv)
    reps = args.reps or (1 if args.quick else 3)
    info = machine_info()
    raw = measure(reps, args.quick)
    finish_info(info)
    text, verdicts = report(raw, reps)
    return publish("testing", args, info, reps, raw, text, verdicts, profile_worst)


if __name__ == "__main__":
    main()
