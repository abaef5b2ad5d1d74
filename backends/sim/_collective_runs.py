"""How a collective runs on the simulator: joining, checking, and completing it.

Each rank that calls a collective joins the group's next instance of it
(:func:`start_collective` checks its call against the first rank's): its part is a
:class:`CollectiveRun`. Nothing moves until the last member joins; then the collective
completes in one go, inside that member's call. With ``detail="collectives"`` (or an
instant call) every member ends at a time from the cost model; otherwise the algorithm
runs on every member, message by message, as discrete events (:mod:`._discrete`).

Functions, not an object the engine owns: they take the engine whose state they change
(``groups``, ``coll_counter``), so no reference cycle keeps a finished run's engine from
being freed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simdist import algorithms
from simdist.core import CollectiveMismatchError
from simdist.core import mismatch_error

from ._discrete import end_run, run_collective
from ._messages import CollectiveRun

if TYPE_CHECKING:
    from simdist.algorithms import CollectiveCall

    from ._engine import Engine
    from ._state import RankState
    from ._group import SimGroup

__all__ = ["GroupState", "group_state", "start_collective"]
__tracebackhide__ = True  # pytest shows a failure's frames in the user's code, not simdist's


class GroupState:
    """A group's collectives: how many each rank has joined, and those not every rank has joined yet."""

    __slots__ = ("gid", "ranks", "seq", "instances", "_hosts")

    def __init__(self, gid: int, ranks: tuple[int, ...]):
        self.gid = gid
        self.ranks = ranks
        self.seq = dict.fromkeys(ranks, 0)
        self.instances: dict[int, _Instance] = {}
        self._hosts: tuple | None | bool = False  # not read yet

    def hosts(self, topology: Any) -> tuple | None:
        """The machine of each member where ``topology`` says (``Topology.machine``), else ``None``; read once."""
        if self._hosts is False:
            machines = tuple(topology.machine(r) for r in self.ranks)
            self._hosts = None if None in machines else machines
        return self._hosts  # type: ignore[return-value]


class _Instance:
    """The k-th collective on a group, as the ranks arrive at it."""

    __slots__ = ("seq", "coll_id", "first", "runs")

    def __init__(self, seq: int, coll_id: int, first: tuple[int, CollectiveCall]):
        self.seq = seq
        self.coll_id = coll_id
        self.first = first  # the rank that arrived first, and its call: the others are checked against it
        self.runs: dict[int, CollectiveRun] = {}


def group_state(engine: Engine, gid: int, ranks: tuple[int, ...]) -> GroupState:
    """Group ``gid``'s state in ``engine`` (made on first use, with its member ``ranks``)."""
    gs = engine.groups.get(gid)
    if gs is None:
        gs = engine.groups[gid] = GroupState(gid, ranks)
    return gs


def start_collective(
    engine: Engine, me: RankState, group: SimGroup, call: CollectiveCall, instant: bool = False
) -> CollectiveRun:
    """Join the next collective on ``group``; check it against the other ranks' calls."""
    gs = group_state(engine, group.group_id, group.ranks)
    engine.footprint.add(("group", group.group_id))
    gs.seq[me.rank] += 1
    seq = gs.seq[me.rank]
    inst = gs.instances.get(seq)
    if inst is None:
        inst = gs.instances[seq] = _Instance(seq, engine.coll_counter, (me.rank, call))
        engine.coll_counter += 1
    else:
        _check(engine, inst, me.rank, call, group)
    run = CollectiveRun(call, group, me.rank, seq, inst.coll_id, me.clock)
    inst.runs[group.rank] = run
    at_once = instant or engine.detail == "collectives"
    if not at_once:
        setup = engine.topology.setup(group.size, call.staged, call.copied)  # the check, staging lists
        if setup:
            run.t += setup
    if len(inst.runs) == group.size:
        del gs.instances[seq]
        started = me.cpu() if engine.cpu_time else 0.0
        if at_once:
            _complete_at_once(engine, inst, instant)
        else:
            run_collective(engine, [inst.runs[i] for i in range(group.size)])
        if engine.cpu_time:  # completing every member's part is the simulator's work, not this rank's computation
            me.cpu_mark += me.cpu() - started
    return run


def _check(engine: Engine, inst: _Instance, rank: int, call: CollectiveCall, group: SimGroup) -> None:
    first_rank, first = inst.first
    a, b = (first_rank, first.signature, first.call_site), (rank, call.signature, call.call_site)
    err = mismatch_error(group.group_id, inst.seq, a, b)
    if err is not None:
        engine.fail(err)


def _complete_at_once(engine: Engine, inst: _Instance, instant: bool) -> None:
    runs = [inst.runs[i] for i in range(len(inst.runs))]
    call = runs[0].call
    try:
        algorithms.oneshot.run(call.op, [r.call.args for r in runs])
    except (ValueError, TypeError) as exc:
        engine.fail(CollectiveMismatchError(f"{call.op} #{inst.coll_id}: {exc}"))
    start = max(r.t0 for r in runs)
    cost = 0.0
    if not instant:
        size = len(runs)
        per_machine = None
        if call.algorithm == "hierarchical":  # the only cost that depends on the machines
            group = runs[0].group
            groups = algorithms.machines(group_state(engine, group.group_id, group.ranks).hosts(engine.topology), size)
            per_machine = len(groups[0]) if groups else None
        cost = algorithms.cost(
            call.op, call.algorithm, call.nbytes, size, engine.alpha, engine.beta, engine.gamma, per_machine=per_machine
        )
    for r in runs:
        end_run(engine, r, start + cost)
