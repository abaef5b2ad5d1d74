"""Deadlock scenarios for teaching: small programs that deadlock, each with a sentence on why.

Each program is the whole file a student would write, ``program.py``: it is compiled
under that name, so the call sites of its ``DeadlockError`` (``program.py:8``) are the
line numbers of the source shown. ``run_scenario(name)`` runs it on the simulator and
returns the error; ``scenario_source(name)`` is the text shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import networkx as nx

import simdist as dist

__all__ = [
    "PROGRAM",
    "Blocked",
    "Scenario",
    "SCENARIOS",
    "run_scenario",
    "scenario_source",
    "scenario_main",
    "where_blocked",
]

PROGRAM = "program.py"
"""The file name the scenarios' programs run under (and their call sites name)."""


@dataclass(frozen=True)
class Scenario:
    """A deadlocking program (the text of ``program.py``, defining ``main(rank)``), its world size, and why."""

    source: str
    world: int
    why: str


def _program(body: str, world: int) -> str:
    """``program.py``: the imports, ``main(rank)`` with ``body``, and the line that runs it on ``world`` ranks."""
    return (f"import torch\nimport simdist as dist\n\n\ndef main(rank):\n{body}\n\n"
            f'if __name__ == "__main__":\n    dist.simulate(main, {world})\n')  # fmt: skip


SCENARIOS: dict[str, Scenario] = {
    "head-to-head sends": Scenario(_program('''\
    dist.init_process_group("gloo")
    t = torch.zeros(4)
    dist.send(t, dst=1 - rank)  # both send first
    dist.recv(t, src=1 - rank)  # never reached
''', 2), 2, "Sends are synchronous: each rank's send waits for a receive the other rank only posts after its "
          "own send."),
    "send around a ring": Scenario(_program('''\
    dist.init_process_group("gloo")
    n = dist.get_world_size()
    t = torch.zeros(2)
    dist.send(t, dst=(rank + 1) % n)
    dist.recv(t, src=(rank - 1) % n)  # never reached
''', 4), 4, "Every rank sends to its right neighbour first; nobody receives, so the wait-for graph is one "
          "cycle through all ranks."),
    "a rank skips a collective": Scenario(_program('''\
    dist.init_process_group("gloo")
    t = torch.ones(3)
    if rank != 2:  # rank 2 never joins the all_reduce
        dist.all_reduce(t)
''', 3), 3, "Ranks 0 and 1 wait in all_reduce for rank 2, which finished without calling it."),
    "collectives in opposite orders": Scenario(_program('''\
    dist.init_process_group("gloo")
    a = dist.new_group([0, 1], group_desc="a")
    b = dist.new_group([0, 1], group_desc="b")
    t = torch.ones(2)
    if rank == 0:
        dist.all_reduce(t, group=a)
        dist.all_reduce(t, group=b)
    else:  # the same two, in the other order
        dist.all_reduce(t, group=b)
        dist.all_reduce(t, group=a)
''', 2), 2, "Rank 0 enters the all_reduce of group a, rank 1 that of group b: each waits for the other."),
    "tag mismatch": Scenario(_program('''\
    dist.init_process_group("gloo")
    t = torch.zeros(1)
    if rank == 0:
        dist.send(t, dst=1, tag=1)
    else:
        dist.recv(t, src=0, tag=2)  # the send's tag is 1
''', 2), 2, "A receive matches only a send with its tag; the message waits forever unmatched."),
    "point-to-point against a barrier": Scenario(_program('''\
    dist.init_process_group("gloo")
    t = torch.zeros(1)
    if rank == 0:
        dist.recv(t, src=1)  # rank 1 sends later
        dist.barrier()
    else:
        dist.barrier()  # waits for rank 0
        dist.send(t, dst=0)
''', 2), 2, "Rank 0 waits to receive before the barrier; rank 1 sends only after it."),
}  # fmt: skip


def _scenario(name: str) -> Scenario:
    if name not in SCENARIOS:
        raise ValueError(f"name={name!r} is not a scenario; expected one of {sorted(SCENARIOS)}")
    return SCENARIOS[name]


