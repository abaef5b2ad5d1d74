"""Network topologies and the cost of a message on them.

A topology is an undirected networkx graph. Ranks are the integer nodes ``0 .. n-1``;
other nodes (switches) are strings. Every edge carries ``alpha`` (seconds of latency)
and ``bandwidth`` (bytes per second). Each direction of a link carries one message at
a time, so messages that share a link queue behind each other (contention).

A message of ``n`` bytes from ``a`` to ``b`` follows the shortest path (in hops). It
starts when it is ready and every link of the path is free, occupies those links for
``n / min(bandwidth)`` seconds, and arrives ``sum(alpha) + n / min(bandwidth)``
seconds after it starts (cut-through, as on a switched network).

A link may also carry ``burst``, bytes that it passes at once after being idle: a token
bucket, as a shaped link (``tc ... tbf``) or a cloud VM's network allowance works. The bucket
holds up to ``burst`` bytes of credit and earns ``bandwidth`` bytes a second while it is not
full; a message that finds ``T`` bytes of credit occupies the link ``(n - T) / bandwidth``
seconds instead of ``n / bandwidth`` (none while ``n <= T``), and spends that credit. With
``burst`` 0 (the default) a link is the plain one above.

A topology with ``flows`` set times a collective's messages as TCP flows instead
(:mod:`simdist.core._flows`): a message leaves when its send is posted, and the messages crossing a
link at the same time share its bandwidth fairly.

Two optional terms make a calibrated model (:mod:`simdist.calibrate`):

- ``gamma``, seconds per byte a reduction combines; the simulator charges a rank
  ``nbytes * gamma`` each time an algorithm reduces ``nbytes`` into its buffer. With
  ``host_cores`` set, a host runs at most that many reductions at once: a reduction
  starts when its rank is ready and one of its host's cores is free (of those free by
  then, the one freed last; else the one free first), so ``k`` ranks of one host that
  reduce ``n`` bytes together finish after ``ceil(k / host_cores) * n * gamma``.
- ``fresh_memory``, seconds per byte of a new buffer of at least ``fresh_from`` bytes
  (default :data:`FRESH_BYTES`) that an algorithm allocates for scratch or a collective
  allocates to stage its lists: such buffers come from the kernel untouched, and their
  first writes fault each page in. (glibc's ``malloc`` maps requests from its mmap
  threshold afresh every time, and that threshold grows with the buffers freed, up to
  32 MiB on 64-bit Linux; smaller buffers reuse memory the process has touched.)
- ``memcpy``, seconds per byte that a rank copies between buffers of its own memory: a
  collective called with lists (gather's ``gather_list``, scatter's ``scatter_list``,
  all_gather's and all_to_all's lists, reduce_scatter's ``input_list``) copies them into
  or out of one flat buffer. A collective that stages ``f`` bytes in new buffers and
  copies ``c`` bytes starts its messages ``fresh(f) + c * memcpy`` seconds after it is
  called on that rank (:attr:`CollectiveCall.staged` and ``copied``). The algorithms'
  own copies (Bruck's packing, a rank's own block put in place; through
  :func:`simdist.algorithms._chunks.copy`) cost ``nbytes * memcpy`` each.
- With ``host_cores`` set, a rank's reductions, its algorithms' copies and the page faults
  of their scratch all run on its host's cores (:meth:`Topology.compute`).
- ``check_overhead``, seconds per round of the check that the socket backend runs before
  every collective's data moves (its ranks all-gather 16-byte digests of their calls in
  ``ceil(log2 p)`` rounds, :mod:`simdist.backends.socket._checked`): a collective of ``p`` ranks
  starts its messages ``ceil(log2 p) * check_overhead`` seconds after it is called.
- ``call_overhead``, seconds a rank spends on each collective of 2 ranks or more outside
  its messages and that check (making the call, running the algorithm's steps): charged
  when the collective starts, with the check.
- ``rank_bandwidth``, bytes per second that one rank moves, its sends and its receives
  together (a process copies both); ``host_bandwidth``, bytes per second that one host
  moves for all its ranks together (memory, the kernel's loopback). Ranks ``r`` and ``s``
  share a host when ``r // ranks_per_host == s // ranks_per_host``. Each message also
  passes through its sender and its receiver (at ``rank_bandwidth``) and through their
  hosts (at ``host_bandwidth``, once if it is one host), each of them moving one message
  at a time in the order the messages start, and it arrives only once all have moved its
  bytes: ``k`` messages of ``n`` bytes between distinct ranks of one host that start
  together arrive at ``start + alpha + max(n / bandwidth, n / rank_bandwidth,
  j * n / host_bandwidth)`` for ``j = 1 .. k``; a rank that sends and receives ``n``
  bytes at once finishes both after ``2 * n / rank_bandwidth``.
- ``host_overhead``, seconds of a host's time per message (system calls, waking the
  receiver), spent one message at a time like its bandwidth: with it a host's work for
  a message is ``host_overhead + n / host_bandwidth``, so ``k`` small messages that start
  together on one host arrive ``host_overhead`` apart.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import networkx as nx

__all__ = [
    "Topology",
    "DEFAULT_ALPHA",
    "DEFAULT_BANDWIDTH",
    "FRESH_BYTES",
    "TOPOLOGIES",
    "as_topology",
    "fully_connected",
    "ring",
    "switch",
    "two_level",
]

FRESH_BYTES = 128 << 10
"""Buffers from this size are charged ``fresh_memory`` unless a topology sets ``fresh_from``
(glibc's ``malloc`` starts with an mmap threshold of 128 KiB: buffers from it are mapped fresh
from the kernel; smaller ones reuse memory the process has touched)."""

DEFAULT_ALPHA = 1e-6
"""Latency of one link, in seconds (1 µs; two links through a switch make 2 µs)."""

DEFAULT_BANDWIDTH = 12.5e9
"""Bandwidth of one link, in bytes per second (12.5 GB/s, a 100 Gb/s network)."""

Link = tuple[Any, Any]
LinkParams = Callable[[Any, Any], "tuple[float, float] | tuple[float, float, float]"]
"""``(u, v) -> (alpha, bandwidth)`` or ``(alpha, bandwidth, burst)`` of a link."""

MAX_GAPS = 32
"""Idle periods remembered per rank or host (the latest): a message that starts in one may be moved there."""


class Topology:
    """A network of ranks: routes, link parameters and the links' busy times.

    Args:
        name: a short name for reports (``'switch'``).
        size: the number of ranks.
        build: makes the networkx graph (called at most once, lazily).
        route: optional ``route(a, b) -> [nodes]`` for regular topologies, so that large
            worlds never build a graph with n² edges; by default the graph's shortest path.
        link_params: optional ``(u, v) -> (alpha, bandwidth)`` for the same purpose, or
            ``(alpha, bandwidth, burst)`` for links with a burst (a link's graph attribute ``burst``).
        gamma: seconds per byte reduced (0: reductions are free).
        fresh_memory: seconds per byte of a new buffer of ``fresh_from`` bytes or more (0: free).
        fresh_from: the smallest new buffer, in bytes, charged ``fresh_memory`` (``FRESH_BYTES``).
        memcpy: seconds per byte a rank copies between its own buffers, staging lists or inside algorithms (0: free).
        check_overhead: seconds per round of the cross-rank check before a collective (0: none).
        call_overhead: seconds a rank spends on a collective outside its messages and the check (0: none).
        rank_bandwidth: bytes per second one rank sends and receives together (``None``: unlimited).
        host_bandwidth: bytes per second one host moves for all its ranks (``None``: unlimited).
        host_overhead: seconds of a host's time per message (0: none).
        host_cores: reductions, copies and page faults one host runs at once (``None``: every rank in parallel).
        ranks_per_host: ranks per host for ``host_bandwidth`` (``None``: every rank on one host).
        per_node: ranks per node of a network built of nodes (``two_level``), each node a machine.
        link_queues: each link of a route serves the messages that reach it in turn, on its own, as a
            switch queues a message for its next link; ``False`` (default): a message holds every link of
            its route at once, so a busy last link keeps the first one idle.
        flows: a collective's messages are flows, as TCP's (:mod:`simdist.core._flows`): each leaves when it is
            posted, matched or not; messages that cross a link at the same time share its bandwidth max-min
            fairly; the messages of one sender to one receiver follow each other. ``False`` (default): a
            message leaves once its receive is posted too, and takes its links as ``link_queues`` says.
        send_buffer: with ``flows``, bytes of a send that its sender's kernel keeps: a send is done once no more
            than this is left to leave (at once if it is no larger), as a socket's send returns once its bytes
            are written to the connection (0: when its last byte has arrived).
    """

    def __init__(
        self,
        name: str,
        size: int,
        build: Callable[[], nx.Graph],
        route: Callable[[int, int], list] | None = None,
        link_params: LinkParams | None = None,
        *,
        gamma: float = 0.0,
        fresh_memory: float = 0.0,
        fresh_from: int = FRESH_BYTES,
        memcpy: float = 0.0,
        check_overhead: float = 0.0,
        call_overhead: float = 0.0,
        rank_bandwidth: float | None = None,
        host_bandwidth: float | None = None,
        host_overhead: float = 0.0,
        host_cores: int | None = None,
        ranks_per_host: int | None = None,
        per_node: int | None = None,
        link_queues: bool = False,
        flows: bool = False,
        send_buffer: int = 0,
    ):
        self.name = name
        self.per_node = per_node
        self.link_queues = link_queues
        self.flows = flows
        self.send_buffer = send_buffer
        self.layout = name  # how the network is built ('switch', ..., 'custom'); a file may rename it
        self.gamma = gamma
        self.fresh_memory = fresh_memory
        self.fresh_from = fresh_from
        self.memcpy = memcpy
        self.check_overhead = check_overhead
        self.call_overhead = call_overhead
        self.rank_bandwidth = rank_bandwidth
        self.host_bandwidth = host_bandwidth
        self.host_overhead = host_overhead
        self.host_cores = host_cores
        self.ranks_per_host = ranks_per_host
        self._shared_free: dict[tuple[str, int], float] = {}  # ("rank" | "host", index) -> busy until
        self._shared_gaps: dict[tuple[str, int], list[list[float]]] = {}  # ... -> its idle [from, to] before that
        self._cores_free: dict[int, list[float]] = {}  # host -> when each of its cores is next free
        self.size = size
        self._build = build
        self._graph: nx.Graph | None = None
        self._route_fn = route
        self._link_fn = link_params
        self._paths: dict[tuple[int, int], tuple[tuple[Link, ...], float, float]] = {}
        self._routes: dict[tuple[int, int], tuple] = {}
        self._link_ids: dict[Link, int] = {}
        self._free: list[float] = []
        self._credit: dict[int, float] = {}  # link -> bytes of burst credit when it fell free (absent: full)

    @property
    def graph(self) -> nx.Graph:
        """The networkx graph (built on first use)."""
        if self._graph is None:
            self._graph = self._build()
        return self._graph

    def __repr__(self) -> str:
        return f"<Topology {self.name} of {self.size} ranks>"

    def copy(self) -> Topology:
        """The same network with busy times of its own (a run on it leaves this one's alone); the graph is shared."""
        twin = Topology(
            self.name,
            self.size,
            self._build,
            self._route_fn,
            self._link_fn,
            gamma=self.gamma,
            fresh_memory=self.fresh_memory,
            fresh_from=self.fresh_from,
            memcpy=self.memcpy,
            check_overhead=self.check_overhead,
            call_overhead=self.call_overhead,
            rank_bandwidth=self.rank_bandwidth,
            host_bandwidth=self.host_bandwidth,
            host_overhead=self.host_overhead,
            host_cores=self.host_cores,
            ranks_per_host=self.ranks_per_host,
            per_node=self.per_node,
            link_queues=self.link_queues,
            flows=self.flows,
            send_buffer=self.send_buffer,
        )
        twin._graph = self._graph
        twin.layout = self.layout
        return twin

    def path(self, a: int, b: int) -> tuple[tuple[Link, ...], float, float]:
        """``(links, alpha, bandwidth)`` of the route from rank ``a`` to rank ``b``."""
        key = (a, b)
        cached = self._paths.get(key)
        if cached is None:
            if self._route_fn:
                nodes = self._route_fn(a, b)
            else:
                import networkx as nx

                nodes = nx.shortest_path(self.graph, a, b)
            links = tuple(zip(nodes, nodes[1:]))
            params = [self._params(u, v)[:2] for u, v in links]
            alpha = sum(p[0] for p in params)
            bandwidth = min((p[1] for p in params), default=float("inf"))
            cached = self._paths[key] = (links, alpha, bandwidth)
        return cached

    def _params(self, u: Any, v: Any) -> tuple[float, float, float]:
        """``(alpha, bandwidth, burst)`` of the link between ``u`` and ``v``."""
        if self._link_fn is not None:
            alpha, bandwidth, burst = (*self._link_fn(u, v), 0.0)[:3]
            return alpha, bandwidth, burst
        data = self.graph.edges[u, v]
        return (
            float(data.get("alpha", DEFAULT_ALPHA)),
            float(data.get("bandwidth", DEFAULT_BANDWIDTH)),
            float(data.get("burst", 0.0)),
        )

    def alpha_beta(self) -> tuple[float, float]:
        """``(alpha, beta)`` of a typical pair (ranks 0 and 1): the analytic model's parameters."""
        if self.size < 2:
            return 0.0, 0.0
        _, alpha, bandwidth = self.path(0, 1)
        return alpha, 1.0 / bandwidth

    def reset(self) -> None:
        """Forget the links' busy times (a new run starts on an idle network)."""
        self._free = [0.0] * len(self._free)
        self._credit = {}
        self._shared_free = {}
        self._shared_gaps = {}
        self._cores_free = {}

    def _route(self, a: int, b: int) -> tuple:
        """The route from ``a`` to ``b`` with each directed link as an index into the busy times:
        ``(ids, alpha, bandwidth, buckets, plain)``, ``buckets`` the ``(id, burst, bandwidth)`` of its links
        with a burst, ``plain`` the least bandwidth of the others."""
        links, alpha, bandwidth = self.path(a, b)
        ids, buckets, plain = [], [], float("inf")
        for link in links:
            i = self._link_ids.get(link)
            if i is None:
                i = self._link_ids[link] = len(self._free)
                self._free.append(0.0)
            ids.append(i)
            _, rate, burst = self._params(*link)
            if burst > 0:
                buckets.append((i, burst, rate))
            else:
                plain = min(plain, rate)
        route = self._routes[(a, b)] = (tuple(ids), alpha, bandwidth, tuple(buckets), plain)
        return route

    def transfer(self, a: int, b: int, nbytes: int, ready: float) -> tuple[float, float]:
        """Send ``nbytes`` from ``a`` to ``b`` once ready at ``ready``: returns ``(start, arrival)``.

        The links of the route are marked busy while the bytes pass (contention).
        """
        if a == b:
            return ready, ready
        route = self._routes.get((a, b)) or self._route(a, b)
        links, alpha, bandwidth, buckets, plain = route
        free = self._free
        if self.link_queues:
            start, busy = self._through_queues(links, buckets, plain, nbytes, ready)
        else:
            start = ready
            for i in links:
                if free[i] > start:
                    start = free[i]
            busy = start + (self._spend(buckets, plain, nbytes, start) if buckets else nbytes / bandwidth)
            for i in links:
                free[i] = busy
        if self.rank_bandwidth is not None or self.host_bandwidth is not None or self.host_overhead:
            busy = self._through_shared(a, b, nbytes, start, busy)
        return start, busy + alpha

    def _through_queues(
        self, links: tuple, buckets: tuple, plain: float, nbytes: int, ready: float
    ) -> tuple[float, float]:
        """``(start, end)`` of ``nbytes`` ready at ``ready`` on a route whose links each take it once they are
        free (``link_queues``): the first link's start, and when the last of them has passed it."""
        free, burst_of = self._free, {bucket[0]: bucket for bucket in buckets}
        start, end = None, ready
        for i in links:
            begin = max(ready, free[i])
            if i in burst_of:
                free[i] = begin + self._spend((burst_of[i],), float("inf"), nbytes, begin)
            else:
                free[i] = begin + (nbytes / plain if plain != float("inf") else 0.0)
            start = begin if start is None else start
            end = max(end, free[i])
        return ready if start is None else start, end

    def _spend(self, buckets: tuple, plain: float, nbytes: int, start: float) -> float:
        """Seconds that ``nbytes`` starting at ``start`` occupy a route whose ``buckets`` have a burst (``plain``:
        the least bandwidth of its other links); spends the buckets' credit."""
        credit, free = self._credit, self._free
        held = [min(burst, credit.get(i, burst) + (start - free[i]) * rate) for i, burst, rate in buckets]
        seconds = nbytes / plain
        for (_, _, rate), have in zip(buckets, held):
            seconds = max(seconds, (nbytes - have) / rate)
        for (i, burst, rate), have in zip(buckets, held):
            credit[i] = min(burst, max(0.0, have + seconds * rate - nbytes))
        return seconds

    def reduce(self, rank: int, nbytes: int, ready: float) -> float:
        """When ``rank``, ready at ``ready``, has reduced ``nbytes`` (``gamma`` a byte, on a free core of its host)."""
        return self.compute(rank, nbytes * self.gamma, ready)

    def compute(self, rank: int, seconds: float, ready: float) -> float:
        """When ``rank``, ready at ``ready``, has done ``seconds`` of its own work (reducing, copying, first
        touching new memory) on a core of its host: of the cores free by ``ready`` the one that became free last
        (a rank's steps follow each other on one core and leave the others to its neighbours), else the one free
        first; ``ready + seconds`` without ``host_cores``."""
        if self.host_cores is None:
            return ready + seconds
        cores = self._cores_free.setdefault(self.host(rank), [0.0] * self.host_cores)
        idle = [i for i, free in enumerate(cores) if free <= ready]
        i = max(idle, key=cores.__getitem__) if idle else min(range(len(cores)), key=cores.__getitem__)
        cores[i] = max(ready, cores[i]) + seconds
        return cores[i]

    def fresh(self, nbytes: int) -> float:
        """Seconds to first touch a new buffer of ``nbytes`` (``fresh_memory`` a byte from ``fresh_from``)."""
        return nbytes * self.fresh_memory if nbytes >= self.fresh_from else 0.0

    def copying(self, nbytes: int) -> float:
        """Seconds a rank spends copying ``nbytes`` between its own buffers (``memcpy`` a byte)."""
        return nbytes * self.memcpy

    def setup(self, size: int, staged: tuple[int, ...], copied: int) -> float:
        """Seconds a rank of a group of ``size`` ranks spends on a collective before its first message.

        That is ``call_overhead`` plus ``ceil(log2 size) * check_overhead`` (the cross-rank check's
        rounds) where ``size > 1``, plus first touching the new buffers of ``staged`` bytes each
        (:meth:`fresh`), plus ``copied * memcpy``.
        """
        fixed = self.call_overhead + (size - 1).bit_length() * self.check_overhead if size > 1 else 0.0
        return fixed + sum(self.fresh(n) for n in staged) + self.copying(copied)

    def host(self, rank: int) -> int:
        """The host that ``rank`` runs on (0 for every rank unless ``ranks_per_host`` is set)."""
        return rank // self.ranks_per_host if self.ranks_per_host else 0

    def machine(self, rank: int) -> int | None:
        """The machine that ``rank`` runs on where the topology says (``ranks_per_host``, else a
        ``two_level`` network's node); ``None`` where it does not."""
        per = self.ranks_per_host or self.per_node
        return rank // per if per else None

    def _through_shared(self, a: int, b: int, nbytes: int, start: float, done: float) -> float:
        """When ranks ``a``, ``b`` and their hosts have moved ``nbytes`` starting at ``start`` (at least ``done``)."""
        shared = []  # (resource, its time for this message)
        if self.rank_bandwidth is not None:
            work = nbytes / self.rank_bandwidth
            shared += [(("rank", a), work), (("rank", b), work)]
        if self.host_bandwidth is not None or self.host_overhead:
            work = self.host_overhead + (0.0 if self.host_bandwidth is None else nbytes / self.host_bandwidth)
            shared += [(("host", h), work) for h in sorted({self.host(a), self.host(b)})]
        for key, work in shared:
            done = max(done, self._occupy(key, start, work))
        return done

    def _occupy(self, key: tuple[str, int], start: float, work: float) -> float:
        """When shared resource ``key`` has done ``work`` seconds for a message that starts at ``start``: in the
        first idle period from ``start`` long enough for it (messages reach a resource in the order they start,
        while the simulator may settle a message that starts later first), else after all it has taken on."""
        free = self._shared_free.get(key, 0.0)
        if start < free:
            gaps = self._shared_gaps.get(key, [])
            for i, gap in enumerate(gaps):
                begin = max(gap[0], start)
                if begin + work <= gap[1]:
                    end = begin + work
                    gaps[i : i + 1] = [g for g in ([gap[0], begin], [end, gap[1]]) if g[1] - g[0] > 0]
                    return end
        elif start > free:
            gaps = self._shared_gaps.setdefault(key, [])
            gaps.append([free, start])
            if len(gaps) > MAX_GAPS:
                del gaps[0]
        end = max(start, free) + work
        self._shared_free[key] = end
        return end


def _link(alpha: float, bandwidth: float, burst: float) -> dict[str, float]:
    """A link's graph attributes (``burst`` only where it has one)."""
    return {"alpha": alpha, "bandwidth": bandwidth, **({"burst": burst} if burst else {})}


def fully_connected(
    n: int, alpha: float = DEFAULT_ALPHA, bandwidth: float = DEFAULT_BANDWIDTH, burst: float = 0.0
) -> Topology:
    """A direct link between every pair of ranks."""

    def build() -> nx.Graph:
        import networkx as nx

        g = nx.complete_graph(n)
        g.add_edges_from(g.edges, **_link(alpha, bandwidth, burst))
        return g

    return Topology(
        "fully_connected", n, build, route=lambda a, b: [a, b], link_params=lambda u, v: (alpha, bandwidth, burst)
    )


def switch(n: int, alpha: float = DEFAULT_ALPHA, bandwidth: float = DEFAULT_BANDWIDTH, burst: float = 0.0) -> Topology:
    """Every rank on one link to one switch (a star): each rank sends and receives one message at a time."""

    def build() -> nx.Graph:
        import networkx as nx

        g = nx.Graph()
        g.add_nodes_from(range(n))
        g.add_edges_from(((r, "switch") for r in range(n)), **_link(alpha, bandwidth, burst))
        return g

    return Topology(
        "switch", n, build, route=lambda a, b: [a, "switch", b], link_params=lambda u, v: (alpha, bandwidth, burst)
    )


def ring(n: int, alpha: float = DEFAULT_ALPHA, bandwidth: float = DEFAULT_BANDWIDTH, burst: float = 0.0) -> Topology:
    """Rank ``i`` linked to ranks ``i-1`` and ``i+1`` (mod n); other pairs route the shorter way round."""

    def build() -> nx.Graph:
        import networkx as nx

        g = nx.cycle_graph(n) if n > 2 else nx.path_graph(n)
        g.add_edges_from(g.edges, **_link(alpha, bandwidth, burst))
        return g

    def route(a: int, b: int) -> list:
        fwd = (b - a) % n
        step = 1 if fwd <= n - fwd else -1
        return [(a + step * i) % n for i in range(min(fwd, n - fwd) + 1)]

    return Topology("ring", n, build, route=route, link_params=lambda u, v: (alpha, bandwidth, burst))


def two_level(
    n: int,
    per_node: int = 4,
    intra_alpha: float = 0.5e-6,
    intra_bandwidth: float = 100e9,
    inter_alpha: float = DEFAULT_ALPHA,
    inter_bandwidth: float = DEFAULT_BANDWIDTH,
    intra_burst: float = 0.0,
    inter_burst: float = 0.0,
) -> Topology:
    """Nodes of ``per_node`` ranks: a fast switch inside each node, one slower uplink per node to a spine.

    Each direction of a node's uplink carries one message at a time, so the node's ranks share it: a
    message between nodes crosses both nodes' uplinks (``2 * inter_alpha`` and the two links from its
    ranks to their nodes' switches, ``2 * intra_alpha``).
    """
    nodes = (n + per_node - 1) // per_node

    def local(r: int) -> str:
        return f"node{r // per_node}"

    def build() -> nx.Graph:
        import networkx as nx

        g = nx.Graph()
        g.add_nodes_from(range(n))
        for r in range(n):
            g.add_edge(r, local(r), **_link(intra_alpha, intra_bandwidth, intra_burst))
        for k in range(nodes):
            g.add_edge(f"node{k}", "spine", **_link(inter_alpha, inter_bandwidth, inter_burst))
        return g

    def route(a: int, b: int) -> list:
        if a // per_node == b // per_node:
            return [a, local(a), b]
        return [a, local(a), "spine", local(b), b]

    def params(u: Any, v: Any) -> tuple[float, float, float]:
        if "spine" in (u, v):
            return inter_alpha, inter_bandwidth, inter_burst
        return intra_alpha, intra_bandwidth, intra_burst

    return Topology("two_level", n, build, route=route, link_params=params, per_node=per_node)


def _reference(name: str) -> Callable[[int], Topology]:
    """A factory for the shipped reference topology ``name`` (its file is read when it is used)."""

    def make(n: int) -> Topology:
        from ._topology_file import load_topology, reference_path  # a circle by choice: files build Topology objects

        return load_topology(reference_path(name), n)

    make.__name__ = name.replace("-", "_")
    return make


TOPOLOGIES: dict[str, Callable[[int], Topology]] = {
    "switch": switch,
    "fully_connected": fully_connected,
    "ring": ring,
    "two_level": two_level,
    "dgx-a100-nvlink": _reference("dgx-a100-nvlink"),
    "ib-hdr-4node": _reference("ib-hdr-4node"),
}


def _is_graph(spec: Any) -> bool:
    """Whether ``spec`` is a networkx graph (networkx is imported only by those who make one, or need a route)."""
    nx = sys.modules.get("networkx")
    return nx is not None and isinstance(spec, nx.Graph)


def as_topology(spec: Any, size: int) -> Topology:
    """A :class:`Topology` for ``size`` ranks from ``None`` (``'switch'``), a name, a topology file
    (a path ending in ``.json``, see :mod:`simdist.core._topology_file`), a graph or a Topology."""
    if spec is None:
        spec = "switch"
    if isinstance(spec, os.PathLike) or (isinstance(spec, str) and spec.endswith(".json")):
        from ._topology_file import load_topology  # (the circle above)

        return load_topology(os.fspath(spec), size)
    if isinstance(spec, Topology):
        topo = spec
    elif isinstance(spec, str):
        if spec not in TOPOLOGIES:
            raise ValueError(
                f"topology={spec!r} is not a named topology or a topology file (a path ending in .json); "
                f"expected one of {sorted(TOPOLOGIES)}"
            )
        return TOPOLOGIES[spec](size)
    elif _is_graph(spec):
        graph = spec
        topo = Topology(graph.graph.get("name") or "custom", size, lambda: graph)
    else:
        raise TypeError(
            f"topology must be None, a name, a path, a networkx.Graph or a Topology, got {type(spec).__name__}"
        )
    missing = [r for r in range(size) if r not in topo.graph]
    if missing:
        raise ValueError(
            f"topology {topo.name!r} has no node for ranks {missing[:8]}; ranks are the integer nodes 0..{size - 1}"
        )
    topo.size = size
    return topo
