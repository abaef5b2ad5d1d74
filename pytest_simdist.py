"""The pytest plugin of simdist (entry point ``pytest11``): command-line options; loading it imports nothing of simdist.

It is a top-level module, outside the ``simdist`` package, so that every pytest run can load it
without importing ``simdist`` (and torch). :mod:`simdist.testing` reads ``OPTIONS`` from here.

``--simdist-replay TOKEN`` makes every simulated run of :mod:`simdist.testing` (``run``,
``explore`` and tests made by ``@spmd``) replay that interleaving; ``--simdist-max-schedules N``
sets how many schedules ``@spmd`` tests and ``explore`` without ``max_runs`` try; ``--simdist-isolation processes`` makes every rank of their runs a process
of its own (``simulate(isolation="processes")``) unless a run says otherwise.

While a test runs, ``OPTIONS["test"]`` holds its node id: the replay tokens of its runs
record it (``...@test=NODEID``), and ``--simdist-replay`` refuses a token made in another test.
"""

from __future__ import annotations

from typing import Any

OPTIONS: dict[str, Any] = {"replay": None, "max_schedules": None, "test": None, "isolation": None}


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("simdist", "simdist: simulated distributed programs")
    group.addoption(
        "--simdist-replay",
        metavar="TOKEN",
        default=None,
        help="replay this schedule (a token printed by a failing simdist test) in every simulated run",
    )
    group.addoption(
        "--simdist-max-schedules",
        metavar="N",
        type=int,
        default=None,
        help="schedules that @simdist.testing.spmd tests and explore() try (default 100)",
    )
    group.addoption(
        "--simdist-isolation",
        choices=("threads", "processes"),
        default=None,
        help="what the ranks of simdist.testing's runs are: threads of the test's process (default) or processes "
        "of their own (their own modules, atexit, crashes)",
    )


def pytest_configure(config: Any) -> None:
    OPTIONS["replay"] = config.getoption("simdist_replay")
    n = config.getoption("simdist_max_schedules")
    if n is not None and n < 1:
        raise ValueError(f"--simdist-max-schedules={n}: expected at least 1")
    OPTIONS["max_schedules"] = n
    OPTIONS["isolation"] = config.getoption("simdist_isolation")


def pytest_runtest_setup(item: Any) -> None:
    item.simdist_outer_test = OPTIONS["test"]  # a test running pytest in-process (pytester) gets its own back
    OPTIONS["test"] = item.nodeid


def pytest_runtest_teardown(item: Any) -> None:
    OPTIONS["test"] = getattr(item, "simdist_outer_test", None)


def pytest_unconfigure(config: Any) -> None:
    OPTIONS.update(replay=None, max_schedules=None, test=None, isolation=None)