def scenario_main(name: str, module: str = "program") -> Callable:
    """The ``main`` of scenario ``name``'s program, compiled as ``program.py`` and run as module ``module``.

    With ``module="__main__"`` the program also runs itself (its last line), as
    ``python program.py`` would, and raises that run's ``DeadlockError``.
    """
    namespace: dict[str, Any] = {"__name__": module, "__file__": PROGRAM}
    exec(compile(_scenario(name).source, PROGRAM, "exec"), namespace)  # noqa: S102 - the scenarios' own text
    return namespace["main"]


def run_scenario(name: str, **options: Any) -> Any:
    """The ``DeadlockError`` of scenario ``name``: its program run on the simulator (seed 0, as it runs itself).

    ``options`` go to :func:`simdist.simulate`.

    Args:
        name: a key of ``SCENARIOS`` (``"head-to-head sends"``, ...).
        options: :func:`simdist.simulate`'s keyword arguments.

    Returns:
        The ``DeadlockError`` (``cycle``, ``graph``, ``schedule``, ...).

    Raises:
        ValueError: ``name`` is not a scenario.

    Example:
        >>> from simdist.visualize import run_scenario
        >>> err = run_scenario("head-to-head sends")          # both ranks send first
        >>> type(err).__name__, err.cycle
        ('DeadlockError', [0, 1])
    """
    sc = _scenario(name)
    try:
        dist.simulate(scenario_main(name), sc.world, leaks="ignore", **options)
    except dist.DeadlockError as err:
        return err
    raise RuntimeError(f"scenario {name!r} did not deadlock")  # a broken scenario, never a user error


def scenario_source(name: str) -> str:
    """The text of scenario ``name``'s ``program.py`` (line 1 first, as its call sites count).

    Args:
        name: a key of ``SCENARIOS``.

    Returns:
        The program's source text.

    Raises:
        ValueError: ``name`` is not a scenario.

    Example:
        >>> from simdist.visualize import scenario_source
        >>> scenario_source("head-to-head sends").splitlines()[7]
        '    dist.send(t, dst=1 - rank)  # both send first'
    """
    return _scenario(name).source


@dataclass(frozen=True)
class Blocked:
    """Where one rank of a deadlock stopped: its ``line`` of the program (``None`` if unknown) and that
    line's ``code``, the ``call`` it is blocked in (``'finished'`` if it returned), and ``waits`` (who
    must call what to release it)."""

    rank: int
    line: int | None
    code: str
    call: str
    waits: str


def where_blocked(g: nx.DiGraph, source: str) -> list[Blocked]:
    """Each rank of the wait-for graph ``g`` (:func:`wait_for`) with the line of ``source`` it is blocked at.

    Args:
        g: the :func:`wait_for` graph of a deadlock.
        source: the program's text, to quote its lines.

    Returns:
        One ``Blocked`` (``rank``, ``line``, ``code``, ``call``, ``waits``) per rank, by rank.

    Example:
        >>> from simdist.visualize import run_scenario, scenario_source, wait_for, where_blocked
        >>> name = "head-to-head sends"
        >>> b = where_blocked(wait_for(run_scenario(name)), scenario_source(name))[0]
        >>> b.rank, b.line, b.call, b.waits
        (0, 8, 'send(dst=1)', 'rank 1 to call recv(src=0)')
    """
    lines = source.splitlines()
    out = []
    for n in sorted(g.nodes):
        d = g.nodes[n]
        line = d.get("line")
        code = lines[line - 1].strip() if line is not None and 0 < line <= len(lines) else ""
        peers = sorted(g.successors(n))
        waits = ""
        if peers:
            first = g.edges[n, peers[0]].get("waits_for", "?")
            who = "rank" if len(peers) == 1 else "ranks"
            waits = f"{who} {', '.join(map(str, peers))} to call {first}"
        out.append(Blocked(n, line, code, d.get("call", "?"), waits))
    return out
