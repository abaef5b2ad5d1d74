"""A collective's messages as discrete events: its algorithm run for every member at once, in one thread.

When the last member of a collective joins it (``detail="messages"``), :func:`run_collective`
runs the collective's algorithm on every member, each a generator on a :class:`_Transport`
of its own, to the end. The members' sends and receives meet in one :class:`Exchange`
(matched by sender, receiver and tag, in the order they were posted); a matched pair moves
its bytes at once and becomes an event at the virtual time it can start. Events are taken
in virtual-time order: each takes the links of its route (:meth:`Topology.transfer`) once
free, so links are shared in the order the bytes reach them, whatever order the members
were simulated in. A member whose step's messages have all completed resumes at the
latest of their times and posts its next step.

On a topology with ``flows`` (:mod:`simdist.core._flows`) a send is an event from its post
instead, matched or not, as the socket backend writes it to its connection at once: the
messages in flight share the links fairly, a pair's messages follow each other, and a send
is done when its bytes have arrived or once the rest fits in ``Topology.send_buffer``.

No scheduling point and no thread hand-off happen inside: the collective is one step of
the run for the scheduler. Its trace rows (each message, each member's part, and with
``record_steps`` each step's snapshot and each receive's step) are those of the algorithm,
written in the order of the events.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import TYPE_CHECKING, Any

from simdist.core import arrays as A
from simdist.core import DistError, RankError
from simdist.core import Flows
from simdist.algorithms import Timed

from ._record import recorded

if TYPE_CHECKING:
    from ._engine import Engine
    from ._messages import CollectiveRun

__all__ = ["Message", "end_run", "run_collective"]
__tracebackhide__ = True  # pytest shows a failure's frames in the user's code, not simdist's


class Message:
    """One send or receive of a collective's algorithm: a handle it yields to wait for.

    ``src``/``dst`` are global ranks; ``waiter`` is the run whose current step waits for it.
    """

    __slots__ = ("arrival", "buf", "chunk", "data", "done", "dst", "kind", "nbytes", "partner", "run", "src", "step",
                 "t_done", "t_post", "tag", "waiter")  # fmt: skip

    def __init__(self, kind: str, src: int, dst: int, tag: int, buf: Any, run: CollectiveRun, chunk: int | None):
        self.kind = kind
        self.src = src
        self.dst = dst
        self.tag = tag
        self.buf = buf
        self.nbytes = buf.nbytes  # (A.nbytes: every array kind says it so)
        self.run = run
        self.step = run.step
        self.chunk = chunk
        self.t_post = run.t
        self.t_done = 0.0
        self.done = False
        self.data: Any = None  # an eager send's copy of its buffer
        self.waiter: CollectiveRun | None = None
        self.partner: Message | None = None  # a send's receive, once matched (``flows``)
        self.arrival: float | None = None  # when a send's bytes arrived (``flows``)

    def describe(self) -> str:
        what = f"send {self.src}->{self.dst}" if self.kind == "send" else f"recv {self.dst}<-{self.src}"
        return f"{what} tag {self.tag} ({self.nbytes} bytes) in {self.run.describe()}"


def run_collective(engine: Engine, runs: list[CollectiveRun]) -> None:
    """Run one collective's algorithm on every member (``runs``, in group-rank order) to the end.

    Each run completes (``engine.complete``) at the virtual time its algorithm ends on it.
    """
    exchange = Exchange(engine, runs[0])
    writers = (engine.events.steps(runs[0]), engine.events.receives(runs[0])) if engine.record_steps else None
    for run in runs:
        transport = _Transport(engine, run, exchange)
        call = run.call
        run.gen = call.start(transport) if writers is None else recorded(call, transport, writers)
    for run in runs:
        exchange.advance(run)
    exchange.flow_shared() if exchange.flows is not None else exchange.flow()
    stuck = [run for run in runs if not run.done]
    if stuck:  # an algorithm that waits for a message no member sends: a bug of the algorithm, not of the program
        left = [m.describe() for queue in (*exchange.sends.values(), *exchange.recvs.values()) for m in queue]
        engine.fail(DistError(f"{stuck[0].describe()}: its algorithm waits for messages never matched: {left[:8]}"))


class Exchange:
    """The messages of one collective: posts waiting for their partner, and matched pairs as timed events."""

    __slots__ = ("copy_", "eager", "engine", "flows", "heap", "inflight", "moved", "n", "recvs", "sends", "topology",
                 "transfer")  # fmt: skip

    def __init__(self, engine: Engine, run: CollectiveRun):
        self.engine = engine
        self.eager = engine.eager_limit
        self.topology = engine.topology
        self.transfer = engine.topology.transfer
        self.flows = Flows(engine.topology) if engine.topology.flows else None
        self.inflight: dict[int, Message] = {}  # (``flows``) sends whose bytes have not all arrived, by key
        self.moved = engine.events.moves(run)  # records each message
        self.copy_ = A.copy_
        self.sends: dict[tuple, deque[Message]] = {}
        self.recvs: dict[tuple, deque[Message]] = {}
        self.heap: list[tuple] = []  # (ready, n, send, receive): matched pairs by the time their bytes can leave
        self.n = 0

    def post(self, m: Message) -> Message:
        """Post ``m``: match it with its partner if that is posted already (the first one posted)."""
        key = (m.src, m.dst, m.tag)
        if m.kind == "send":
            if 0 < self.eager and m.nbytes <= self.eager:  # buffered: the send completes at once
                self._keep(m)
                m.done, m.t_done = True, m.t_post
            waiting, mine = self.recvs, self.sends
            if self.flows is not None:  # its bytes leave now, matched or not (the receiver keeps them until then)
                heapq.heappush(self.heap, (m.t_post, self.n, m))
                self.inflight[self.n] = m
                self.n += 1
        else:
            waiting, mine = self.sends, self.recvs
        queue = waiting.get(key)
        if queue:
            other = queue.popleft()
            if not queue:
                del waiting[key]
            if m.kind == "send":
                self._match(m, other)
            else:
                self._match(other, m)
        else:
            queue = mine.get(key)
            if queue is None:
                mine[key] = deque((m,))
            else:
                queue.append(m)
        return m

    def _match(self, s: Message, r: Message) -> None:
        """Move ``s``'s bytes into ``r``'s buffer; their transfer becomes an event at the time it can start."""
        if s.nbytes != r.nbytes:
            self.engine.fail(DistError(f"message size mismatch: {s.describe()} matched {r.describe()}"))
        self.copy_(r.buf, s.buf if s.data is None else s.data)
        if self.flows is not None:
            s.partner = r
            if s.arrival is not None:  # the bytes came before their receive (its run waits for none of it)
                r.done, r.t_done = True, max(r.t_post, s.arrival)
            return
        ready = s.t_post
        if not s.done and r.t_post > ready:
            ready = r.t_post
        heapq.heappush(self.heap, (ready, self.n, s, r))
        self.n += 1

    def flow(self) -> None:
        """Take the matched transfers in virtual-time order until none is left."""
        heap, pop, transfer, record = self.heap, heapq.heappop, self.transfer, self.moved
        while heap:
            ready, _, s, r = pop(heap)
            start, arrival = transfer(s.src, s.dst, s.nbytes, ready)
            record(s, start, arrival)
            if not s.done:
                self._complete(s, arrival)
            self._complete(r, r.t_post if r.t_post > arrival else arrival)  # noqa: FURB136 - a call per message

    def flow_shared(self) -> None:
        """Take the sends in virtual-time order as flows sharing the links (``Topology.flows``) until none is
        left: each starts when posted and ends when its bytes have passed at its fair share of every link."""
        heap, flows, pop, push = self.heap, self.flows, heapq.heappop, heapq.heappush
        assert flows is not None, "flow_shared is for topologies with flows"
        lines: dict[tuple[int, int], deque[int]] = {}  # (sender, receiver) -> keys of its sends, the moving one first
        kept = self.topology.send_buffer  # bytes of a send the sender's kernel keeps: the send completes before
        while heap or flows:
            t, key, ends = (flows.now, -1, True) if heap and heap[0][0] <= flows.now else flows.next_event()
            if heap and heap[0][0] <= t:
                ready, key, s = pop(heap)
                line = lines.get((s.src, s.dst))
                if line is None:
                    lines[(s.src, s.dst)] = deque((key,))
                elif line[0] != key:  # one connection a pair: its messages move one after another
                    line.append(key)
                    continue
                fits = kept and not s.done and s.nbytes <= kept  # the kernel takes it all: done at once
                mark = kept if kept and not s.done and not fits else None
                later = flows.start(key, s.src, s.dst, s.nbytes, ready, mark)
                if later is not None:
                    push(heap, (later, key, s))
                elif fits:
                    self._written(s, ready)
            elif not ends:
                self._written(self.inflight[key], flows.marked(key))
            else:
                for key, start, end in flows.end_due():
                    s = self.inflight.pop(key)
                    line = lines[(s.src, s.dst)]
                    line.popleft()
                    if line:
                        push(heap, (end, line[0], self.inflight[line[0]]))
                    else:
                        del lines[(s.src, s.dst)]
                    self._arrived(s, start, end)

    def _written(self, s: Message, t: float) -> None:
        """Send ``s`` completes at ``t``: what is left of it fits in its sender's kernel buffer
        (``Topology.send_buffer``); its bytes are kept as they are if its receive is not posted yet."""
        if s.partner is None:
            self._keep(s)
        self._complete(s, t)

    def _keep(self, s: Message) -> None:
        """Keep a copy of send ``s``'s bytes as they are now: its sender may reuse the buffer before they move."""
        s.data = A.empty(s.buf, A.numel(s.buf))
        self.copy_(s.data, s.buf)

    def _arrived(self, s: Message, start: float, end: float) -> None:
        """The last byte of send ``s``, which left at ``start``, passed its route's links at ``end``."""
        topo = self.topology
        if topo.rank_bandwidth is not None or topo.host_bandwidth is not None or topo.host_overhead:
            end = topo._through_shared(s.src, s.dst, s.nbytes, start, end)
        arrival = end + topo.path(s.src, s.dst)[1]
        s.arrival = arrival
        self.moved(s, start, arrival)
        r = s.partner
        if not s.done:
            self._written(s, arrival)
        if r is not None:
            self._complete(r, r.t_post if r.t_post > arrival else arrival)

    def _complete(self, m: Message, t: float) -> None:
        m.done, m.t_done = True, t
        run = m.waiter
        if run is not None:
            m.waiter = None
            run.pending -= 1
            if run.pending == 0:
                self.advance(run)

    def advance(self, run: CollectiveRun) -> None:
        """Resume ``run`` after its step's messages (if any) completed: post its next steps until one must wait."""
        if run.waiting:
            _step_done(run)
        gen = run.gen
        assert gen is not None, "a run's generator is set before it advances"
        while True:
            try:
                handles = next(gen)
            except StopIteration:
                run.waiting, run.gen = [], None  # (a finished part keeps none of its buffers)
                end_run(self.engine, run, run.t)
                return
            except Exception as exc:  # noqa: BLE001 - an algorithm's failure belongs to its rank (Abort is no Exception)
                self.engine.fail(RankError(run.rank, exc))
            run.waiting = handles
            pending = 0
            for m in handles:
                if not m.done:
                    m.waiter = run
                    pending += 1
            if pending:
                run.pending = pending
                return
            _step_done(run)


