"""Communication rounds: which of a collective's messages could travel at the same time.

A rank runs an algorithm in *steps*: it posts some sends and receives, then waits on
them. Steps are per rank; rounds are global. The round of a message is computed from
the trace's message events and the ``'received'`` events of ``record_steps=True``
(:func:`round_of` has the definition).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from simdist.core._trace import Event, Trace

__all__ = ["Rounds", "message_rounds", "round_of"]


@dataclass(frozen=True, slots=True)
class Rounds:
    """The rounds of one collective.

    Attributes:
        collective_id: the collective.
        count: the number of rounds (every round ``1 .. count`` has a message).
        of: the index in ``trace.events`` of each message -> its round.
        waited: rank -> its step -> the latest round among the messages that step's wait
            completed (steps that received nothing are absent).
    """

    collective_id: int | None
    count: int
    of: dict[int, int]
    waited: dict[int, dict[int, int]]

    def after(self, rank: int, round: int) -> int | None:
        """How many steps ``rank`` has completed once round ``round`` is over.

        The largest ``k`` such that every message ``rank`` waited on in its first ``k``
        steps is of round ``round`` or earlier (``None``: all of its steps).
        """
        late = [s for s, r in self.waited.get(rank, {}).items() if r > round]
        return min(late) if late else None


def _matched(events: list[Event], cid: int | None = None) -> dict[int | None, tuple[list[int], dict[int, int]]]:
    """Per collective (only ``cid`` if given): its messages (indices) and, for each, the
    receiver's step that waited on it.

    The ``k``-th ``'received'`` event of a receiver for one sender and tag is the ``k``-th
    message between them with that tag (messages between a pair on one tag do not
    overtake).
    """
    msgs: dict[int | None, list[int]] = defaultdict(list)
    sent: dict[tuple, list[int]] = defaultdict(list)
    got: dict[tuple, list[Event]] = defaultdict(list)
    for i, e in enumerate(events):
        if e.collective_id is None or (cid is not None and e.collective_id != cid):
            continue
        if e.kind == "message" and e.peer is not None:
            msgs[e.collective_id].append(i)
            sent[(e.collective_id, e.rank, e.peer, e.tag)].append(i)
        elif e.kind == "received":
            got[(e.collective_id, e.peer, e.rank, e.tag)].append(e)
    waits: dict[int | None, dict[int, int]] = defaultdict(dict)
    for key, indices in sent.items():
        for i, r in zip(indices, got.get(key, [])):
            if r.step is not None:
                waits[key[0]][i] = r.step
    return {c: (m, waits[c]) for c, m in msgs.items()}


def round_of(trace: Trace, collective_id: int | None) -> Rounds:
    """The communication round of each message of one collective.

    A message's round is one more than the latest round among what its sender did
    before sending it, in the sender's program order: the messages it received (a
    receive counts once the step that waits on it has completed) and the messages it
    sent in its earlier steps (a rank sends one step's messages at once, then waits). A
    message sent before its sender received or sent anything is in round 1. So round
    ``k`` is the earliest hop at which a message can go: it needs the results of round
    ``k - 1``. Messages a rank posts in one step share a round.

    The receiving steps come from the ``'received'`` events of a simulator trace recorded
    with ``record_steps=True``. Without them a receive is not known to precede anything,
    and a message's round is the number of steps in which its sender sent before it, plus one.

    Args:
        trace: a ``simdist.Trace`` (with ``'received'`` events for exact rounds).
        collective_id: the collective.

    Returns:
        A ``Rounds``: ``count`` (the number of rounds), ``of`` (event index -> round),
        ``waited``.

    Raises:
        ValueError: if the trace's messages depend on each other in a cycle.

    Example:
        >>> from simdist.visualize import collective_run, round_of
        >>> rounds = round_of(collective_run("all_reduce", "recursive_doubling", 8, 64).trace, 0)
        >>> rounds.count                                       # log2(8) rounds
        3
    """
    msgs, waits = _matched(trace.events, collective_id).get(collective_id, ([], {}))
    return _rounds(trace.events, collective_id, msgs, waits)


def _rounds(events: list[Event], collective_id: int | None, msgs: list[int], waits: dict[int, int]) -> Rounds:
    sends: dict[tuple[int, int], list[int]] = defaultdict(list)  # (rank, step) -> messages it sent
    recvs: dict[tuple[int, int], list[int]] = defaultdict(list)  # (rank, step) -> messages its wait completed
    last: dict[int, int] = defaultdict(int)  # rank -> one past its last step with a message
    for i in msgs:
        e = events[i]
        step = e.step or 0
        sends[(e.rank, step)].append(i)
        last[e.rank] = max(last[e.rank], step + 1)
        if i in waits:
            recvs[(e.peer, waits[i])].append(i)
            last[e.peer] = max(last[e.peer], waits[i] + 1)
    # before[(rank, s)]: the latest round among what rank sent or received before step s
    before: dict[tuple[int, int], int] = {}

    def deps(node: tuple[int, int]) -> list[tuple[int, int]]:
        rank, s = node
        if s == 0:
            return []
        return [(rank, s - 1)] + [(events[i].rank, events[i].step or 0) for i in recvs.get((rank, s - 1), [])]

    def value(node: tuple[int, int]) -> int:
        rank, s = node
        if s == 0:
            return 0
        prev = before[(rank, s - 1)]
        out = prev + 1 if sends.get((rank, s - 1)) else prev
        for i in recvs.get((rank, s - 1), []):
            out = max(out, before[(events[i].rank, events[i].step or 0)] + 1)
        return out

    for rank, end in last.items():
        _evaluate((rank, end), deps, value, before)
    of = {i: before[(events[i].rank, events[i].step or 0)] + 1 for i in msgs}
    waited: dict[int, dict[int, int]] = defaultdict(dict)
    for (rank, s), indices in recvs.items():
        waited[rank][s] = max(of[i] for i in indices)
    return Rounds(collective_id, max(of.values(), default=0), of, dict(waited))


def _evaluate(root, deps, value, memo: dict) -> None:
    """Fill ``memo[root]`` (and what it depends on) with ``value``, depth first, without recursion."""
    stack, open_ = [(root, False)], set()
    while stack:
        node, expanded = stack.pop()
        if node in memo:
            continue
        if expanded:
            memo[node] = value(node)
            open_.discard(node)
            continue
        if node in open_:  # met again below itself
            raise ValueError(f"the trace's messages depend on each other in a cycle (rank {node[0]}, step {node[1]})")
        open_.add(node)
        stack.append((node, True))
        stack.extend((d, False) for d in deps(node) if d not in memo)


def message_rounds(trace: Trace) -> list[int | None]:
    """The round (:func:`round_of`) of every event of ``trace`` that is a collective's message, else ``None``.

    Aligned with ``trace.events``; each collective's rounds start at 1.

    Args:
        trace: a ``simdist.Trace``.

    Returns:
        One entry per event of ``trace``: its round, or ``None``.

    Example:
        >>> from simdist.visualize import collective_run, message_rounds
        >>> rounds = message_rounds(collective_run("broadcast", "binomial", 4, 64).trace)
        >>> sorted(r for r in rounds if r is not None)          # 1 message, then 2
        [1, 2, 2]
    """
    out: list[int | None] = [None] * len(trace.events)
    for cid, (msgs, waits) in _matched(trace.events).items():
        for i, r in _rounds(trace.events, cid, msgs, waits).of.items():
            out[i] = r
    return out
