"""The per-rank buffer table after one communication round, each value tagged with its origin."""

from __future__ import annotations

from dataclasses import dataclass

from simdist.core._trace import Trace

from ._graph import _default_collective, world_of
from ._rounds import round_of
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
    """One rank's leading values after a round.

    ``source`` says where they come from: ``'step'`` (the rank's output buffer after the
    steps it had completed by then; ``snapshot_step`` says how many), ``'work'`` (the
    working data the algorithm keeps outside its output, such as reduce_scatter's partial
    sums or Bruck's blocks, after as many steps), ``'final'`` (the collective's result)
    or ``'input'`` (rebuilt from the run's inputs: the trace has no snapshots).
    """

    rank: int
    cells: tuple[Cell, ...]
    source: str
    snapshot_step: int | None


@dataclass(frozen=True, slots=True)
class BufferTable:
    """The leading values of every rank's buffer after round ``step`` (``rows[r]`` is rank ``r``).

    ``step`` is 0 for the inputs and ``rounds + 1`` when the table shows the collective's
    result (after any local work that follows the last round, such as Bruck's rotation).
    """

    op: str | None
    algorithm: str | None
    step: int
    world: int
    encoding: str
    elements: int | None
    rows: tuple[Row, ...]
    rounds: int = 0


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
    """Every rank's leading buffer values after communication round ``step``, with origins.

    Round ``k`` is over for a rank once it has received and combined every message of
    rounds ``1 .. k`` it waits on, and nothing later (rounds: :func:`round_of`): the row
    is the rank's snapshot after its last step that waited only on such messages.
    ``step=0`` shows the data before any message; ``None`` or a step past the last round
    shows the collective's result. Snapshots are recorded by the simulator with
    ``record_steps=True``: each rank's output buffer, or the working data of algorithms
    that keep it elsewhere (reduce_scatter's partial sums in the input's layout, Bruck's
    blocks before their final local rotation; rows with ``source == 'work'``).

    For a run of :func:`collective_run` the origin of each value is decoded from the
    input encoding, so cells can be coloured by chunk or by origin rank; for other
    traces ``ranks``/``origin`` are empty and ``chunk`` is ``None``.

    Args:
        trace: a trace recorded with ``record_steps=True`` (as :func:`collective_run` records).
        step: the round, from 0 (before any message); ``None`` for the result.
        collective_id: the collective; default the first with messages.

    Returns:
        A ``BufferTable``: one ``Row`` per rank (its ``cells``: ``value``, ``chunk``, ``ranks``
        (the origin ranks summed into it), ``origin``), with ``op``, ``algorithm``, ``step``,
        ``rounds``.

    Raises:
        ValueError: if ``step`` is negative.

    Example:
        >>> from simdist.visualize import buffer_table, collective_run
        >>> trace = collective_run("all_reduce", "ring", 4, 64).trace
        >>> [cell.ranks for cell in buffer_table(trace, 3).rows[0].cells][:4]   # chunk 1 summed on rank 0
        [(0,), (0,), (0, 1, 2, 3), (0, 1, 2, 3)]
        >>> {cell.value for row in buffer_table(trace).rows for cell in row.cells}   # 1 + 2 + 4 + 8
        {15.0}
    """
    if step is not None and (not isinstance(step, int) or step < 0):
        raise ValueError(f"step={step!r} must be a round number >= 0 (0: the inputs) or None (the result)")
    cid = _default_collective(trace, collective_id)
    meta = trace.meta.get("visualize") or {}
    world = world_of(trace)
    encoding = meta.get("encoding", "none")
    elements = meta.get("elements")
    op, algorithm = meta.get("op"), meta.get("algorithm")
    snaps: dict[int, dict[int, tuple[str, list]]] = {}
    for e in trace.events:
        if e.kind in ("step", "work") and e.collective_id == cid and e.snapshot is not None:
            snaps.setdefault(e.rank, {})[e.step] = (e.kind, e.snapshot)
            op, algorithm = op or e.op, algorithm or e.algorithm
    rounds = round_of(trace, cid)
    final = meta.get("final")
    if step is None or step > rounds.count:
        step = rounds.count + 1
    rows = []
    for r in range(world):
        mine = snaps.get(r, {})
        if step > rounds.count and final is not None:
            values, source, at = final[r], "final", None
        elif mine:
            done = rounds.after(r, step)
            at = max(mine) if done is None else max(k for k in mine if k <= done)
            source, values = mine[at]
        elif meta and op is not None and elements is not None:
            values, source, at = _initial(op, r, world, elements, encoding, meta.get("root", 0)), "input", None
        else:
            values, source, at = [], "input", None
        laid = layout_chunks(op, r, len(values), world, elements) if meta and elements else [None] * len(values)
        cells = []
        for i, v in enumerate(values):
            ranks, src_chunk = decode(v, encoding, world)
            origin = ranks[0] if len(ranks) == 1 else None
            chunk = laid[i]
            if source == "work" and meta and elements:
                # reduce_scatter's partial sums lie in its input's layout; moved blocks
                # lie wherever the algorithm keeps them, so their chunk is their origin
                chunk = i // elements if encoding == "bits" else origin
            cells.append(Cell(v, chunk, ranks, origin, src_chunk))
        rows.append(Row(r, tuple(cells), source, at))
    return BufferTable(op, algorithm, step, world, encoding, elements, tuple(rows), rounds.count)
