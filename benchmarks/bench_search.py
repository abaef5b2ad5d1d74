"""(j) Bounded exhaustive search: runs-to-find and schedules per second for seven bug kinds, with and without reduction.

    python benchmarks/bench_search.py [--reps 3] [--quick] [--json PATH] [--profile]

The seven programs are those of ``tests/support/search_bugs.py`` (3 ranks each): a parameter
server with any-source receives, a pipeline that reuses its isend buffer, uneven gradient
accumulation, a hand-written ring, subgroups created in different orders, a ragged
all_gather, and a torch.distributed task server run through the torch bridge.

For each program and each of ``reduce=True`` / ``False`` the search of
``explore(strategy="exhaustive", preemption_bound=1)`` (``simdist.testing._search.Search``,
which ``explore`` iterates) runs with ``max_runs=100``: *runs-to-find* is the number of the
first run that fails. *Schedules per second* comes from the same search continued past
failures with ``preemption_bound=2`` and ``max_runs=300`` (runs / wall time of the whole
iteration, thread start-up included; median of ``--reps``); *runs* and *complete* say
how much of that bound it covered. The depth-first enumeration that ``explore`` used
before (``next_schedule``: bump the last choice, no bound, no reduction) is the baseline
column, capped at 2,000 runs. Target (issue 16): each kind found within 100 runs.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

from _common import bench_main, markdown_table, median, profile_call, verdict
from search_bugs import BUGS, WORLD
from simdist.backends.sim import next_schedule, simulate

from simdist.core._errors import DistError
from simdist.testing._search import Search

OPTS = {"leaks": "ignore"}
DFS_CAP = 2000


def runs_to_find(fn, reduce: bool) -> int | None:
    """The number of the first failing run of the bound-1 search within 100 runs, or None."""
    found = Search(fn, WORLD, (), preemption_bound=1, reduce=reduce, max_runs=100, options=dict(OPTS))
    return next((found.runs for run in found if run.error is not None), None)


def throughput(fn, reduce: bool, max_runs: int) -> tuple[float, int, bool]:
    """(schedules per second, runs, complete) of the bound-2 search continued past failures."""
    found = Search(fn, WORLD, (), preemption_bound=2, reduce=reduce, max_runs=max_runs, options=dict(OPTS))
    t0 = time.perf_counter()
    for _ in found:
        pass
    return found.runs / (time.perf_counter() - t0), found.runs, found.complete


def depth_first_runs_to_find(fn) -> int | None:
    """Runs the former depth-first enumeration needs to meet the failure (None past DFS_CAP)."""
    prefix: list[int] | None = []
    for i in range(DFS_CAP):
        try:
            res = simulate(fn, WORLD, (), schedule=list(prefix), **OPTS)
        except DistError:
            return i + 1
        prefix = next_schedule(res.choices, res.option_counts)
        if prefix is None:
            return None
    return None


def measure(reps: int, quick: bool) -> dict:
    raw = {}
    max_runs = 60 if quick else 300
    for name, fn in BUGS.items():
        row = {"dfs_runs_to_find": depth_first_runs_to_find(fn)}
        for reduce in (True, False):
            key = "reduced" if reduce else "plain"
            row[key] = {"runs_to_find": runs_to_find(fn, reduce)}
            rates = []
            for _ in range(reps):
                rate, runs, complete = throughput(fn, reduce, max_runs)
                rates.append(rate)
            row[key].update(schedules_per_s=median(rates), runs=runs, complete=complete)
        raw[name] = row
    return raw


def report(raw: dict, reps: int) -> tuple[str, list]:
    rows, verdicts = [], []
    for name, row in raw.items():
        red, plain = row["reduced"], row["plain"]
        ok = all(r["runs_to_find"] is not None and r["runs_to_find"] <= 100 for r in (red, plain))
        verdicts.append((f"{name}: found within 100 runs (bound 1)", verdict(ok)))
        dfs = row["dfs_runs_to_find"]
        rows.append(
            [
                name,
                red["runs_to_find"] or "-",
                plain["runs_to_find"] or "-",
                dfs if dfs is not None else f"> {DFS_CAP}",
                f"{red['schedules_per_s']:.0f}",
                f"{plain['schedules_per_s']:.0f}",
                f"{red['runs']}{' (all)' if red['complete'] else ''}",
                f"{plain['runs']}{' (all)' if plain['complete'] else ''}",
            ]
        )
    table = markdown_table(
        [
            "bug kind (3 ranks)",
            "runs to find, reduced",
            "runs to find, plain",
            "former depth-first",
            "schedules/s, reduced",
            "schedules/s, plain",
            "runs to cover bound 2, reduced",
            "plain",
        ],
        rows,
    )
    text = f"### Bounded exhaustive search (median of {reps})\n\n{table}\n\n" + markdown_table(
        ["target", "verdict"], verdicts
    )
    return text, verdicts


def profile_worst(timer: str, quick: bool) -> str:
    return profile_call(lambda: throughput(BUGS["torch task server"], True, 60 if quick else 300), timer=timer)


def main(argv=None) -> dict:
    return bench_main(__doc__, "search", measure, report, profile_worst, argv)


if __name__ == "__main__":
    main()
