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

It is given what it needs (the group's state, the topology, the trace recorder, the eager limit) and
changes only the collective's own objects: each member's run ends done, at its time; waking the ranks
that wait for them is the engine's (:meth:`Engine.join`).
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
from ._state import Message

if TYPE_CHECKING:
    from simdist.core import Topology

    from ._events import TraceRecorder
    from ._state import CollectiveRun, GroupState

__all__ = ["end_run", "run_collective"]
__tracebackhide__ = True  # pytest shows a failure's frames in the user's code, not simdist's


def run_collective(
    runs: list[CollectiveRun],
    group: GroupState,
    topology: Topology,
    events: TraceRecorder,
    *,
    eager_limit: int,
    record_steps: bool,
) -> None:
    """Run one collective's algorithm on every member (``runs``, in group-rank order, of ``group``) to the end.

    Each run is done (``done``, ``t_done``) at the virtual time its algorithm ends on it, its trace rows
    written to ``events``; who waits for it is the caller's to wake.

    Raises:
        RankError: a member's algorithm raised (the exception as ``__cause__``).
        DistError: a message's sizes differ at its ends, or the algorithm waits for a message no member sends.
    """
    exchange = Exchange(runs[0], topology, events, eager_limit)
    writers = (events.steps(runs[0]), events.receives(runs[0])) if record_steps else None
    for run in runs:
        transport = _Transport(run, exchange, group)
        call = run.call
        run.gen = call.start(transport) if writers is None else recorded(call, transport, writers)
    for run in runs:
        exchange.advance(run)
    exchange.flow_shared() if exchange.flows is not None else exchange.flow()
    stuck = [run for run in runs if not run.done]
    if stuck:  # an algorithm that waits for a message no member sends: a bug of the algorithm, not of the program
        left = [m.describe() for queue in (*exchange.sends.values(), *exchange.recvs.values()) for m in queue]
        raise DistError(f"{stuck[0].describe()}: its algorithm waits for messages never matched: {left[:8]}")


class Exchange:
    """The messages of one collective: posts waiting for their partner, and matched pairs as timed events."""

    __slots__ = ("copy_", "eager", "events", "flows", "heap", "inflight", "moved", "n", "recvs", "sends", "topology",
                 "transfer")  # fmt: skip

    def __init__(self, run: CollectiveRun, topology: Topology, events: TraceRecorder, eager: int):
        self.events = events
        self.eager = eager
        self.topology = topology
        self.transfer = topology.transfer
        self.flows = Flows(topology) if topology.flows else None
        self.inflight: dict[int, Message] = {}  # (``flows``) sends whose bytes have not all arrived, by key
        self.moved = events.moves(run)  # records each message
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
            raise DistError(f"message size mismatch: {s.describe()} matched {r.describe()}")
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
                end_run(run, run.t, self.events)
                return
            except Exception as exc:  # noqa: BLE001 - an algorithm's failure belongs to its rank (Abort is no Exception)
                raise RankError(run.rank, exc) from exc
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


def end_run(run: CollectiveRun, t: float, events: TraceRecorder) -> None:
    """``run`` ended at ``t``: its outputs are final, its trace row written, and it is done (not yet waking anyone)."""
    run.call.complete()
    events.collective(run, t)
    run.done, run.t_done = True, t


class _Transport(Timed):
    """The Transport a collective algorithm sees inside the simulator: one member's view of an :class:`Exchange`."""

    __slots__ = ("exchange", "group", "me", "rank", "ranks", "run", "size", "topology")

    def __init__(self, run: CollectiveRun, exchange: Exchange, group: GroupState):
        self.exchange = exchange
        self.group = group
        self.topology = exchange.topology
        self.run = run
        self.rank = run.group.rank
        self.size = run.group.size
        self.ranks = run.group.ranks
        self.me = run.rank

    def isend(self, buf: Any, peer: int, tag: int = 0, *, chunk: int | None = None) -> Message:
        return self.exchange.post(Message("send", self.me, self.ranks[peer], tag, buf, self.run, chunk))

    def irecv(self, buf: Any, peer: int, tag: int = 0, *, chunk: int | None = None) -> Message:
        return self.exchange.post(Message("recv", self.ranks[peer], self.me, tag, buf, self.run, chunk))

    @property
    def hosts(self) -> tuple | None:
        """The machine of each group rank, where the topology says (``Topology.machine``)."""
        return self.group.hosts(self.topology)

    def reduced(self, nbytes: int) -> None:
        """Advance the rank's collective clock past a reduction of ``nbytes`` (``Topology.reduce``)."""
        self.run.t = self.topology.reduce(self.me, nbytes, self.run.t)

    def allocated(self, nbytes: int) -> None:
        """Advance the rank's collective clock past first touching a new buffer (``Topology.fresh``, on a core)."""
        self._work(self.topology.fresh(nbytes))

    def copied(self, nbytes: int) -> None:
        """Advance the rank's collective clock past copying ``nbytes`` between its buffers (``Topology.copying``,
        on a core)."""
        self._work(self.topology.copying(nbytes))

    def _work(self, seconds: float) -> None:
        """Advance the rank's collective clock past ``seconds`` of its own work on a free core (none: no wait)."""
        if seconds:
            self.run.t = self.topology.compute(self.me, seconds, self.run.t)

    def wait(self, handles: Any) -> None:
        raise RuntimeError("inside the simulator, algorithms wait by yielding their handles")
