"""The simulator's one trace recorder: a method per kind of event, the only code that writes rows.

The engine, its groups and the step recorder (:mod:`._record`) report what happened here,
in their own terms (a matched message, a finished collective, a step's snapshot); this
module decides which event fields that makes (:class:`simdist.core._trace.Event`). Like an
instrument of trio's run loop, it only observes: nothing here changes the run.

Kinds written: ``send``/``recv`` (a user's point-to-point call, on its rank's lane),
``message`` (bytes moving between two ranks, of a user's call or of a collective),
``collective`` (one rank's part of a collective, from its call to its end), ``step``
and ``work`` (a rank's data at a step boundary of a collective, with ``record_steps``),
``received`` (the step in which a rank's receive of a collective completed) and
``compute`` (annotated computation).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from simdist.core import Trace

    from ._state import CollectiveRun, Message, Post

__all__ = ["TraceRecorder"]


class TraceRecorder:
    """Writes the events of one simulated run into ``trace``."""

    __slots__ = ("_record", "trace")

    def __init__(self, trace: Trace):
        self.trace = trace
        self._record = trace.record

    def message(self, s: Post, start: float, arrival: float) -> None:
        """The program's send ``s`` matched a receive: its bytes left at ``start`` and arrived at ``arrival``."""
        self._record(
            s.src, "message", s.kind, s.group, s.dst, s.tag, s.nbytes, start, arrival, None, None, None, s.call_site
        )

    def moves(self, run: CollectiveRun) -> Callable[[Message, float, float], None]:
        """What records each message of ``run``'s collective: ``moved(m, start, arrival)``, the send ``m`` matched
        its receive and its bytes left at ``start`` and arrived at ``arrival``."""
        call = run.call
        write = self.trace.writer("message", call.op, run.group.group_id, run.coll_id, call.call_site, call.algorithm)

        def moved(m: Message, start: float, arrival: float) -> None:
            write(m.src, m.dst, m.tag, m.nbytes, start, arrival, m.step, m.chunk)

        return moved

    def span(self, p: Post, t_end: float) -> None:
        """A user's send or receive ``p`` completed at ``t_end``: its span on its rank's lane."""
        peer = p.dst if p.kind == "send" else p.source
        self._record(
            p.owner, p.kind, p.kind, p.group, peer, p.tag, p.nbytes, p.t_post, t_end, None, None, None, p.call_site
        )

    def collective(self, run: CollectiveRun, t_end: float) -> None:
        """Rank ``run.rank``'s part of a collective ended at ``t_end`` (``new_group`` records none)."""
        call = run.call
        if call.op != "new_group":
            self._record(
                run.rank,
                "collective",
                call.op,
                run.group.group_id,
                None,
                None,
                call.nbytes,
                run.t0,
                t_end,
                run.coll_id,
                None,
                None,
                call.call_site,
                call.algorithm,
            )

    def steps(self, run: CollectiveRun) -> Callable[[int, str, int | None, float, Any], None]:
        """What records snapshots of the data of ``run``'s collective: ``write(rank, kind, step, t, values)``, a
        rank's data at time ``t`` after its first ``step`` waits (``kind`` ``'step'`` or ``'work'``; ``values``:
        the leading values, as :meth:`Trace.record` takes a snapshot)."""
        call = run.call
        return self.trace.snapshot_writer(call.op, run.group.group_id, run.coll_id, call.algorithm)

    def receives(self, run: CollectiveRun) -> Callable[..., None]:
        """What records the receives of ``run``'s collective: ``write(rank, peer, tag, nbytes, t, t, step, chunk)``,
        a rank received
        from global rank ``peer`` at ``t`` in the wait of its step ``step`` (``None``: never waited)."""
        call = run.call
        return self.trace.writer("received", call.op, run.group.group_id, run.coll_id, None, call.algorithm)

    def compute(self, rank: int, op: str, t_start: float, seconds: float, call_site: str | None) -> None:
        """Rank ``rank`` computed for ``seconds`` of virtual time from ``t_start`` (``op`` names it)."""
        self._record(rank, "compute", op, 0, None, None, 0, t_start, t_start + seconds, None, None, None, call_site)
