"""Graphs of a trace: the data flow of one communication round, node positions for a topology,
and the wait-for graph of a deadlock."""

from __future__ import annotations

import math
from typing import Any

import networkx as nx

from simdist.core._errors import DeadlockError
from simdist.core._topology import Topology, as_topology
from simdist.core._trace import Trace

from ._colors import rank_colors
from ._rounds import round_of

__all__ = ["world_of", "collectives", "steps", "positions", "step_graph", "wait_for"]


def world_of(trace: Trace) -> int:
    """The number of ranks of ``trace``: its metadata's, else one more than the highest rank seen.

    Args:
        trace: a ``simdist.Trace``.

    Returns:
        The world size.

    Example:
        >>> from simdist.visualize import collective_run, world_of
        >>> world_of(collective_run("all_reduce", "ring", 4, 64).trace)
        4
    """
    meta = trace.meta.get("visualize") or {}
    if "world" in meta:
        return int(meta["world"])
    ranks = [e.rank for e in trace.events] + [e.peer for e in trace.events if e.peer is not None]
    return max(ranks, default=-1) + 1


def collectives(trace: Trace) -> list[int]:
    """The collective ids that have messages in ``trace``, ascending.

    Args:
        trace: a ``simdist.Trace``.

    Returns:
        The ids (``Event.collective_id``) of the collectives that sent messages.

    Example:
        >>> from simdist.visualize import collective_run, collectives
        >>> collectives(collective_run("broadcast", "binomial", 4, 64).trace)
        [0]
    """
    return sorted({e.collective_id for e in trace.events if e.kind == "message" and e.collective_id is not None})


def _default_collective(trace: Trace, collective_id: int | None) -> int | None:
    if collective_id is not None:
        return collective_id
    ids = collectives(trace)
    return ids[0] if ids else None


def steps(trace: Trace, collective_id: int | None = None) -> list[int]:
    """The communication rounds of one collective (default: the first with messages): ``[1 .. R]``.

    Round ``k`` holds the messages that could go at the ``k``-th hop: a message's round
    is one more than the latest round among the messages its sender received, or sent
    in an earlier step, before sending it (see :func:`simdist.visualize.round_of`).

    Args:
        trace: a ``simdist.Trace``, recorded with ``record_steps=True`` for exact rounds.
        collective_id: the collective; default the first with messages.

    Returns:
        ``[1, 2, ..., R]``; ``[]`` when the collective sent no message.

    Example:
        >>> from simdist.visualize import collective_run, steps
        >>> steps(collective_run("all_reduce", "ring", 4, 64).trace)   # reduce-scatter 3 + all-gather 3
        [1, 2, 3, 4, 5, 6]
    """
    cid = _default_collective(trace, collective_id)
    return list(range(1, round_of(trace, cid).count + 1))


def _circle(n: int, radius: float = 1.0, center: tuple[float, float] = (0.0, 0.0)) -> list[tuple[float, float]]:
    """``n`` points clockwise from the top (rank 0 at 12 o'clock)."""
    cx, cy = center
    return [
        (cx + radius * math.sin(2 * math.pi * i / n), cy + radius * math.cos(2 * math.pi * i / n)) for i in range(n)
    ]


def _topology(spec: Any, trace: Trace | None, world: int) -> Topology:
    if spec is None and trace is not None:
        spec = (trace.meta.get("visualize") or {}).get("topology")
    return as_topology(spec, world)


