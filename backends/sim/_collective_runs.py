"""How a collective runs on the simulator: joining, checking, and advancing its algorithm.

Each rank that calls a collective joins the group's next instance of it
(:func:`start_collective` checks its call against the first rank's). With
``detail="collectives"`` (or an instant call) the instance completes at once, when its
last rank joins, at a time from the cost model. Otherwise each rank's part is a
:class:`CollectiveRun`: its algorithm, a generator, posts messages through a
:class:`_Transport` and yields the handles of a step; once they have completed,
``Engine.complete`` queues the run on ``engine.ready`` and :func:`drain` moves it on to
its next step, until the generator ends and the run completes.

Functions, not an object the engine owns: they take the engine whose state they change
(``groups``, ``coll_counter``, ``ready``, ``draining``), so no reference cycle keeps a
finished run's engine from being freed (only a message-level run's transport refers to it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simdist import _arrays as A
from simdist import algorithms
from simdist._errors import CollectiveMismatchError, RankError
from simdist._signatures import mismatch_error
from simdist.algorithms import Timed

from ._messages import CollectiveRun, Post
from ._record import recorded

if TYPE_CHECKING:
    from simdist._algorithmic import CollectiveCall

    from ._engine import Engine, RankState
    from ._group import SimGroup

__all__ = ["GroupState", "drain", "group_state", "start_collective"]
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
    if instant or engine.detail == "collectives":
        if len(inst.runs) == group.size:
            del gs.instances[seq]
            _complete_at_once(engine, inst, instant)
    else:
        if len(inst.runs) == group.size:
            del gs.instances[seq]
        setup = engine.topology.setup(group.size, call.staged, call.copied)  # the check, staging lists
        if setup:
            run.t += setup
        transport = _Transport(engine, run)
        run.gen = recorded(call, transport) if engine.record_steps else call.start(transport)
        engine.ready.append(run)
    return run


def drain(engine: Engine) -> None:
    """Advance every collective run whose messages have completed, until none can move."""
    if engine.draining:
        return
    engine.draining = True
    ready = engine.ready
    try:
        while ready:
            _advance(engine, ready.popleft())
    finally:
        engine.draining = False


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
        _end_run(engine, r, start + cost)


def _advance(engine: Engine, run: CollectiveRun) -> None:
    if run.waiting:
        _step_done(run)
    gen = run.gen
    assert gen is not None, "a run is queued once its generator is set"
    while True:
        try:
            handles = next(gen)
        except StopIteration:
            _end_run(engine, run, run.t)
            return
        except Exception as exc:  # noqa: BLE001 - an algorithm's failure belongs to its rank (Abort is no Exception)
            engine.fail(RankError(run.rank, exc))
        run.waiting = handles
        if not handles:  # a step with nothing to wait for: _step_done, short
            run.step += 1
            continue
        pending = 0
        for h in handles:
            if not h.done:
                h.waiters.append(run)
                pending += 1
        if pending:
            run.pending = pending
            return
        _step_done(run)


def _step_done(run: CollectiveRun) -> None:
    """Every message of ``run``'s current step has completed: advance its clock (steps are recorded by
    :mod:`._record`'s transport)."""
    for h in run.waiting:
        if h.t_done > run.t:
            run.t = h.t_done
    run.step += 1


def _end_run(engine: Engine, run: CollectiveRun, t: float) -> None:
    run.call.complete()
    engine.events.collective(run, t)
    engine.complete(run, t)


class _Transport(Timed):
    """The Transport a collective algorithm sees inside the simulator."""

    __slots__ = ("engine", "run", "rank", "size", "ranks", "me", "gid", "site", "dtype")

    def __init__(self, engine: Engine, run: CollectiveRun):
        self.engine = engine
        self.run = run
        self.rank = run.group.rank
        self.size = run.group.size
        self.ranks = run.group.ranks
        self.me = run.rank
        self.gid = run.group.group_id
        self.site = run.call.call_site
        self.dtype: str | None = None  # the messages' dtype, from the first buffer

    def isend(self, buf: Any, peer: int, tag: int = 0, *, chunk: int | None = None) -> Post:
        return self._post("send", self.me, self.ranks[peer], buf, tag, chunk)

    def irecv(self, buf: Any, peer: int, tag: int = 0, *, chunk: int | None = None) -> Post:
        return self._post("recv", self.ranks[peer], self.me, buf, tag, chunk)

    def _post(self, kind: str, src: int, dst: int, buf: Any, tag: int, chunk: int | None) -> Post:
        """Post this rank's send or receive of ``buf`` at the step the run has reached."""
        if self.dtype is None:
            self.dtype = A.dtype_name(buf)
        run = self.run
        return self.engine.post(
            Post(
                kind,
                src,
                dst,
                run.ctx,
                tag,
                buf,
                A.nbytes(buf),
                self.dtype,
                run.t,
                self.me,
                self.gid,
                self.site,
                run,
                run.step,
                chunk,
            )
        )

    @property
    def hosts(self) -> tuple | None:
        """The machine of each group rank, where the topology says (``Topology.machine``)."""
        return group_state(self.engine, self.gid, self.ranks).hosts(self.engine.topology)

    def reduced(self, nbytes: int) -> None:
        """Advance the rank's collective clock past a reduction of ``nbytes`` (``Topology.reduce``)."""
        self.run.t = self.engine.topology.reduce(self.me, nbytes, self.run.t)

    def allocated(self, nbytes: int) -> None:
        """Advance the rank's collective clock past first touching a new buffer (``Topology.fresh``, on a core)."""
        self._work(self.engine.topology.fresh(nbytes))

    def copied(self, nbytes: int) -> None:
        """Advance the rank's collective clock past copying ``nbytes`` between its buffers (``Topology.copying``,
        on a core)."""
        self._work(self.engine.topology.copying(nbytes))

    def _work(self, seconds: float) -> None:
        """Advance the rank's collective clock past ``seconds`` of its own work on a free core (none: no wait)."""
        if seconds:
            self.run.t = self.engine.topology.compute(self.me, seconds, self.run.t)

    def wait(self, handles: Any) -> None:
        raise RuntimeError("inside the simulator, algorithms wait by yielding their handles")
