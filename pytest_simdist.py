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

import argparse
import re
from typing import Any

OPTIONS: dict[str, Any] = {"replay": None, "max_schedules": None, "test": None, "isolation": None}

_REPLAY = re.compile(
    r"(choices:[A-Za-z0-9_,-]+|random:-?\d+|round_robin|pct:-?\d+:\d+:\d+)(@world=[1-9]\d*)?(@script=[^@]+)?(@test=.+)?",
    re.DOTALL,
)
"""The shape of a replay token (``SCHEDULE[@world=N][@script=NAME][@test=NODEID]``); simdist decodes its choices when
it replays."""


def _max_schedules(text: str) -> int:
    """``--simdist-max-schedules``'s value: a whole number of at least 1 (argparse reports the error as usage)."""
    if not text.strip().isdecimal() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of schedules; expected a whole number >= 1")
    return int(text)


def _replay(text: str) -> str:
    """``--simdist-replay``'s value, if it has a replay token's shape (argparse reports the error as usage)."""
    if not _REPLAY.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a replay token; expected 'random:SEED', 'round_robin', 'pct:SEED:DEPTH:STEPS' or "
            "'choices:...', then optionally @world=N, @script=NAME and @test=NODEID (a token printed by a failing simdist test)"
        )
    return text


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("simdist", "simdist: simulated distributed programs")
    group.addoption(
        "--simdist-replay",
        metavar="TOKEN",
        type=_replay,
        default=None,
        help="replay this schedule (a token printed by a failing simdist test) in every simulated run",
    )
    group.addoption(
        "--simdist-max-schedules",
        metavar="N",
        type=_max_schedules,
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
    OPTIONS["max_schedules"] = config.getoption("simdist_max_schedules")
    OPTIONS["isolation"] = config.getoption("simdist_isolation")


def pytest_runtest_setup(item: Any) -> None:
    item.simdist_outer_test = OPTIONS["test"]  # a test running pytest in-process (pytester) gets its own back
    OPTIONS["test"] = item.nodeid


def pytest_runtest_teardown(item: Any) -> None:
    OPTIONS["test"] = getattr(item, "simdist_outer_test", None)


def pytest_unconfigure(config: Any) -> None:
    OPTIONS.update(replay=None, max_schedules=None, test=None, isolation=None)
