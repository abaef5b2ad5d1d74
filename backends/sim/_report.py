"""Reports a person can act on: the deadlock report and the leak report."""

from __future__ import annotations

from typing import Any

import networkx as nx

from simdist._errors import DeadlockError

from ._messages import CollectiveRun, Post

__all__ = ["deadlock_error", "leaks", "undestroyed"]


def _blocked_entry(engine: Any, rs: Any) -> tuple[dict, list[int]]:
    """What ``rs`` is blocked on, and the ranks it waits for."""
    what, items = rs.blocked or ("?", [])
    entry: dict[str, Any] = {"rank": rs.rank, "op": what, "peer": None, "group": None, "tag": None, "call_site": None}
    waits: list[int] = []
    for it in items:
        if isinstance(it, Post):
            entry.update(group=it.group, tag=it.tag, call_site=it.call_site)
            peer = it.dst if it.kind == "send" else it.src
            entry["peer"] = peer
            if peer is None:
                gs = engine.groups.get(it.group)
                members = gs.ranks if gs else range(len(engine.ranks))
                waits += [r for r in members if r != rs.rank]
            else:
                waits.append(peer)
        elif isinstance(it, CollectiveRun):
            entry.update(op=it.call.op, group=it.group.group_id, call_site=it.call.call_site, collective=it.seq)
            gs = engine.groups.get(it.group.group_id)
            inst = gs.instances.get(it.seq) if gs else None
            if inst is not None:
                arrived = {it.group.ranks[i] for i in inst.runs}
                missing = [r for r in it.group.ranks if r not in arrived]
                entry["missing"] = missing
                waits += missing
            else:
                for h in it.waiting:
                    if not h.done:
                        waits.append(h.dst if h.kind == "send" else h.src)
    return entry, sorted(set(w for w in waits if w is not None))


def _line(entry: dict, engine: Any) -> str:
    op, rank = entry["op"], entry["rank"]
    if op in ("send", "recv"):
        peer = "any" if entry["peer"] is None else entry["peer"]
        arg = "dst" if op == "send" else "src"
        text = f"rank {rank} is blocked in {op}({arg}={peer}, tag={entry['tag']}) on group {entry['group']}"
    else:
        text = f"rank {rank} is blocked in {op} (collective {entry.get('collective')} of group {entry['group']})"
        missing = entry.get("missing")
        if missing:
            done = [r for r in missing if engine.ranks[r].done]
            text += f", waiting for ranks {missing} to join it"
            if done:
                text += f" (ranks {done} finished without calling it)"
    if entry["call_site"]:
        text += f" at {entry['call_site']}"
    return text


def deadlock_error(engine: Any) -> DeadlockError:
    """The DeadlockError describing the engine's current state (no rank can run)."""
    graph = nx.DiGraph()
    blocked = []
    lines = []
    for rs in engine.ranks:
        if rs.done:
            graph.add_node(rs.rank, finished=True)
            continue
        entry, waits = _blocked_entry(engine, rs)
        blocked.append(entry)
        graph.add_node(rs.rank, **{k: v for k, v in entry.items() if k != "rank"})
        for w in waits:
            graph.add_edge(rs.rank, w)
        lines.append("  " + _line(entry, engine))
    unmatched = [p.describe() for by_src in engine.sends.values() for q in by_src.values() for p in q]
    unmatched += [p.describe() for waiting in engine.recvs.values() for p in waiting]
    try:
        cycle = [u for u, _ in nx.find_cycle(graph)]
    except nx.NetworkXNoCycle:
        cycle = []
    finished = [rs.rank for rs in engine.ranks if rs.done]
    head = f"deadlock: no rank can proceed ({len(blocked)} blocked"
    head += f", ranks {finished} finished)" if finished else ")"
    parts = [head, *lines]
    if cycle:
        parts.append("wait-for cycle: " + " -> ".join(str(r) for r in cycle + cycle[:1]))
    if unmatched:
        parts.append("unmatched messages:")
        parts += [f"  {u}" for u in unmatched[:20]]
        if len(unmatched) > 20:
            parts.append(f"  ... and {len(unmatched) - 20} more")
    parts.append(f"replay token: {engine.token()}")
    return DeadlockError("\n".join(parts), graph=graph, blocked=blocked, unmatched=unmatched, cycle=cycle)


def leaks(engine: Any) -> list[str]:
    """What a finished run left behind: unmatched messages, never-waited works, groups not destroyed."""
    out = [f"unmatched {p.describe()}" for by_src in engine.sends.values() for q in by_src.values() for p in q]
    out += [f"unmatched {p.describe()}" for waiting in engine.recvs.values() for p in waiting]
    out += [f"rank {rank}: work of {what} was never waited" for rank, what in engine.unwaited.values()]
    return out


def undestroyed(engine: Any) -> list[int]:
    """The ranks whose default process group was never destroyed."""
    return [rs.rank for rs in engine.ranks if rs.world is not None and rs.world.initialized]
