"""Deadlock scenarios for teaching: small programs that deadlock, each with a sentence on why.

``run_scenario(name)`` runs one on the simulator and returns its ``DeadlockError``; the
source of each program is ``inspect.getsource(SCENARIOS[name].fn)``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

import simdist as dist

__all__ = ["Scenario", "SCENARIOS", "run_scenario", "scenario_source"]


def head_to_head(rank):
    dist.init_process_group("gloo")
    t = torch.zeros(4)
    dist.send(t, dst=1 - rank)  # both ranks send first: each send waits for a receive
    dist.recv(t, src=1 - rank)


def cyclic_ring(rank):
    dist.init_process_group("gloo")
    n = dist.get_world_size()
    t = torch.zeros(2)
    dist.send(t, dst=(rank + 1) % n)  # every rank sends to the right before anyone receives
    dist.recv(t, src=(rank - 1) % n)


def skip_collective(rank):
    dist.init_process_group("gloo")
    t = torch.ones(3)
    if rank != 2:  # rank 2 never joins the all_reduce
        dist.all_reduce(t)


def groups_opposite_order(rank):
    dist.init_process_group("gloo")
    a = dist.new_group([0, 1])
    b = dist.new_group([0, 1])
    t = torch.ones(2)
    if rank == 0:
        dist.all_reduce(t, group=a)
        dist.all_reduce(t, group=b)
    elif rank == 1:  # the same two collectives, in the other order
        dist.all_reduce(t, group=b)
        dist.all_reduce(t, group=a)


def tag_mismatch(rank):
    dist.init_process_group("gloo")
    t = torch.zeros(1)
    if rank == 0:
        dist.send(t, dst=1, tag=1)
    else:
        dist.recv(t, src=0, tag=2)  # waits for tag 2; the message has tag 1


def p2p_against_collective(rank):
    dist.init_process_group("gloo")
    t = torch.zeros(1)
    if rank == 0:
        dist.recv(t, src=1)  # waits for rank 1, which is in the barrier waiting for rank 0
        dist.barrier()
    else:
        dist.barrier()
        dist.send(t, dst=0)


@dataclass(frozen=True)
class Scenario:
    """A deadlocking program, its world size, and why it deadlocks."""

    fn: Callable
    world: int
    why: str
    options: dict = field(default_factory=dict)


SCENARIOS: dict[str, Scenario] = {
    "head-to-head sends": Scenario(head_to_head, 2, "Sends are synchronous: each rank's send waits for a receive "
                                   "the other rank only posts after its own send."),
    "send around a ring": Scenario(cyclic_ring, 4, "Every rank sends to its right neighbour first; nobody receives, "
                                   "so the wait-for graph is one cycle through all ranks."),
    "a rank skips a collective": Scenario(skip_collective, 3, "Ranks 0 and 1 wait in all_reduce for rank 2, which "
                                          "finished without calling it."),
    "collectives in opposite orders": Scenario(groups_opposite_order, 2, "Rank 0 enters the collective of group a, "
                                               "rank 1 that of group b: each waits for the other."),
    "tag mismatch": Scenario(tag_mismatch, 2, "A receive matches only a send with its tag; the message waits forever "
                             "unmatched."),
    "point-to-point against a barrier": Scenario(p2p_against_collective, 2, "Rank 0 waits to receive before the "
                                                 "barrier; rank 1 sends only after it."),
}


def run_scenario(name: str, **options: Any) -> Any:
    """The ``DeadlockError`` of scenario ``name`` (run on the simulator with seed 0)."""
    if name not in SCENARIOS:
        raise ValueError(f"name={name!r} is not a scenario; expected one of {sorted(SCENARIOS)}")
    sc = SCENARIOS[name]
    try:
        dist.simulate(sc.fn, sc.world, seed=0, leaks="ignore", **{**sc.options, **options})
    except dist.DeadlockError as err:
        return err
    raise RuntimeError(f"scenario {name!r} did not deadlock")  # a broken scenario, never a user error


def scenario_source(name: str) -> str:
    """The Python source of scenario ``name``'s program."""
    return inspect.getsource(SCENARIOS[name].fn)