def positions(topology: Any, world: int) -> dict[Any, tuple[float, float]]:
    """``{node: (x, y)}`` for the ranks (and switches) of ``topology`` on ``world`` ranks.

    Ranks lie on a circle (switch, ring, fully_connected; a switch in the middle), or one
    small circle per node on a larger circle (two_level; each node's switch at its
    centre, the spine in the middle). Other graphs get a seeded spring layout.

    Args:
        topology: a name from ``simdist.TOPOLOGIES``, a ``Topology`` or a networkx graph.
        world: the number of ranks.

    Returns:
        Positions keyed by rank (``0 .. world-1``) and by switch name.

    Example:
        >>> from simdist.visualize import positions
        >>> {node: (round(x, 3), round(y, 3)) for node, (x, y) in positions("switch", 4).items()}
        {0: (0.0, 1.0), 1: (1.0, 0.0), 2: (0.0, -1.0), 3: (-1.0, -0.0), 'switch': (0.0, 0.0)}
    """
    topo = as_topology(topology, world)
    ranks = _circle(max(world, 1))
    if topo.layout in ("switch", "ring", "fully_connected"):
        pos: dict[Any, tuple[float, float]] = {r: ranks[r] for r in range(world)}
        if topo.layout == "switch":
            pos["switch"] = (0.0, 0.0)
        return pos
    if topo.layout == "two_level":
        groups: dict[Any, list[int]] = {}
        for r in range(world):
            hub = next(v for v in topo.graph.neighbors(r) if isinstance(v, str))
            groups.setdefault(hub, []).append(r)
        hubs = sorted(groups, key=lambda h: min(groups[h]))
        centers = _circle(len(hubs), 1.0) if len(hubs) > 1 else [(0.0, 0.0)]
        small = 0.8 * math.sin(math.pi / len(hubs)) if len(hubs) > 1 else 1.0
        pos = {"spine": (0.0, 0.0)} if len(hubs) > 1 else {}
        for hub, c in zip(hubs, centers):
            pos[hub] = c
            members = groups[hub]
            for r, p in zip(members, _circle(len(members), small, c)):
                pos[r] = p
        return pos
    raw = nx.spring_layout(topo.graph, seed=0)
    return {k: (float(v[0]), float(v[1])) for k, v in raw.items()}


def step_graph(trace: Trace, step: int, topology: Any = None, collective_id: int | None = None) -> nx.MultiDiGraph:
    """The data flow of one communication round: one node per rank, one edge per message of the round.

    Nodes are ranks ``0 .. world-1`` with ``pos`` (from :func:`positions`), ``color``,
    ``sent`` and ``received`` (messages in this round). Edges ``src -> dst`` (keyed, so
    that two messages between one pair stay two edges) carry ``nbytes``, ``chunk``
    (``None`` for a message spanning several chunks), ``tag``, ``t_start``, ``t_end``
    and ``step`` (the sender's algorithm step). ``g.graph`` holds ``step`` (the round),
    ``rounds`` (how many the collective has), ``collective_id``, ``op``, ``algorithm``,
    ``topology``, ``world``, ``switches`` (``{name: pos}``) and ``links`` (the topology's links).

    Args:
        step: the round, from 1 (see :func:`steps`).
        topology: a name, Topology or graph; default the run's (``'switch'`` if unknown).
        collective_id: default the first collective with messages.

    Returns:
        A ``networkx.MultiDiGraph`` as described above.

    Example:
        >>> from simdist.visualize import collective_run, step_graph
        >>> g = step_graph(collective_run("all_reduce", "ring", 4, 64).trace, 1)
        >>> sorted(g.edges()), g.graph["rounds"]      # round 1 of a ring: each rank sends right
        ([(0, 1), (1, 2), (2, 3), (3, 0)], 6)
    """
    world = world_of(trace)
    topo = _topology(topology, trace, world)
    pos = positions(topo, world)
    cid = _default_collective(trace, collective_id)
    rounds = round_of(trace, cid)
    colors = rank_colors(world)
    g = nx.MultiDiGraph()
    for r in range(world):
        g.add_node(r, pos=pos[r], color=colors[r], sent=0, received=0)
    op = algorithm = None
    for i, k in sorted(rounds.of.items()):
        if k != step:
            continue
        e = trace.events[i]
        op, algorithm = e.op, e.algorithm
        g.add_edge(
            e.rank, e.peer, nbytes=e.nbytes, chunk=e.chunk, tag=e.tag, t_start=e.t_start, t_end=e.t_end, step=e.step
        )
        g.nodes[e.rank]["sent"] += 1
        g.nodes[e.peer]["received"] += 1
    links = [] if topo.layout == "fully_connected" else [tuple(x) for x in topo.graph.edges()]
    g.graph.update(
        step=step,
        rounds=rounds.count,
        collective_id=cid,
        op=op,
        algorithm=algorithm,
        topology=topo.name,
        world=world,
        switches={k: v for k, v in pos.items() if not isinstance(k, int)},
        links=links,
    )
    return g


def _group_text(data: dict) -> str:
    """`` on group a`` (its ``group_desc``) or `` on group 3``; empty for the default group."""
    if not data.get("group"):
        return ""
    return f" on group {data.get('group_desc') or data['group']}"


def _call(data: dict) -> str:
    """What a blocked rank called, as the program wrote it: ``send(dst=1, tag=2)``, ``all_reduce on group a``."""
    op = data.get("op", "?")
    if op in ("send", "recv"):
        peer = "any" if data.get("peer") is None else data["peer"]
        tag = f", tag={data['tag']}" if data.get("tag") else ""
        return f"{op}({'dst' if op == 'send' else 'src'}={peer}{tag}){_group_text(data)}"
    return f"{op}{_group_text(data)}"


