"""Traces: what happened on each rank, in virtual (or real) time."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any, Iterator

__all__ = ["Event", "Trace"]


@dataclass(slots=True)
class Event:
    """One thing that happened on one rank.

    ``kind`` is ``'message'`` (one message from ``rank`` to ``peer``), ``'collective'``
    (one rank's span in a collective), ``'send'``/``'recv'`` (a point-to-point operation),
    ``'compute'`` (annotated computation), ``'step'`` (``rank`` had completed ``step`` steps
    of a collective's algorithm and the computation after them; ``snapshot`` holds the
    leading values of its output buffer), ``'work'`` (the same, for the working data of an
    algorithm that keeps it elsewhere) or ``'received'`` (a collective's message from
    ``peer`` reached ``rank``, whose wait in its step ``step`` completed it). Times are seconds.
    """

    rank: int
    kind: str
    op: str
    group: int = 0
    peer: int | None = None
    tag: int | None = None
    nbytes: int = 0
    t_start: float = 0.0
    t_end: float = 0.0
    collective_id: int | None = None
    step: int | None = None
    chunk: int | None = None
    call_site: str | None = None
    algorithm: str | None = None
    snapshot: list | None = None


_FIELDS = [f.name for f in fields(Event)]


class Trace:
    """An ordered list of :class:`Event` with the run's metadata (``meta``)."""

    def __init__(self, events: list[Event] | None = None, meta: dict[str, Any] | None = None):
        self.events: list[Event] = list(events or [])
        self.meta: dict[str, Any] = dict(meta or {})

    def add(self, event: Event) -> None:
        self.events.append(event)

    def __len__(self) -> int:
        return len(self.events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def of_kind(self, *kinds: str) -> list[Event]:
        return [e for e in self.events if e.kind in kinds]

    def duration(self) -> float:
        """The latest end time of any event (the run's virtual makespan)."""
        return max((e.t_end for e in self.events), default=0.0)

    def to_json(self) -> str:
        """The trace as simdist's own JSON (round-trips through :meth:`from_json`)."""
        rows = [[getattr(e, f) for f in _FIELDS] for e in self.events]
        return json.dumps(
            {"format": "simdist-trace-1", "fields": _FIELDS, "meta": self.meta, "events": rows},
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> "Trace":
        data = json.loads(text)
        if data.get("format") != "simdist-trace-1":
            raise ValueError("text is not a simdist trace (format 'simdist-trace-1')")
        names = data["fields"]
        events = [Event(**{k: v for k, v in zip(names, row) if k in _FIELDS}) for row in data["events"]]
        return cls(events, data.get("meta"))

    @classmethod
    def merge(cls, traces: list["Trace"]) -> "Trace":
        """One trace of the events of ``traces`` (for instance one file per rank of a real run), by start time."""
        events = sorted((e for t in traces for e in t.events), key=lambda e: (e.t_start, e.rank))
        meta: dict[str, Any] = {}
        for t in traces:
            meta.update({k: v for k, v in t.meta.items() if k != "rank"})
        ranks = {e.rank for e in events}
        if ranks:
            meta["world_size"] = max(meta.get("world_size", 0), max(ranks) + 1)
        return cls(events, meta)

    def to_chrome_json(self) -> str:
        """The trace in the Chrome trace-event format, which Perfetto and chrome://tracing load.

        One lane (thread) per rank; spans for collectives, sends, receives and computation;
        each message a flow arrow from its sender's lane to its receiver's.
        """
        out: list[dict] = []
        ranks = sorted({e.rank for e in self.events} | {e.peer for e in self.events if e.peer is not None})
        for r in ranks:
            out.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": r, "args": {"name": f"rank {r}"}})
        for i, e in enumerate(self.events):
            ts, dur = e.t_start * 1e6, max(e.t_end - e.t_start, 0.0) * 1e6
            args = {k: v for k, v in asdict(e).items() if v is not None and k not in ("t_start", "t_end")}
            if e.kind == "message":
                name = f"{e.op} {e.rank}->{e.peer}"
                out.append(
                    {
                        "ph": "X",
                        "name": name,
                        "cat": "message",
                        "pid": 0,
                        "tid": e.rank,
                        "ts": ts,
                        "dur": dur,
                        "args": args,
                    }
                )
                out.append({"ph": "s", "name": name, "cat": "message", "id": i, "pid": 0, "tid": e.rank, "ts": ts})
                out.append(
                    {
                        "ph": "f",
                        "bp": "e",
                        "name": name,
                        "cat": "message",
                        "id": i,
                        "pid": 0,
                        "tid": e.peer,
                        "ts": ts + dur,
                    }
                )
            elif e.kind == "step":
                out.append(
                    {
                        "ph": "i",
                        "s": "t",
                        "name": f"{e.op} step {e.step}",
                        "cat": "step",
                        "pid": 0,
                        "tid": e.rank,
                        "ts": ts,
                        "args": args,
                    }
                )
            else:
                out.append(
                    {
                        "ph": "X",
                        "name": e.op,
                        "cat": e.kind,
                        "pid": 0,
                        "tid": e.rank,
                        "ts": ts,
                        "dur": dur,
                        "args": args,
                    }
                )
        return json.dumps(
            {"traceEvents": out, "displayTimeUnit": "ns", "otherData": self.meta}, sort_keys=True, separators=(",", ":")
        )
