"""Reports a person can act on: the deadlock report and the leak report.

Each is made from the run's state as the engine hands it over (its ranks, groups, unmatched posts); nothing
here changes the run.
"""

from __future__ import annotations

from typing import Any, Sequence

from simdist.core import DeadlockError

from ._state import CollectiveRun, GroupState, Post, RankState

__all__ = ["deadlock_error", "leaks", "undestroyed"]


def _group_names(ranks: Sequence[RankState]) -> dict[int, str]:
    """The names the program gave its groups (``new_group(..., group_desc=...)``), by group id."""
    return {g.group_id: g.group_desc for rs in ranks if rs.world is not None
            for g in rs.world.groups if g.group_desc}  # fmt: skip


def _group(gid: int | None, names: dict[int, str]) -> str:
    return f"group {gid if gid is None else names.get(gid, gid)}"


def _blocked_entry(
    groups: dict[int, GroupState], size: int, rs: RankState, missing_of: dict[tuple[int, int], list[int] | None]
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
                gs = groups.get(it.group)
                members = gs.ranks if gs else range(size)
                waits += [r for r in members if r != rs.rank]
            else:
                waits.append(peer)
        elif isinstance(it, CollectiveRun):
            entry.update(op=it.call.op, group=it.group.group_id, call_site=it.call.call_site, collective=it.seq)
            key = (it.group.group_id, it.seq)
            if key not in missing_of:
                gs = groups.get(it.group.group_id)
                inst = gs.instances.get(it.seq) if gs else None
                missing_of[key] = None if inst is None else [r for i, r in enumerate(it.group.ranks)
                                                             if i not in inst.runs]  # fmt: skip
            missing = missing_of[key]
            if missing is not None:  # (a collective every member joined has completed)
                entry["missing"] = list(missing)
                waits += missing
    return entry, sorted(set(w for w in waits if w is not None))


def _line(entry: dict, ranks: Sequence[RankState], names: dict[int, str]) -> str:
    op, rank, group = entry["op"], entry["rank"], _group(entry["group"], names)
    if op in ("send", "recv"):
        peer = "any" if entry["peer"] is None else entry["peer"]
        arg = "dst" if op == "send" else "src"
        text = f"rank {rank} is blocked in {op}({arg}={peer}, tag={entry['tag']}) on {group}"
    else:
        text = f"rank {rank} is blocked in {op} (collective {entry.get('collective')} of {group})"
        missing = entry.get("missing")
        if missing:
            done = [r for r in missing if ranks[r].done]
            text += f", waiting for ranks {missing} to join it"
            if done:
                text += f" (ranks {done} finished without calling it)"
    if entry["call_site"]:
        text += f" at {entry['call_site']}"
    return text


def deadlock_error(
    ranks: Sequence[RankState], groups: dict[int, GroupState], unmatched: list[Post], token: str
) -> DeadlockError:
    """The DeadlockError describing a run in which no rank can run: its ``ranks``, ``groups``, the program's
    ``unmatched`` sends and receives (a collective posts none before every member joins) and its replay ``token``."""
    import networkx as nx  # (only a deadlock needs it: a first simulation in a process does not wait for it)

    graph = nx.DiGraph()
    blocked = []
    lines = []
    names = _group_names(ranks)
    missing_of: dict[tuple[int, int], list[int] | None] = {}
    for rs in ranks:
        if rs.done:
            graph.add_node(rs.rank, finished=True)
            continue
        entry, waits = _blocked_entry(groups, len(ranks), rs, missing_of)
        entry["group_desc"] = names.get(entry["group"])
        blocked.append(entry)
        graph.add_node(rs.rank, **{k: v for k, v in entry.items() if k != "rank"})
        for w in waits:
            graph.add_edge(rs.rank, w)
        lines.append("  " + _line(entry, ranks, names))
    unmatched_lines = shown = [p.describe(_group(p.group, names)) for p in unmatched]
    try:
        cycle = [u for u, _ in nx.find_cycle(graph)]
    except nx.NetworkXNoCycle:
        cycle = []
    finished = [rs.rank for rs in ranks if rs.done]
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
    parts.append(f"replay token: {token}")
    return DeadlockError("\n".join(parts), graph=graph, blocked=blocked, unmatched=unmatched_lines, cycle=cycle)


def leaks(unmatched: list[Post], unwaited: dict[int, tuple[int, str]]) -> list[str]:
    """What a finished run left behind: its ``unmatched`` sends and receives, and the works never waited
    (``unwaited``: each one's rank and what it was)."""
    out = [f"unmatched {p.describe()}" for p in unmatched]
    out += [f"rank {rank}: work of {what} was never waited" for rank, what in unwaited.values()]
    return out


def undestroyed(ranks: Sequence[RankState]) -> list[int]:
    """The ranks whose default process group was never destroyed."""
    return [rs.rank for rs in ranks if rs.world is not None and rs.world.initialized]