def _waits_for(rank: int, data: dict) -> str:
    """What ``rank`` (blocked as ``data`` says) needs the rank it waits for to call."""
    op = data.get("op", "?")
    tag = f", tag={data['tag']}" if data.get("tag") else ""
    if op == "send":
        return f"recv(src={rank}{tag}){_group_text(data)}"
    if op == "recv":
        return f"send(dst={rank}{tag}){_group_text(data)}"
    return _call(data)


def _site(call_site: str | None) -> tuple[str | None, int | None]:
    """``('program.py:8', 8)`` from a call site ``'/any/dir/program.py:8'``; ``(None, None)`` without one."""
    if not call_site or ":" not in call_site:
        return None, None
    path, _, line = call_site.rpartition(":")
    name = path.replace("\\", "/").rsplit("/", 1)[-1]
    return f"{name}:{line}", int(line) if line.isdigit() else None


def _label(rank: int, data: dict) -> str:
    if data.get("finished"):
        return f"rank {rank}: finished"
    text = f"rank {rank}: {_call(data)}"
    if data.get("missing"):
        text += f" (waiting for ranks {data['missing']})"
    if data.get("call_site"):
        text += f" at {data['call_site']}"
    return text


def _layout(ranks: list[int]) -> dict[int, tuple[float, float]]:
    """Ranks on the unit circle clockwise from the top; two ranks side by side (left, right)."""
    if len(ranks) == 2:
        return {ranks[0]: (-1.0, 0.0), ranks[1]: (1.0, 0.0)}
    return dict(zip(ranks, _circle(max(len(ranks), 1))))


def wait_for(err: DeadlockError) -> nx.DiGraph:
    """The wait-for graph of ``err`` ready to draw: ``a -> b`` means rank ``a`` waits for rank ``b``.

    A copy of ``err.graph`` whose nodes also carry ``pos`` (on the unit circle; two ranks
    left and right), ``color``, ``call`` (what the rank is blocked in, as the program wrote
    it: ``send(dst=1)``, ``all_reduce on group a`` for a group made with ``group_desc="a"``),
    ``site`` (``'program.py:8'``, the file's name and line) and ``line`` (the line number, or
    ``None``), and ``label`` (all of it, with the full call site). Edges carry ``waits_for``
    (what ``b`` must call to release ``a``: ``recv(src=0)``) and ``in_cycle`` (on
    ``err.cycle``). ``g.graph["cycle"]`` is ``err.cycle``.

    Args:
        err: a ``DeadlockError`` of the simulator.

    Returns:
        A ``networkx.DiGraph`` with the attributes above.

    Raises:
        ValueError: if ``err`` carries no graph.

    Example:
        >>> import simdist, torch
        >>> from simdist.visualize import wait_for
        >>> def both_receive(rank):                # each waits for the other: a deadlock
        ...     simdist.init_process_group("gloo")
        ...     simdist.recv(torch.zeros(1), src=1 - rank)
        >>> try:
        ...     simdist.simulate(both_receive, 2)
        ... except simdist.DeadlockError as err:
        ...     g = wait_for(err)
        >>> sorted(g.edges(data="waits_for"))
        [(0, 1, 'send(dst=0)'), (1, 0, 'send(dst=1)')]
    """
    if err.graph is None:
        raise ValueError("err carries no wait-for graph (err.graph is None)")
    g = nx.DiGraph(err.graph)
    ranks = sorted(n for n in g.nodes if isinstance(n, int))
    colors = rank_colors(max(ranks, default=-1) + 1)
    pos = _layout(ranks)
    for n, data in g.nodes(data=True):
        data["pos"] = pos.get(n, (0.0, 0.0))
        data["color"] = colors[n] if isinstance(n, int) else "#BBBBBB"
        data["call"] = "finished" if data.get("finished") else _call(data)
        data["site"], data["line"] = _site(data.get("call_site"))
        data["label"] = _label(n, data)
    cycle = list(err.cycle)
    on_cycle = {(a, b) for a, b in zip(cycle, cycle[1:] + cycle[:1])} if cycle else set()
    for a, b, data in g.edges(data=True):
        data["in_cycle"] = (a, b) in on_cycle
        data["waits_for"] = _waits_for(a, g.nodes[a])
    g.graph["cycle"] = cycle
    return g
