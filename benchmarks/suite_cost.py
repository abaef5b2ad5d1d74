"""What each test file of the suite costs: wall seconds, and CPU seconds of pytest's process and of the processes
its tests started (ranks, launchers, browsers), file by file, the dearest first.

    python3 benchmarks/suite_cost.py                  # the whole suite (as `python3 -m pytest` runs it)
    python3 benchmarks/suite_cost.py tests/sim -q     # any pytest arguments
    SIMDIST_COST_TESTS=40 python3 benchmarks/suite_cost.py   # also the 40 dearest tests

CPU seconds, unlike wall seconds, hardly change with what else the machine runs, so they compare runs of
different days. A child's CPU time counts once it has been waited for, which is within its test for every test
of the suite (none leaves a process behind).
"""

from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


class Cost:
    """A pytest plugin: the cost of each test file, summed over its tests' set-up, call and tear-down."""

    def __init__(self) -> None:
        self.files: dict[str, list[float]] = {}
        self.tests: dict[str, list[float]] = {}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        wall, (own, children) = time.perf_counter(), _cpu()
        yield
        own_after, children_after = _cpu()
        cost = (time.perf_counter() - wall, own_after - own, children_after - children)
        for row in (
            self.files.setdefault(item.location[0], [0.0, 0.0, 0.0, 0]),
            self.tests.setdefault(item.nodeid, [0.0, 0.0, 0.0, 0]),
        ):
            row[0] += cost[0]
            row[1] += cost[1]
            row[2] += cost[2]
            row[3] += 1

    def pytest_terminal_summary(self, terminalreporter):
        rows = sorted(self.files.items(), key=lambda kv: -(kv[1][1] + kv[1][2]))
        total = [sum(r[i] for _, r in rows) for i in range(4)]
        write = terminalreporter.write_line
        write("")
        write("| test file | tests | wall s | CPU s (pytest) | CPU s (children) | CPU s |")
        write("|---|---:|---:|---:|---:|---:|")
        for name, (wall, own, children, count) in rows:
            write(f"| {name} | {count} | {wall:.1f} | {own:.1f} | {children:.1f} | {own + children:.1f} |")
        wall, own, children, count = total
        write(f"| all | {count} | {wall:.1f} | {own:.1f} | {children:.1f} | {own + children:.1f} |")
        folders: dict[str, list[float]] = {}
        for name, row in rows:
            folder = "/".join(Path(name).parts[:2])
            acc = folders.setdefault(folder, [0.0, 0.0])
            acc[0] += row[0]
            acc[1] += row[1] + row[2]
        write("")
        write("| folder | wall s | CPU s |")
        write("|---|---:|---:|")
        for folder, (wall, cpu) in sorted(folders.items(), key=lambda kv: -kv[1][1]):
            write(f"| {folder} | {wall:.1f} | {cpu:.1f} |")
        dearest = int(os.environ.get("SIMDIST_COST_TESTS", "0"))
        if dearest:
            write("")
            write(f"| the {dearest} dearest tests | wall s | CPU s (pytest) | CPU s (children) | CPU s |")
            write("|---|---:|---:|---:|---:|")
            tests = sorted(self.tests.items(), key=lambda kv: -(kv[1][1] + kv[1][2]))[:dearest]
            for name, (wall, own, children, _) in tests:
                write(f"| {name} | {wall:.1f} | {own:.1f} | {children:.1f} | {own + children:.1f} |")


def main() -> int:
    sys.path.insert(0, str(ROOT))  # as `python3 -m pytest` started at the root has it
    os.chdir(ROOT)
    # -n 0: in this one process (the suite's own run spreads over workers, whose tests this plugin would not see)
    return pytest.main(["-p", "no:cacheprovider", "-n", "0", *sys.argv[1:]], plugins=[Cost()])


if __name__ == "__main__":
    raise SystemExit(main())
