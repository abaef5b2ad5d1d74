"""The suite's shared set-up: the helpers in tests/support/ import by name from every folder, and the
whole suite runs on several pytest-xdist workers.

Tests are grouped by concept (core, sim, testing, socket, torch, launch, visualize, app, project);
``python3 -m pytest tests/sim`` runs one folder. tests/programs/ holds whole programs that tests launch.
"""

import os
import sys
from pathlib import Path

import pytest

SUPPORT = str(Path(__file__).resolve().parent / "support")
if SUPPORT not in sys.path:
    sys.path.insert(0, SUPPORT)

MAX_WORKERS = 8


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: without it installed (tests/gpu/run.sh), not called
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """The workers ``-n auto`` (pyproject's addopts) starts: twice the usable cores, at most ``MAX_WORKERS``, for
    the whole suite (``python3 -m pytest``, which may select with ``-k`` or ``-m``); 0 (one process) for a run
    that names files, folders or tests, where ``-n N`` spreads it.

    Twice the cores because many tests wait more than they compute (on rank processes, browsers, sockets,
    timeouts); every test is written for a busy machine.
    """
    if config.args_source is not pytest.Config.ArgsSource.TESTPATHS:
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(2 * cores, MAX_WORKERS)
