"""Messages that cross a network at the same time, sharing its links as TCP flows do.

A topology with ``flows`` set (:class:`simdist.Topology`) times a collective's messages as
flows: every message in flight moves at a rate, and each link's bandwidth is shared
max-min fairly among the messages crossing it (a message limited elsewhere leaves the rest
of a link to the others). Rates change only when a message starts or ends, so a message's
end is known once no other message starts before it. A link with a ``burst`` passes, when a
message starts, as much of it as every bucket on its route holds in credit at once (a token
bucket earns credit only while its link is idle); the rest of the message is a flow (those
bytes pass the route's links without a bucket at once too: such links are a host's own, far
faster than a shaped one). Links that a flow finds busy from earlier messages timed without
flows (a user's own sends, say) hold it until they are free. A flow may carry a mark, the
bytes left at which it is reported before its end: a send is done once the rest of it fits in
its sender's kernel buffer (``Topology.send_buffer``).
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simdist.core._topology import Topology

__all__ = ["Flows"]

_INF = float("inf")
_DONE = 1e-12  # a flow with this fraction of its bytes left has ended (what rounding leaves of an equal share)
_TINY = 1e-300  # a rate for a flow left no share by rounding: it ends after the others


class _Flow:
    __slots__ = ("a", "b", "key", "links", "mark", "rate", "remaining", "size", "start")

    def __init__(self, key: Any, a: int, b: int, links: tuple[int, ...], remaining: float, start: float):
        self.mark: float | None = None  # bytes left at which to report the flow (None: only its end)
        self.size = remaining
        self.key = key
        self.a = a
        self.b = b
        self.links = links
        self.remaining = remaining
        self.start = start
        self.rate = 0.0


class Flows:
    """The messages in flight on ``topology`` and their fair shares of its links, in virtual time.

    Used in virtual-time order: :meth:`next_event` says when the first flow in flight ends (or
    reaches its mark) if nothing else starts; :meth:`start` a flow at a time no earlier than that,
    or :meth:`end` that flow (:meth:`marked`).
    """

    __slots__ = ("_by_link", "_dirty", "_flows", "_next", "_rates", "now", "topology")

    def __init__(self, topology: Topology):
        self.topology = topology
        self.now = 0.0
        self._flows: dict[Any, _Flow] = {}
        self._by_link: dict[int, set[Any]] = {}  # link -> keys of the flows crossing it
        self._rates: dict[int, tuple[float, float]] = {}  # link -> (bandwidth, burst)
        self._next: tuple[float, int, bool] | None = None
        self._dirty = False  # flows started or ended since the shares were computed

    def __bool__(self) -> bool:
        return bool(self._flows)

    def start(self, key: int, a: int, b: int, nbytes: int, t: float, mark: float | None = None) -> float | None:
        """Start moving ``nbytes`` from rank ``a`` to ``b`` at ``t`` as flow ``key``, to be reported when ``mark``
        bytes are left (if more are at its start); ``None``, or the later time at which the links of its route
        that earlier messages hold are free (start it then instead)."""
        topo = self.topology
        links = () if a == b else (topo._routes.get((a, b)) or topo._route(a, b))[0]
        free, credit = topo._free, topo._credit
        held = max((free[i] for i in links if i not in self._by_link), default=t)
        if held > t:
            return held
        if t > self.now:
            self._refresh()
            self._advance(t)
        buckets = [i for i in links if self._link(i)[1] > 0]
        instant = float(nbytes) if buckets else 0.0
        for i in buckets:  # the bytes every bucket on the route passes at once
            rate, burst = self._link(i)
            have = credit.get(i, 0.0) if i in self._by_link else min(burst, credit.get(i, burst) + (t - free[i]) * rate)
            credit[i] = have
            instant = min(instant, have)
        for i in buckets:
            credit[i] -= instant
        flow = _Flow(key, a, b, links, nbytes - instant if links else 0.0, t)
        flow.mark = mark
        self._flows[key] = flow
        for i in links:
            self._by_link.setdefault(i, set()).add(key)
        self._dirty, self._next = True, None
        return None

    def next_event(self) -> tuple[float, int, bool]:
        """``(time, key, ends)`` of the first thing to happen in flight at the present rates: flow ``key`` ends
        (``ends``) or reaches its mark; ``(inf, -1, True)`` with none in flight."""
        self._refresh()
        if self._next is None:
            best, key, ends = _INF, -1, True
            for flow in self._flows.values():
                left, rate = flow.remaining, flow.rate
                mark = flow.mark
                if mark is not None and left > mark:
                    t = self.now + (left - mark) / rate
                    if t < best:
                        best, key, ends = t, flow.key, False
                    continue
                t = self.now + (left / rate if left > 0 else 0.0)
                if t < best:
                    best, key, ends = t, flow.key, True
            self._next = (best, key, ends)
        return self._next

    def marked(self, key: int) -> float:
        """Flow ``key`` has reached its mark (:meth:`next_event`): the time; it goes on to its end."""
        t, _, _ = self.next_event()
        self._advance(t)
        self._flows[key].mark = None
        self._next = None
        return t

    def end_due(self) -> list[tuple[int, float, float]]:
        """End the flow that :meth:`next_event` gave and every other whose bytes have all passed by then:
        ``(key, start, end)`` of each, by key; links left without flows fall idle."""
        t, first, _ = self.next_event()
        self._advance(t)
        flows, free = self._flows, self.topology._free
        due = sorted(k for k, f in flows.items() if k == first or f.remaining <= _DONE * f.size)
        out = []
        for key in due:
            flow = flows.pop(key)
            for i in flow.links:
                users = self._by_link[i]
                users.discard(key)
                if not users:
                    del self._by_link[i]
                    free[i] = t
            out.append((key, flow.start, t))
        self._dirty, self._next = True, None
        return out

    def _link(self, i: int) -> tuple[float, float]:
        got = self._rates.get(i)
        if got is None:
            topo = self.topology
            u, v = next(link for link, j in topo._link_ids.items() if j == i)
            _, rate, burst = topo._params(u, v)
            got = self._rates[i] = (rate, burst)
        return got

    def _advance(self, t: float) -> None:
        dt = t - self.now
        if dt > 0:
            for flow in self._flows.values():
                flow.remaining -= flow.rate * dt
            self.now = t

    def _refresh(self) -> None:
        """Each flow's rate, if flows started or ended since: max-min fair shares of its links (progressive
        filling). Flows that start or end at one time are shared out once."""
        if not self._dirty:
            return
        self._dirty, self._next = False, None
        flows = self._flows
        if not flows:
            return
        capacity = {i: self._link(i)[0] for i in self._by_link}
        count = {i: len(keys) for i, keys in self._by_link.items()}
        unset = set(flows)
        for flow in flows.values():
            if not flow.links:
                flow.rate = _INF
                unset.discard(flow.key)
        narrowest = [(capacity[i] / n, i) for i, n in count.items()]  # each link's share, the least first
        heapq.heapify(narrowest)
        while unset and narrowest:
            share, i = heapq.heappop(narrowest)
            if not count[i] or share != capacity[i] / count[i]:
                continue  # (a share since changed: its newer entry is in the heap)
            for key in sorted(self._by_link[i] & unset):
                flow = flows[key]
                flow.rate = share if share > 0 else _TINY
                unset.discard(key)
                for j in flow.links:
                    capacity[j] -= share
                    count[j] -= 1
                    if count[j] and j != i:
                        heapq.heappush(narrowest, (capacity[j] / count[j], j))
