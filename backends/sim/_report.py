"""Reports a person can act on: the deadlock report and the leak report."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simdist.core import DeadlockError

from ._messages import CollectiveRun, Post

if TYPE_CHECKING:
    from ._engine import Engine
    from ._state import RankState

__all__ = ["deadlock_error", "leaks", "undestroyed"]


def _group_names(engine: Engine) -> dict[int, str]:
    """The names the program gave its groups (``new_group(..., group_desc=...)``), by group id."""
    return {g.group_id: g.group_desc for rs in engine.ranks if rs.world is not None
            for g in rs.world.groups if g.group_desc}  # fmt: skip


def _group(gid: int | None, names: dict[int, str]) -> str:
    return f"group {gid if gid is None else names.get(gid, gid)}"


def _blocked_entry(
    engine: Engine, rs: RankState, missing_of: dict[tuple[int, int], list[int] | None]
) -> tuple[dict, list[int]]:
    """What ``rs`` is blocked on, and the ranks it waits for.

    ``missing_of`` keeps, by (group id, collective number), the members that have not joined that
    collective: every blocked member of it waits for the same ranks, found once, not once per member.
    """
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
            key = (it.group.group_id, it.seq)
            if key not in missing_of:
                gs = engine.groups.get(it.group.group_id)
                inst = gs.instances.get(it.seq) if gs else None
                missing_of[key] = None if inst is None else [r for i, r in enumerate(it.group.ranks)
                                                             if i not in inst.runs]  # fmt: skip
            missing = missing_of[key]
            if missing is not None:  # (a collective every member joined has completed)
                entry["missing"] = list(missing)
                waits += missing
    return entry, sorted(set(w for w in waits if w is not None))


def _line(entry: dict, engine: Engine, names: dict[int, str]) -> str:
    op, rank, group = entry["op"], entry["rank"], _group(entry["group"], names)
    if op in ("send", "recv"):
        peer = "any" if entry["peer"] is None else entry["peer"]
        arg = "dst" if op == "send" else "src"
        text = f"rank {rank} is blocked in {op}({arg}={peer}, tag={entry['tag']}) on {group}"
    else:
        text = f"rank {rank} is blocked in {op} (collective {entry.get('collective')} of {group})"
        missing = entry.get("missing")
        if missing:
            done = [r for r in missing if engine.ranks[r].done]
            text += f", waiting for ranks {missing} to join it"
            if done:
                text += f" (ranks {done} finished without calling it)"
    if entry["call_site"]:
        text += f" at {entry['call_site']}"
    return text


def _unmatched(engine: Engine, names: dict[int, str]) -> list[str]:
    """The program's unmatched sends and receives, described (a collective posts none before every member joins)."""
    posts = [p for by_src in engine.sends.values() for q in by_src.values() for p in q]
    posts += [p for waiting in engine.recvs.values() for p in waiting]
    return [p.describe(_group(p.group, names)) for p in posts]


def deadlock_error(engine: Engine) -> DeadlockError:
    """The DeadlockError describing the engine's current state (no rank can run)."""
    import networkx as nx  # (only a deadlock needs it: a first simulation in a process does not wait for it)

    graph = nx.DiGraph()
    blocked = []
    lines = []
    names = _group_names(engine)
    missing_of: dict[tuple[int, int], list[int] | None] = {}
    for rs in engine.ranks:
        if rs.done:
            graph.add_node(rs.rank, finished=True)
            continue
        entry, waits = _blocked_entry(engine, rs, missing_of)
        entry["group_desc"] = names.get(entry["group"])
        blocked.append(entry)
        graph.add_node(rs.rank, **{k: v for k, v in entry.items() if k != "rank"})
        for w in waits:
            graph.add_edge(rs.rank, w)
        lines.append("  " + _line(entry, engine, names))
    unmatched = shown = _unmatched(engine, names)
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
    if shown:
        parts.append("unmatched messages:")
        parts += [f"  {u}" for u in shown[:20]]
        if len(shown) > 20:
            parts.append(f"  ... and {len(shown) - 20} more")
    parts.append(f"replay token: {engine.token()}")
    return DeadlockError("\n".join(parts), graph=graph, blocked=blocked, unmatched=unmatched, cycle=cycle)


def leaks(engine: Engine) -> list[str]:
    """What a finished run left behind: unmatched messages, never-waited works, groups not destroyed."""
    out = [f"unmatched {p.describe()}" for by_src in engine.sends.values() for q in by_src.values() for p in q]
    out += [f"unmatched {p.describe()}" for waiting in engine.recvs.values() for p in waiting]
    out += [f"rank {rank}: work of {what} was never waited" for rank, what in engine.unwaited.values()]
    return out


def undestroyed(engine: Engine) -> list[int]:
    """The ranks whose default process group was never destroyed."""
    return [rs.rank for rs in engine.ranks if rs.world is not None and rs.world.initialized]
