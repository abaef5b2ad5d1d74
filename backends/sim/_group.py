"""The simulator's ProcessGroup, World and Work: thin translations onto the engine."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

from simdist.core import arrays as A
from simdist.algorithms import AlgorithmicGroup, CollectiveCall
from simdist.core import library_call
from simdist.core import GroupMember, Options
from simdist.core import TORCH_NAMES, backend_spec
from simdist.core import Work
from simdist.core import World

from ._buffers import BufferCheck, posted_over
from ._state import Abort, Post, Waitable

if TYPE_CHECKING:
    from ._engine import Engine
    from ._state import RankState

__all__ = ["SimGroup", "SimWorld", "SimWork"]


class SimWork(Work):
    """A work in the simulator; ``wait`` is a scheduling point until the rank has seen the work complete (a
    ``wait`` returned, or ``is_completed()`` answered ``True``); then it returns at once, as in a rank's own
    process, which knows its work completed.

    ``check`` is the buffer check of an asynchronous send or receive (see :mod:`._buffers`):
    settled when the rank learns the operation has completed, at ``wait()`` or at an
    ``is_completed()`` that answers ``True``.
    """

    def __init__(
        self, group: "SimGroup", item: Waitable, what: str, outputs: list, track: bool, check: BufferCheck | None = None
    ):
        self.group = group
        self.item = item
        self.what = what
        self.outs = outputs
        self.key = None
        self.check = check
        self.seen_done = False  # the rank knows it completed: a wait() returned, or is_completed() said so
        if track:
            engine = group.engine
            engine.works_made += 1
            self.key = engine.works_made
            site = getattr(item, "call_site", None) or _site(item)
            engine.unwaited[self.key] = (group.me.rank, f"{what} at {site}")
            if check is not None:
                group.me.world.open_checks[self.key] = check

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the work; with ``timeout`` (seconds of virtual time) raise ``DistTimeoutError`` past it."""
        engine, me = self.group.engine, self.group.me
        if self.key is not None:
            engine.unwaited.pop(self.key, None)
        if not self.seen_done:
            engine.wait(me, [self.item], self.what, None if timeout is None else me.clock + timeout)
            self.seen_done = True
        if self.check is not None:
            self._settle("wait()")
        return True

    def is_completed(self) -> bool:
        if self.check is not None and self.item.done and self.group.engine.current is self.group.me:
            self._settle("is_completed()")
        self.seen_done = self.seen_done or self.item.done
        return self.item.done

    @library_call
    def _settle(self, when: str) -> None:
        """Settle the buffer check (a receive's data lands); a race fails the run on this rank."""
        check, self.check = self.check, None
        self.group.me.world.open_checks.pop(self.key, None)
        race = check.settle(when)
        if race is not None:
            self.group.engine.fail(race)

    def source_rank(self) -> int:
        if not isinstance(self.item, Post) or not self.item.done:
            return super().source_rank()
        return self.item.source

    def _outputs(self) -> list:
        return self.outs


def _site(item: Any) -> str:
    call = getattr(item, "call", None)
    return getattr(call, "call_site", None) or "?"


class SimGroup(AlgorithmicGroup):
    """One rank's handle on a group of simulated ranks."""

    backend = "sim"

    def __init__(self, engine: Engine, me: RankState, rank: int, ranks: Sequence[int], group_id: int):
        super().__init__(rank, ranks, group_id)
        self.engine = engine
        self.me = me
        self.default_algorithms = dict(engine.algorithms)
        if engine.beta > 0:
            self.network = {"alpha": engine.alpha, "beta": engine.beta}
        engine.group(group_id, self.ranks)

    def _hosts(self) -> tuple | None:
        """The machine of each group rank where the topology says, as the socket backend reads its peers'."""
        return self.engine.group(self.group_id, self.ranks).hosts(self.engine.topology)

    def _p2p(self, kind: str, tensor: Any, peer: int | None, opts: Options) -> Work:
        engine, me = self.engine, self.me
        if engine.aborting:
            raise Abort
        src: int | None
        if kind == "send":
            buf, back = None, None  # (staged below, unless a checked send carries the check's copy)
            src, dst = me.rank, self.ranks[peer]
        else:
            buf, back = A.stage_out(tensor)
            src, dst = (None if peer is None else self.ranks[peer]), me.rank
        check = None
        if opts.async_op and me.world.check_buffers:
            if me.world.open_checks:
                race = posted_over(me.world.open_checks, kind, tensor, me.rank, opts.call_site)
                if race is not None:
                    engine.fail(race)
            check = BufferCheck(kind, tensor, buf, back, me.rank, opts.call_site)
            buf, back = check.posted, None
        elif buf is None:
            buf = A.stage_in(tensor)
        p = Post(
            kind,
            src,
            dst,
            ("p", self.group_id),
            opts.tag or 0,
            buf,
            A.nbytes(buf),
            A.dtype_name(buf),
            me.clock,
            me.rank,
            self.group_id,
            opts.call_site,
        )
        p.on_done = back
        engine.post(p)
        work = SimWork(self, p, kind, [tensor], track=bool(opts.async_op), check=check)
        if opts.async_op:
            engine.point(me)
        return work

    def send(self, tensor: Any, dst: int, opts: Options) -> Work:
        return self._p2p("send", tensor, dst, opts)

    def recv(self, tensor: Any, src: int | None, opts: Options) -> Work:
        return self._p2p("recv", tensor, src, opts)

    def _run_collective(self, call: CollectiveCall, opts: Options) -> Work:
        engine, me = self.engine, self.me
        if engine.aborting:
            raise Abort
        run = engine.join(me, self, call)
        work = SimWork(self, run, call.op, call.outputs, track=bool(opts.async_op))
        if opts.async_op:
            engine.point(me)
        return work


