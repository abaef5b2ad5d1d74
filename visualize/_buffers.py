"""The per-rank buffer table of one algorithm step, each value tagged with its origin."""

from __future__ import annotations

from dataclasses import dataclass

from simdist._trace import Trace

from ._graph import _default_collective, steps, world_of
from ._runs import decode, layout_chunk, layout_chunks

__all__ = ["Cell", "Row", "BufferTable", "buffer_table"]


@dataclass(frozen=True, slots=True)
class Cell:
    """One value of a rank's buffer.

    Attributes:
        value: the number in the buffer.
        chunk: the block of the buffer this position belongs to (``None`` if unknown).
        ranks: the ranks whose input the value holds (all ``p`` once fully reduced; empty
            if nothing arrived yet or the run carries no encoding).
        origin: the single rank it came from, else ``None``.
        source_chunk: for moved (unreduced) data, the block of the origin's input it was.
    """

    value: float
    chunk: int | None
    ranks: tuple[int, ...]
    origin: int | None
    source_chunk: int | None


@dataclass(frozen=True, slots=True)
class Row:
    """One rank's leading values after a step.

    ``source`` says where they come from: ``'step'`` (this step's snapshot), ``'earlier'``
    (the latest earlier snapshot: the simulator records none for a step whose messages
    had completed before the rank waited), ``'final'`` (the collective's result, for steps
    at or after the last one) or ``'input'`` (before any snapshot).
    """

    rank: int
    cells: tuple[Cell, ...]
    source: str
    snapshot_step: int | None


@dataclass(frozen=True, slots=True)
class BufferTable:
    """The leading values of every rank's buffer after ``step`` (``rows[r]`` is rank ``r``).

    ``step`` is one past the last step when the table shows the collective's result.
    """

    op: str | None
    algorithm: str | None
    step: int
    world: int
    encoding: str
    elements: int | None
    rows: tuple[Row, ...]


def _initial(op: str, rank: int, world: int, elements: int, encoding: str, root: int) -> list[float]:
    """The snapshot buffer of ``collective_run`` before the collective (its inputs, or zeros)."""
    if op in ("all_reduce", "reduce"):
        return [float(2**rank) if encoding == "bits" else 1.0] * min(elements, 64)
    if op == "gather" and rank != root:
        return [float(1 + rank)] * min(elements, 64)
    size = elements * world if op in ("all_gather", "all_to_all") or op == "gather" else elements
    if op == "broadcast" and rank == root:
        return [float(1 + root + world * layout_chunk(op, rank, i, world, elements)) for i in range(min(size, 64))]
    return [0.0] * min(size, 64)


def buffer_table(trace: Trace, step: int | None = None, collective_id: int | None = None) -> BufferTable:
    """Every rank's leading buffer values after algorithm ``step`` (``None``: after the collective), with origins.

    Values come from the trace's ``'step'`` snapshots (``record_steps=True``). For a run
    of :func:`collective_run` the origin of each value is decoded from the input
    encoding, so cells can be coloured by chunk or by origin rank; for other traces
    ``ranks``/``origin`` are empty and ``chunk`` is ``None``. A step beyond the last
    shows the collective's result, as does ``step=None`` (the buffers after the last
    step may still be scratch: Bruck rotates its blocks into place after it). ``step=-1``
    shows the inputs.
    """
    cid = _default_collective(trace, collective_id)
    meta = trace.meta.get("visualize") or {}
    world = world_of(trace)
    encoding = meta.get("encoding", "none")
    elements = meta.get("elements")
    op, algorithm = meta.get("op"), meta.get("algorithm")
    snaps: dict[int, dict[int, list]] = {}
    for e in trace.events:
        if e.kind == "step" and e.collective_id == cid and e.snapshot is not None:
            snaps.setdefault(e.rank, {})[e.step] = e.snapshot
            op, algorithm = op or e.op, algorithm or e.algorithm
    known = steps(trace, cid)
    last = max([s for by in snaps.values() for s in by] + known, default=-1)
    final = meta.get("final")
    rows = []
    if step is None:
        step = last + 1 if final is not None else last
    for r in range(world):
        mine = snaps.get(r, {})
        earlier = [s for s in mine if s <= step]
        if step in mine:
            values, source, at = mine[step], "step", step
        elif final is not None and step >= last >= 0:
            values, source, at = final[r], "final", None
        elif earlier:
            at = max(earlier)
            values, source = mine[at], "earlier"
        elif meta and op is not None and elements is not None:
            values, source, at = _initial(op, r, world, elements, encoding, meta.get("root", 0)), "input", None
        else:
            values, source, at = [], "input", None
        chunks = layout_chunks(op, r, len(values), world, elements) if meta and elements else [None] * len(values)
        cells = []
        for v, chunk in zip(values, chunks):
            ranks, src_chunk = decode(v, encoding, world)
            cells.append(Cell(v, chunk, ranks, ranks[0] if len(ranks) == 1 else None, src_chunk))
        rows.append(Row(r, tuple(cells), source, at))
    return BufferTable(op, algorithm, step, world, encoding, elements, tuple(rows))
