"""Rank programs for the fast-failure and hang-diagnosis tests, one process per rank.

``python tests/support/failing_ranks.py SCENARIO`` runs one rank of a socket job (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, SIMDIST_SECRET, SIMDIST_TIMEOUT from the environment). Every
rank prints JSON lines on stdout: ``{"rank", "event", "t", ...}`` with ``t`` the wall clock
(the processes share one host), so the test can measure how long the others took to notice.

Scenarios (rank 1 is the one that fails):

* ``raise``, ``exit``, ``kill``: rank 1 raises ``ValueError("boom")`` / calls ``os._exit(3)``
  / SIGKILLs itself before its first collective; the others all_reduce.
* ``recv``: the others wait in ``recv(src=1)``; rank 1 raises.
* ``store``: the others wait in ``store.get("ready/1")``, a key rank 1 would set; rank 1 raises.
* ``goodbye``: everyone all_reduces once; then rank 1 SIGKILLs itself while the others are
  in ``destroy_process_group``.
* ``sleep``: every rank runs 60 all_reduces; rank 1 then sleeps, the others enter #61 and
  time out (SIMDIST_TIMEOUT is short here).

``raise_before_first_collective`` is the same failure for ``simdist.spawn``; run as a script
with the word ``script``, the same failure for ``simdist run``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch

import simdist as dist
from simdist.core._world import current_world


def emit(**fields) -> None:
    print(json.dumps({"rank": int(os.environ["RANK"]), "t": time.time(), **fields}), flush=True)


def fail(how: str) -> None:
    emit(event="fail")
    if how == "exit":
        os._exit(3)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise ValueError("boom")


def main(scenario: str) -> None:
    if scenario == "script":
        raise_before_first_collective(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), 0)
        return
    if scenario == "no-destroy":
        leave_without_destroy()
        return
    dist.init_process_group("socket")
    rank = dist.get_rank()
    emit(event="ready")
    try:
        if scenario == "sleep":
            for _ in range(60):
                dist.all_reduce(torch.ones(4))
            if rank == 1:
                emit(event="sleep")
                time.sleep(120)
            emit(event="wait")
            dist.all_reduce(torch.ones(4))
        elif scenario == "goodbye":
            dist.all_reduce(torch.ones(4))
            if rank == 1:
                time.sleep(1.0)  # the others are in their goodbye by now
                fail("kill")
            emit(event="wait")
        elif rank == 1:
            fail({"exit": "exit", "kill": "kill"}.get(scenario, "raise"))
        else:
            emit(event="wait")
            if scenario == "recv":
                dist.recv(torch.zeros(4), src=1)
            elif scenario == "store":
                current_world().store.get("ready/1")
            else:
                dist.all_reduce(torch.ones(4))
    except dist.DistError as exc:
        emit(event="error", type=type(exc).__name__, text=str(exc), failed=getattr(exc, "rank", None))
        raise
    finally:
        destroy()
    emit(event="done")


def destroy() -> None:
    """``destroy_process_group``, its error (if any) printed as an event first."""
    try:
        dist.destroy_process_group()
    except dist.DistError as exc:
        emit(event="destroy-error", type=type(exc).__name__, text=str(exc), failed=getattr(exc, "rank", None))
        raise


def leave_without_destroy() -> None:
    """Rank 1 sends rank 0 a tensor and its script ends without destroy_process_group (torch allows
    that); rank 0 receives it a second later, then destroys the group: nobody fails."""
    dist.init_process_group("socket")
    rank = dist.get_rank()
    emit(event="ready")
    t = torch.full((1 << 20,), float(rank))
    if rank == 1:
        dist.send(t, dst=0)
    elif rank == 0:
        time.sleep(1.0)
        dist.recv(t, src=1)
        emit(event="received", value=t.sum().item())
    if rank != 1:
        destroy()
    emit(event="done")


def raise_before_first_collective(rank: int, world_size: int, failing: int) -> None:
    """For ``simdist.spawn``: rank ``failing`` raises ``ValueError("boom")`` before its first collective."""
    dist.init_process_group("socket")
    try:
        if rank == failing:
            raise ValueError("boom")
        dist.all_reduce(torch.ones(4))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