class SimWorld(World):
    """The world one simulated rank lives in (one per rank thread).

    ``check_buffers``: whether this rank's asynchronous sends and receives are checked for
    buffer races; ``open_checks`` holds the checks of those not settled yet, by work key.
    """

    def __init__(self, engine: Engine, me: RankState, check_buffers: bool = False):
        self.engine = engine
        self.me = me
        self.rank = me.rank
        self.size = engine.size
        self.groups: list[SimGroup] = []
        self.group_count = 0
        self.check_buffers = check_buffers
        self.open_checks: dict[int, BufferCheck] = {}

    @classmethod
    def spawn(
        cls,
        fn: Callable,
        args: tuple,
        nprocs: int,
        *,
        daemon: bool,
        start_method: str | None,
        backend: str,
        **options: Any,
    ) -> list:
        """The values of ``fn(rank, *args)`` on ``nprocs`` simulated ranks: ``options`` go to :func:`simulate`.

        The ranks are threads that run to completion here, so ``daemon`` and ``start_method`` do not apply.
        """
        # a circle by choice, the one of this package: the registry knows a backend by its World
        # class, whose spawn starts a run, and a run (``simulate``) makes the worlds of its ranks.
        from ._runner import simulate

        return simulate(fn, nprocs, args, **options).values

    def init(self, backend, *, init_method, timeout, world_size, rank, store) -> None:
        if backend is not None and backend not in TORCH_NAMES:
            backend_spec(backend)  # every registered backend binds to the simulator; ValueError listing them
        if world_size not in (None, -1) and world_size != self.size:
            raise ValueError(f"world_size={world_size!r} but this simulation runs {self.size} ranks")
        if rank not in (None, -1) and rank != self.rank:
            raise ValueError(f"rank={rank!r} but this simulated rank is rank {self.rank}")
        self.backend = backend or "sim"
        self.default_group = SimGroup(self.engine, self.me, self.rank, self.engine.world_ranks, 0)
        self.groups = [self.default_group]

    def new_group(self, ranks, *, backend, timeout):
        self.group_count += 1
        gid = self.group_count
        self._sync("new_group", {"op": "new_group", "ranks": tuple(ranks)})
        if self.rank not in ranks:
            return GroupMember.NON_GROUP_MEMBER
        group = SimGroup(self.engine, self.me, ranks.index(self.rank), ranks, gid)
        self.groups.append(group)
        return group

    def _sync(self, op: str, signature: dict) -> None:
        """Wait until every rank of the world reaches the same call (checked like a collective)."""
        from simdist.core import user_call_site

        call = CollectiveCall(
            op=op,
            algorithm="none",
            function=None,
            args=(),
            signature=signature,
            nbytes=0,
            outputs=[],
            call_site=user_call_site(),
        )
        group = self.default_group
        assert isinstance(group, SimGroup), "a sync runs between init_process_group and destroy_process_group"
        run = self.engine.join(self.me, group, call, instant=True)
        self.engine.wait(self.me, [run], op)

    def compute(self, seconds: float, call_site: str, op: str = "compute") -> None:
        """Advance this rank's virtual clock by ``seconds`` of annotated computation (``op`` names it)."""
        me = self.me
        self.engine.events.compute(me.rank, op, me.clock, seconds, call_site)
        me.clock += seconds

    def destroy(self, group) -> None:
        if self.destroy_subgroup(group):
            return
        for g in self.groups:
            g.destroy()
        self.groups = []
        self.default_group = None
        self.backend = None
