"""The GPU suite: skipped, with the reason, where NCCL cannot run (no GPU, no cupy, no CUDA torch).

Run it on a GPU machine with ``bash tests/gpu/run.sh``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS / "support"))  # reference.py, nccl_emulation.py, every_backend.py
sys.path.insert(0, str(TESTS / "core"))  # test_api_collectives.py: the cases test_nccl.py runs on GPUs


def _unavailable() -> str | None:
    from simdist.backends.nccl import nccl_unavailable

    return nccl_unavailable()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _unavailable()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"GPU suite: {reason}")
    for item in items:
        if Path(str(item.fspath)).parent == Path(__file__).parent:
            item.add_marker(skip)
