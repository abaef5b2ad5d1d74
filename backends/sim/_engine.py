"""The simulator's engine: rank threads, one baton, point-to-point matching, collectives, virtual time.

Exactly one rank thread runs at a time (one of all the simulations running in the
process: a rank also waits for its turn, see :mod:`._isolation`). At every scheduling
point the running rank posts what it wants, the engine completes whatever that makes
possible (matches messages; completes a collective once its last member joins), then the
strategy picks the next runnable rank and the baton moves to it. No wall clock, OS
scheduling or hash ordering enters a choice: a run is a function of the program and its
choice list.

The engine owns the run's state (its data types: :mod:`._state`) and is the only code that
changes it. What it calls is given what it needs and calls nothing back: the rank hooks
(:class:`._isolation.ThreadRanks`, or ``ProcessRanks`` for ranks as processes), a collective's
messages as discrete events (:mod:`._discrete`), the deadlock report (:mod:`._report`), the
trace recorder (:mod:`._events`) and the strategy. Above it, the groups of each rank
(:mod:`._group`) translate the API into :meth:`Engine.post`, :meth:`Engine.join` and
:meth:`Engine.wait`.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, NoReturn

from simdist import algorithms, torch_bridge
from simdist.core import arrays as A
from simdist.core import CollectiveMismatchError, DistError, DistTimeoutError, RankError, add_note
from simdist.core import Trace
from simdist.core import mismatch_error, set_thread_world

from . import _threads
from ._discrete import end_run, run_collective
from ._events import TraceRecorder
from ._isolation import ThreadRanks
from ._report import deadlock_error
from ._state import WAKE_FDS, Abort, CollectiveRun, GroupState, Joining, Post, RankState, Settings, Waitable
from ._strategies import Hooks

if TYPE_CHECKING:
    from simdist.algorithms import CollectiveCall
    from simdist.core import ProcessGroup

__all__ = ["Engine", "Abort", "RankState"]
__tracebackhide__ = True  # pytest shows a failure's frames in the user's code, not simdist's

STOP_WAIT = 10.0
"""Seconds an interrupted or timed-out run waits at most for its rank threads to stop."""
RETRY = 0.05
"""Seconds between two injections of ``Abort`` into a rank that stays in user code (it may catch it)."""


class Engine:
    """One simulated run of ``fn(rank, *args)`` on ``settings.size`` rank threads.

    ``make_world(engine, rank_state)`` makes each rank's world (a ``SimWorld``); ``hooks`` make a rank
    thread behave like a process (default :class:`ThreadRanks`; ``ProcessRanks`` for ranks as processes);
    ``pool`` holds the threads to run the ranks on (``None``: a new thread per rank).
    """

    def __init__(
        self,
        fn: Callable,
        args: tuple,
        settings: Settings,
        *,
        strategy,
        topology,
        make_world: Callable,
        pool: _threads.RankPool | None = None,
        hooks: Any = None,
    ):
        size = settings.size
        self.fn, self.args, self.size = fn, args, size
        self.settings = settings
        self.iso = ThreadRanks(settings) if hooks is None else hooks
        self.strategy = strategy
        self.topology = topology
        self.detail = settings.detail
        self.eager_limit = settings.eager_limit
        self.cpu_time = settings.cpu_time
        self.algorithms = dict(settings.algorithms)
        self.pool = pool
        self.world_ranks = tuple(range(size))  # the default group's ranks, one tuple shared by every rank's group
        self.ranks = [RankState(r, size <= WAKE_FDS, settings.capture_output) for r in self.world_ranks]
        for rs in self.ranks:
            rs.world = make_world(self, rs)
        self.runnable: list[int] = list(range(size))
        self.current: RankState | None = None
        self.choices: list[int] = []
        self.widths: list[int] = []
        self.points = 0
        self.footprint: set = set()  # what the running rank touched since the last selection (see Strategy.observe)
        self.hooks = Hooks(strategy)
        self.trace = Trace(meta={"world_size": size, "detail": self.detail, "topology": topology.name})
        self.events = TraceRecorder(self.trace)  # every event of the run is written through it
        self.sends: dict[tuple, dict[int, deque]] = {}
        self.recvs: dict[tuple, list[Post]] = {}
        self.groups: dict[int, GroupState] = {}
        self.coll_counter = 0
        self.unwaited: dict[int, tuple[int, str]] = {}
        self.works_made = 0
        self.error: BaseException | None = None
        self.aborting = False
        self.ended = threading.Event()  # set once no rank thread of the run runs engine or user code
        self.stopped = False  # the run was aborted from outside and its rank threads have ended (or are stuck)
        self.alpha, self.beta = topology.alpha_beta()
        self.gamma = topology.gamma

    # --- running -------------------------------------------------------------------

    def run(self) -> list:
        """Run every rank to the end; return their values or raise the run's error.

        A timeout, or any exception in the caller while it waits (``KeyboardInterrupt``),
        stops the run: every rank thread has ended before this raises.
        """
        self.iso.enter()
        try:
            try:
                self.topology.reset()
                self._handover(self._select(None))
                if not self.ended.wait(self.settings.timeout):
                    self._time_out()
                self._join(STOP_WAIT)
            except BaseException as exc:
                if not self.stopped:  # (a timeout has stopped it)
                    stuck = self._stop()
                    if stuck:
                        add_note(exc, stuck)
                raise
        finally:
            self.iso.leave()
            for rs in self.ranks:
                if not rs.started:  # (the others' threads close theirs)
                    rs.close()
            if isinstance(self.error, DistError):
                self.error.choices = list(self.choices)
        if self.error is not None:
            raise self.error
        return [rs.value for rs in self.ranks]

    def _join(self, limit: float) -> None:
        for rs in self.ranks:
            if rs.thread is not None:
                rs.thread.join(limit)
        if self.pool is None:  # (a pool's threads live on, parked, until it is closed)
            _threads.wait_ended(rs.thread for rs in self.ranks if rs.thread is not None)

    def _time_out(self) -> None:
        """Stop a run that has not finished within ``timeout`` and raise ``DistTimeoutError``."""
        running = self.current.rank if self.current else "?"
        if any(rs.user.inside for rs in self.ranks) or not self.current or not self.current.started:
            why = (
                f"rank {running} was running (a loop that never reaches a simdist call, or a call that blocks "
                "outside simdist)"
            )
        else:
            why = (
                f"rank {running} was waiting for its turn: a rank of another simulation in this process did not "
                "reach a scheduling point"
            )
        stuck = self._stop()
        raise DistTimeoutError(
            f"the simulation did not finish within timeout={self.settings.timeout} s of real time; {why}"
            + (f"; {stuck}" if stuck else "; its rank threads were stopped")
        )._with_schedule(self.token())

    def _stop(self) -> str:
        """Abort the run and wait (at most ``STOP_WAIT``) for its rank threads to end; what is stuck, or ``""``.

        Ranks blocked at a scheduling point raise ``Abort`` there as the abort reaches them; a
        rank running user code gets ``Abort`` injected, again every ``RETRY`` seconds until it
        leaves user code. A rank blocked in C code gets it only when it returns to Python: past
        the bound its run gives up the turn for it (other simulations go on) and leaves it.
        An exception in the caller meanwhile (Ctrl-C again) is raised once the threads are stopped.
        """
        self.aborting = True
        deadline = time.monotonic() + STOP_WAIT
        again = None
        while True:
            try:
                stuck = self._stop_by(deadline)
                break
            except BaseException as exc:  # noqa: BLE001 - raised below, once the rank threads are stopped
                again = exc
        self.stopped = True
        if again is not None:
            if stuck:
                add_note(again, stuck)
            raise again
        return stuck

    def _stop_by(self, deadline: float) -> str:
        while not self.ended.is_set():
            for rs in self.ranks:
                rs.user.inject(Abort)
            if self.ended.wait(RETRY):
                break
            if time.monotonic() > deadline:
                self.iso.abandon(self.ranks)
                left = [rs.rank for rs in self.ranks if rs.started and not rs.done]
                return (
                    f"rank thread(s) {left} did not stop within {STOP_WAIT} s (blocked in code that does not "
                    "return to Python) and are left running, without the turn"
                )
        self._join(max(deadline - time.monotonic(), RETRY))
        return ""

    def release(self) -> None:
        """Drop the ranks' worlds, so that the run's objects are freed as soon as nothing else refers to them.

        A rank's world refers to the engine, which refers to the rank: left so, the objects of a run
        (about a hundred per rank) wait for the garbage collector's next full pass, which at thousands
        of ranks costs more than the run. (A message-level collective's posts and its run refer to each
        other and keep their group, so those wait for the collector still.) Called once the results are
        taken; a run with a rank thread still running (stuck in C code past a timeout) keeps them.
        """
        if all(rs.done or not rs.started for rs in self.ranks):
            for rs in self.ranks:
                rs.world = None

    def stream_trace(self, path: Any) -> None:
        """Write the run's trace to ``path`` as the run goes (:class:`Trace`'s ``stream``; before :meth:`run`)."""
        self.trace = Trace(meta=self.trace.meta, stream=path)
        self.events = TraceRecorder(self.trace)

    def now(self, rs: RankState) -> float:
        """Rank ``rs``'s virtual time in seconds (with ``cpu_time``, plus its CPU time since its last switch)."""
        return rs.now(self.cpu_time and rs is self.current)

    def token(self) -> str:
        from ._strategies import encode_choices, make_token

        choices = self.strategy.token() or encode_choices(self.choices)
        return make_token(choices, self.size, self.settings.test, self.settings.script)

    def _thread_main(self, rs: RankState) -> None:
        self.iso.take_turn(rs, self.aborting)
        try:
            set_thread_world(rs.world)
            self.iso.enter_thread(rs, partial(rs.now, self.cpu_time))  # (called only while the rank runs)
            try:
                failure = self._call_user(rs)
                if failure is not None and isinstance(self.iso, ThreadRanks):
                    torch_bridge.ranks.note_shared_state(failure)  # while the rank's torch world is still its own
            finally:
                self.iso.leave_thread(rs)
                set_thread_world(None)
            if failure is not None and not self.aborting:
                self._set_error(RankError(rs.rank, failure))
        finally:
            self.iso.end_turn(rs, done=True)
            self._finish(rs)
            rs.close()

    def _call_user(self, rs: RankState) -> BaseException | None:
        """Run rank ``rs``'s function on its thread: the exception it raised, or ``None`` (it returned, or was aborted).

        Nothing injected into the thread is pending once this returns.
        """
        user = rs.user
        user.ident = threading.get_ident()
        failure = None
        try:
            try:
                if self.aborting:
                    raise Abort
                user.inside = True
                rs.value = self.fn(rs.rank, *self.args)
            finally:
                user.inside = False  # first (a plain assignment): no Abort is injected from here on
        except Abort:
            pass
        except BaseException as exc:  # noqa: BLE001 - a rank's failure is the run's result
            failure = exc
        try:  # at most two injected Aborts may still arrive: see Interruptible
            user.settle()
        except Abort:
            try:
                user.settle()
            except Abort:
                user.settle()
        return failure

    def _set_error(self, err: BaseException) -> None:
        if self.error is None:
            if isinstance(err, DistError):
                err._with_schedule(self.token())
            self.error = err
        self.aborting = True

    def fail(self, err: BaseException) -> NoReturn:
        """Record ``err`` as the run's error and unwind the calling rank."""
        self._set_error(err)
        raise Abort

    def _finish(self, rs: RankState) -> None:
        rs.done = True
        self._unrun(rs.rank)
        if self.cpu_time:
            rs.clock += rs.cpu() - rs.cpu_mark
        if self.aborting:
            self._continue_abort()
            return
        nxt = self._select(None)
        if nxt is None and self._expire():
            nxt = self._select(None)
        if nxt is not None:
            self._handover(nxt)
        elif all(r.done for r in self.ranks):
            self.current = None
            self.ended.set()
        else:
            self._set_error(self._deadlock())
            self._continue_abort()

    def _continue_abort(self) -> None:
        for rs in self.ranks:
            if rs.started and not rs.done and not rs.released:
                rs.released = True
                self.current = rs
                rs.wake()
                return
        self.current = None
        self.ended.set()

    def _handover(self, nxt: RankState) -> None:
        """Pass the baton to ``nxt`` (it then waits for its turn: see :mod:`._isolation`)."""
        self.current = nxt
        if nxt.started:
            nxt.wake()
        elif self.pool is not None:
            nxt.started = True
            nxt.thread = self.pool.start(nxt.rank, partial(self._thread_main, nxt))
        else:
            nxt.started = True
            nxt.thread = threading.Thread(
                target=self._thread_main, args=(nxt,), name=f"simdist-rank-{nxt.rank}", daemon=True
            )
            nxt.thread.start()

    # --- scheduling ------------------------------------------------------------------

    def _unrun(self, rank: int) -> None:
        i = bisect.bisect_left(self.runnable, rank)
        if i < len(self.runnable) and self.runnable[i] == rank:
            del self.runnable[i]

    def _select(self, me: RankState | None) -> RankState | None:
        runnable = self.runnable
        hooks = self.hooks
        if hooks.observe is None:
            self.footprint.clear()  # (no strategy looks at it)
        else:
            hooks.observe(None if self.current is None else self.current.rank, self.footprint, runnable)
            self.footprint = set()
        n = len(runnable)
        if n == 0:
            return None
        if n == 1:
            return self.ranks[runnable[0]]
        if me is not None and not me.done and me.pending == 0:
            options = [me.rank] + [r for r in runnable if r != me.rank]
        else:
            options = runnable
        c = hooks.pick(n, options, me.rank if me is not None else None)
        self.choices.append(c)
        self.widths.append(n)
        if hooks.chose is not None:
            hooks.chose(self, "run", options, c, me)
        return self.ranks[options[c]]

    def point(self, me: RankState) -> None:
        """A scheduling point of the running rank ``me``: maybe hand the baton to another rank.

        No ``Abort`` is injected into ``me`` in here: one that was is delivered on the way in.
        """
        me.user.inside = False
        try:
            me.user.settle()
            self._point(me)
        finally:
            me.user.inside = True  # back in user code, whether by returning or by raising

    def _point(self, me: RankState) -> None:
        self.points += 1
        if self.aborting:
            raise Abort
        if self.cpu_time:
            me.clock += me.cpu() - me.cpu_mark
        nxt = self._select(me)
        if nxt is None and self._expire():
            nxt = self._select(me)
        if nxt is None:
            self.fail(self._deadlock())
        if nxt is not me:
            self.iso.end_turn(me, nxt)
            self._handover(nxt)
            me.sleep()
            self.iso.take_turn(me, self.aborting)
            if self.aborting:
                raise Abort
        if self.cpu_time:
            me.cpu_mark = me.cpu()

    def wait(self, me: RankState, items: list[Waitable], what: str, deadline: float | None = None) -> None:
        """Block ``me`` until every item has completed (a scheduling point); advance its clock.

        With a ``deadline`` (virtual time) the wait raises ``DistTimeoutError`` when its items
        complete after it, or when no rank can run and this is the earliest deadline of the
        blocked ranks: a timeout, not a deadlock.
        """
        pending = [it for it in items if not it.done]
        if deadline is not None:
            self.footprint.add(("time",))  # a timeout depends on every rank's progress
        if pending:
            me.pending = len(pending)
            me.blocked = (what, pending)
            me.deadline = deadline
            for it in pending:
                it.waiters.append(me)
            self._unrun(me.rank)
        start = me.clock
        self.point(me)
        me.blocked, me.deadline = None, None
        if not me.expired:
            for it in items:
                if it.t_done > me.clock:
                    me.clock = it.t_done
        if deadline is not None and (me.expired or me.clock > deadline):
            me.expired, me.clock = False, max(deadline, start)
            raise DistTimeoutError(
                f"rank {me.rank}: {what} did not complete within its timeout of {deadline - start:.6g} s (virtual time)"
            )

    def _expire(self) -> bool:
        """Let the blocked rank with the earliest deadline run again, its wait timed out; whether there was one."""
        timed = [rs for rs in self.ranks if rs.deadline is not None and rs.pending > 0 and not rs.done]
        if not timed:
            return False
        rs = min(timed, key=lambda r: (r.deadline, r.rank))
        self.footprint.add(("time",))
        for it in rs.blocked[1] if rs.blocked else ():
            if rs in it.waiters:
                it.waiters.remove(rs)
        rs.pending, rs.expired, rs.deadline = 0, True, None
        bisect.insort(self.runnable, rs.rank)
        return True

    def complete(self, item: Waitable, t_done: float) -> None:
        """``item`` completed at ``t_done``: the ranks waiting only for it may run."""
        item.done = True
        item.t_done = t_done
        self._wake(item)

    def _wake(self, item: Waitable) -> None:
        """``item`` is done: each rank blocked on it waits for one item fewer (runnable once none is left)."""
        waiters = item.waiters
        if waiters:
            item.waiters = []
            for w in waiters:
                w.pending -= 1
                if w.pending == 0:
                    bisect.insort(self.runnable, w.rank)

    def unmatched(self) -> list[Post]:
        """The program's sends, then receives, still waiting for their partner."""
        posts = [p for by_src in self.sends.values() for q in by_src.values() for p in q]
        return posts + [p for waiting in self.recvs.values() for p in waiting]

    def _deadlock(self) -> DistError:
        return deadlock_error(self.ranks, self.groups, self.unmatched(), self.token())

    # --- collectives -------------------------------------------------------------------

    def group(self, gid: int, ranks: tuple[int, ...]) -> GroupState:
        """Group ``gid``'s state (made on first use, with its member ``ranks``)."""
        gs = self.groups.get(gid)
        if gs is None:
            gs = self.groups[gid] = GroupState(gid, ranks)
        return gs

    def join(self, me: RankState, group: ProcessGroup, call: CollectiveCall, instant: bool = False) -> CollectiveRun:
        """Rank ``me`` joins the next collective on ``group`` (its ``SimGroup``): its part, checked against the first
        member's call. The last member to join completes it, for every member, before this returns: at once
        (``detail="collectives"``, or ``instant``: no cost) or message by message (:mod:`._discrete`)."""
        gs = self.group(group.group_id, group.ranks)
        self.footprint.add(("group", group.group_id))
        gs.seq[me.rank] += 1
        seq = gs.seq[me.rank]
        joining = gs.instances.get(seq)
        if joining is None:
            joining = gs.instances[seq] = Joining(seq, self.coll_counter, (me.rank, call))
            self.coll_counter += 1
        else:
            first_rank, first = joining.first
            a, b = (first_rank, first.signature, first.call_site), (me.rank, call.signature, call.call_site)
            err = mismatch_error(group.group_id, seq, a, b)
            if err is not None:
                self.fail(err)
        run = CollectiveRun(call, group, me.rank, seq, joining.coll_id, me.clock)
        joining.runs[group.rank] = run
        at_once = instant or self.detail == "collectives"
        if not at_once:
            setup = self.topology.setup(group.size, call.staged, call.copied)  # the check, staging lists
            if setup:
                run.t += setup
        if len(joining.runs) == group.size:
            del gs.instances[seq]
            runs = [joining.runs[i] for i in range(group.size)]
            started = me.cpu() if self.cpu_time else 0.0
            try:
                if at_once:
                    self._complete_at_once(runs, gs, instant)
                else:
                    run_collective(
                        runs,
                        gs,
                        self.topology,
                        self.events,
                        eager_limit=self.eager_limit,
                        record_steps=self.settings.record_steps,
                    )
            except DistError as err:  # (its traceback is simdist's: the run's error shows the ranks' own)
                self.fail(err.with_traceback(None))
            for r in runs:
                self._wake(r)
            if self.cpu_time:  # completing every member's part is the simulator's work, not this rank's computation
                me.cpu_mark += me.cpu() - started
        return run

    def _complete_at_once(self, runs: list[CollectiveRun], gs: GroupState, instant: bool) -> None:
        call = runs[0].call
        try:
            algorithms.oneshot.run(call.op, [r.call.args for r in runs])
        except (ValueError, TypeError) as exc:
            raise CollectiveMismatchError(f"{call.op} #{runs[0].coll_id}: {exc}") from None
        start = max(r.t0 for r in runs)
        cost = 0.0
        if not instant:
            size = len(runs)
            per_machine = None
            if call.algorithm == "hierarchical":  # the only cost that depends on the machines
                groups = algorithms.machines(gs.hosts(self.topology), size)
                per_machine = len(groups[0]) if groups else None
            cost = algorithms.cost(
                call.op, call.algorithm, call.nbytes, size, self.alpha, self.beta, self.gamma, per_machine=per_machine
            )
        for r in runs:
            end_run(r, start + cost, self.events)

    # --- point to point --------------------------------------------------------------

    def post(self, p: Post) -> Post:
        """Post a send or a receive; match it if its partner is waiting."""
        key = (p.ctx, p.dst, p.tag)
        if self.hooks.observe is not None:  # (no strategy looks at footprints otherwise)
            self.footprint.add(key)
        if p.kind == "send":
            eager = self.eager_limit
            if eager > 0 and p.nbytes <= eager:
                p.data = A.empty(p.buf, A.numel(p.buf))
                A.copy_(p.data, p.buf)
                self._finish_post(p, p.t_post)
            waiting = self.recvs.get(key)
            if waiting:
                src = p.src
                for i, r in enumerate(waiting):
                    if r.src is None or r.src == src:
                        del waiting[i]
                        if not waiting:  # (keys differ per collective and tag: keep none that are empty)
                            del self.recvs[key]
                        self._match(p, r)
                        return p
            by_src = self.sends.get(key)
            if by_src is None:
                self.sends[key] = {p.src: deque((p,))}
            else:
                queue = by_src.get(p.src)
                if queue is None:
                    by_src[p.src] = deque((p,))
                else:
                    queue.append(p)
            return p
        by_src = self.sends.get(key)
        if by_src:
            if p.src is not None:
                queue = by_src.get(p.src)
                if queue:
                    self._match(self._take(key, by_src, p.src), p)
                    return p
            else:
                senders = sorted(by_src)
                if senders:
                    pick = 0
                    if len(senders) > 1:
                        pick = self.strategy.pick_match(len(senders)) % len(senders)
                        self.choices.append(pick)
                        self.widths.append(len(senders))
                        self.strategy.chose(self, "match", senders, pick, p)
                    self._match(self._take(key, by_src, senders[pick]), p)
                    return p
        waiting = self.recvs.get(key)
        if waiting is None:
            self.recvs[key] = [p]
        else:
            waiting.append(p)
        return p

    def _take(self, key: tuple, by_src: dict[int, deque], src: int) -> Post:
        """The first send from ``src`` queued under ``key``, dequeued (dropping queues left empty)."""
        queue = by_src[src]
        s = queue.popleft()
        if not queue:
            del by_src[src]
            if not by_src:
                del self.sends[key]
        return s

    def _match(self, s: Post, r: Post) -> None:
        if s.nbytes != r.nbytes or s.dtype != r.dtype:
            self.fail(
                DistError(
                    f"message size mismatch: {s.describe()} matched {r.describe()}; a send and its receive "
                    "must have the same dtype and number of elements"
                )
            )
        A.copy_(r.buf, s.buf if s.data is None else s.data)
        ready = s.t_post
        if not s.done and r.t_post > ready:
            ready = r.t_post
        start, arrival = self.topology.transfer(s.src, s.dst, s.nbytes, ready)
        r.source = s.src
        self.events.message(s, start, arrival)
        done = r.t_post if r.t_post > arrival else arrival  # noqa: FURB136 - max() costs a call per message
        if not s.done:
            self._finish_post(s, arrival)
        self._finish_post(r, done)

    def _finish_post(self, p: Post, t: float) -> None:
        p.t_done = t
        if p.on_done is not None:
            p.on_done()
        self.events.span(p, t)  # its span on the rank's lane
        self.complete(p, t)
