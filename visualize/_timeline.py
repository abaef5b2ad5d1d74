"""The timeline of a trace: one lane of spans per rank, messages grouped by algorithm step."""

from __future__ import annotations

from collections import defaultdict

from simdist._trace import Event, Trace

__all__ = ["lanes", "messages_by_step"]


def lanes(trace: Trace) -> dict[int, list[Event]]:
    """Each rank's spans (collectives, sends, receives, computation), ordered by start time."""
    out: dict[int, list[Event]] = defaultdict(list)
    for e in trace.events:
        if e.kind in ("collective", "send", "recv", "compute"):
            out[e.rank].append(e)
    return {r: sorted(v, key=lambda e: (e.t_start, e.t_end)) for r, v in sorted(out.items())}


def messages_by_step(trace: Trace, collective_id: int) -> dict[int, list[Event]]:
    """The messages of one collective, grouped by the sender's algorithm step."""
    out: dict[int, list[Event]] = defaultdict(list)
    for e in trace.events:
        if e.kind == "message" and e.collective_id == collective_id:
            out[e.step or 0].append(e)
    return dict(sorted(out.items()))
