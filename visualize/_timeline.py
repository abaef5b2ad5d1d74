"""The timeline of a trace: one lane of spans per rank, messages as arrows, link use and contention."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from simdist.core._trace import Event, Trace

from ._graph import _topology, world_of
from ._rounds import message_rounds, round_of

__all__ = ["Span", "Arrow", "LinkUse", "Contention", "Timeline", "lanes", "messages_by_step", "timeline"]


def lanes(trace: Trace) -> dict[int, list[Event]]:
    """Each rank's spans (collectives, sends, receives, computation), ordered by start time.

    Args:
        trace: a ``simdist.Trace``.

    Returns:
        ``{rank: [Event, ...]}`` for every rank with a span (messages are not spans).

    Example:
        >>> from simdist.visualize import collective_run, lanes
        >>> spans = lanes(collective_run("all_reduce", "ring", 4, 64).trace)
        >>> sorted(spans), [(e.kind, e.op) for e in spans[0]]
        ([0, 1, 2, 3], [('collective', 'all_reduce')])
    """
    out: dict[int, list[Event]] = defaultdict(list)
    for e in trace.events:
        if e.kind in ("collective", "send", "recv", "compute"):
            out[e.rank].append(e)
    return {r: sorted(v, key=lambda e: (e.t_start, e.t_end)) for r, v in sorted(out.items())}


def messages_by_step(trace: Trace, collective_id: int) -> dict[int, list[Event]]:
    """The messages of one collective, grouped by communication round (from 1; see :func:`round_of`).

    Args:
        trace: a ``simdist.Trace``.
        collective_id: the collective (see :func:`collectives`).

    Returns:
        ``{round: [message Event, ...]}``, rounds ascending.

    Example:
        >>> from simdist.visualize import collective_run, messages_by_step
        >>> by_round = messages_by_step(collective_run("all_reduce", "ring", 4, 64).trace, 0)
        >>> {k: len(msgs) for k, msgs in by_round.items()}     # four messages a round
        {1: 4, 2: 4, 3: 4, 4: 4, 5: 4, 6: 4}
    """
    out: dict[int, list[Event]] = defaultdict(list)
    for i, k in sorted(round_of(trace, collective_id).of.items()):
        out[k].append(trace.events[i])
    return dict(sorted(out.items()))


@dataclass(frozen=True, slots=True)
class Span:
    """One bar on a rank's lane: a collective, a send, a receive or computation (seconds)."""

    rank: int
    kind: str
    label: str
    t_start: float
    t_end: float
    collective_id: int | None


@dataclass(frozen=True, slots=True)
class Arrow:
    """One message: from ``(src, t_start)`` to ``(dst, t_end)``; ``index`` numbers the messages.

    ``step`` is the sender's algorithm step, ``round`` the collective's communication
    round (:func:`round_of`; ``None`` outside collectives).
    """

    index: int
    src: int
    dst: int
    t_start: float
    t_end: float
    nbytes: int
    op: str
    step: int | None
    chunk: int | None
    collective_id: int | None
    round: int | None = None


@dataclass(frozen=True, slots=True)
class LinkUse:
    """Message ``arrow`` on a directed link: its bytes pass from ``t_start`` to ``t_busy``
    (``nbytes / bandwidth``), it is in flight until ``t_end`` (arrival)."""

    arrow: int
    t_start: float
    t_busy: float
    t_end: float


@dataclass(frozen=True, slots=True)
class Contention:
    """Messages ``first`` and ``second`` in flight on one ``link`` at once (from ``t_start`` to ``t_end``).

    The simulator lets a link carry one message at a time, so the later one queued
    behind the earlier one's bytes (or followed right behind them).
    """

    link: tuple[Any, Any]
    first: int
    second: int
    t_start: float
    t_end: float


@dataclass(frozen=True, slots=True)
class Timeline:
    """Everything a timeline view draws, in virtual seconds.

    Attributes:
        world: the number of lanes (ranks ``0 .. world-1``, each present even if idle).
        lanes: rank -> its spans ordered by start.
        arrows: every message, in trace order.
        links: directed link ``(u, v)`` of the topology -> its uses ordered by start.
        contention: pairs of messages in flight on one link at the same time.
        duration: the latest end time.
        topology: the topology's name.
    """

    world: int
    lanes: dict[int, list[Span]]
    arrows: list[Arrow]
    links: dict[tuple[Any, Any], list[LinkUse]]
    contention: list[Contention]
    duration: float
    topology: str


def _label(e: Event) -> str:
    if e.kind == "collective":
        return f"{e.op} ({e.algorithm})" if e.algorithm else e.op
    if e.kind in ("send", "recv"):
        return f"{e.kind} {'to' if e.kind == 'send' else 'from'} {e.peer}"
    return e.op


def timeline(trace: Trace, topology: Any = None) -> Timeline:
    """The timeline of ``trace``: one lane per rank, one arrow per message, link uses and contention.

    Each message is routed on ``topology`` (default: the run's, else ``'switch'``) to
    find the directed links it used; two messages whose flights on one link overlap are
    reported in ``contention`` (messages in different collectives included).

    Args:
        trace: a ``simdist.Trace``.
        topology: a name, ``Topology`` or graph to route messages on; default the run's.

    Returns:
        A ``Timeline``: ``world``, ``lanes`` (spans per rank), ``arrows`` (one per message),
        ``links`` (each link's uses), ``contention`` (overlapping flights on a link),
        ``duration``, ``topology``.

    Example:
        >>> from simdist.visualize import collective_run, timeline
        >>> tl = timeline(collective_run("all_reduce", "ring", 4, 64).trace)
        >>> tl.world, len(tl.arrows), len(tl.contention)     # a ring on a switch: no contention
        (4, 24, 0)
    """
    world = world_of(trace)
    topo = _topology(topology, trace, world)
    spans: dict[int, list[Span]] = {r: [] for r in range(world)}
    arrows: list[Arrow] = []
    links: dict[tuple[Any, Any], list[LinkUse]] = defaultdict(list)
    rounds = message_rounds(trace)
    for e, k in zip(trace.events, rounds):
        if e.kind in ("collective", "send", "recv", "compute"):
            spans.setdefault(e.rank, []).append(Span(e.rank, e.kind, _label(e), e.t_start, e.t_end, e.collective_id))
        elif e.kind == "message" and e.peer is not None and e.peer != e.rank:
            i = len(arrows)
            arrows.append(
                Arrow(i, e.rank, e.peer, e.t_start, e.t_end, e.nbytes, e.op, e.step, e.chunk, e.collective_id, k)
            )
            path, _, bandwidth = topo.path(e.rank, e.peer)
            busy = e.t_start + e.nbytes / bandwidth
            for link in path:
                links[link].append(LinkUse(i, e.t_start, busy, e.t_end))
    contention = []
    for link, uses in links.items():
        uses.sort(key=lambda u: (u.t_start, u.t_end))
        active: list[LinkUse] = []
        for u in uses:
            active = [a for a in active if a.t_end > u.t_start]
            for a in active:
                contention.append(Contention(link, a.arrow, u.arrow, u.t_start, min(a.t_end, u.t_end)))
            active.append(u)
    for r in spans:
        spans[r].sort(key=lambda s: (s.t_start, s.t_end))
    contention.sort(key=lambda c: (c.t_start, c.first, c.second))
    return Timeline(world, dict(sorted(spans.items())), arrows, dict(links), contention, trace.duration(), topo.name)