def _step_done(run: CollectiveRun) -> None:
    """Every message of ``run``'s current step has completed: its clock moves to the latest of their times."""
    t = run.t
    for m in run.waiting:
        if m.t_done > t:
            t = m.t_done
    run.t = t
    run.step += 1


def end_run(engine: Engine, run: CollectiveRun, t: float) -> None:
    """``run`` ended at ``t``: its trace row, and the rank waiting for it may go on."""
    run.call.complete()
    engine.events.collective(run, t)
    engine.complete(run, t)


class _Transport(Timed):
    """The Transport a collective algorithm sees inside the simulator: one member's view of an :class:`Exchange`."""

    __slots__ = ("engine", "exchange", "gid", "me", "rank", "ranks", "run", "size")

    def __init__(self, engine: Engine, run: CollectiveRun, exchange: Exchange):
        self.engine = engine
        self.exchange = exchange
        self.run = run
        self.rank = run.group.rank
        self.size = run.group.size
        self.ranks = run.group.ranks
        self.me = run.rank
        self.gid = run.group.group_id

    def isend(self, buf: Any, peer: int, tag: int = 0, *, chunk: int | None = None) -> Message:
        return self.exchange.post(Message("send", self.me, self.ranks[peer], tag, buf, self.run, chunk))

    def irecv(self, buf: Any, peer: int, tag: int = 0, *, chunk: int | None = None) -> Message:
        return self.exchange.post(Message("recv", self.ranks[peer], self.me, tag, buf, self.run, chunk))

    @property
    def hosts(self) -> tuple | None:
        """The machine of each group rank, where the topology says (``Topology.machine``)."""
        from ._collective_runs import group_state

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
