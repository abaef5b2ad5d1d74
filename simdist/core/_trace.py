"""Traces: what happened on each rank, in virtual (or real) time.

A :class:`Trace` stores its events as packed rows (76 bytes each, one fixed-size record
per event, see ``DTYPE``) and its strings and snapshots in tables, not as one Python
object per event: a million-event run takes tens of MB, and the garbage collector does
not walk it. Readers see :class:`Event` objects as before (``trace.events``, iteration,
:meth:`Trace.to_json`); :meth:`Trace.columns` gives the rows as a numpy structured array
without copying. With ``stream=`` the trace writes its finished rows to a file as the run
goes, in the same JSON as :meth:`Trace.to_json`, and keeps only what may still change.
"""

from __future__ import annotations

import heapq
import json
import os
import struct
from array import array
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, fields
from typing import IO, Any

import numpy as np

__all__ = ["DTYPE", "Event", "Trace"]


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
_FORMAT = "simdist-trace-1"

NONE32 = -(2**31)
"""What a 32-bit column holds for ``None`` (``group``, ``peer``, ``collective_id``, ``step``, ``chunk``)."""
NONE64 = -(2**63)
"""What ``tag`` holds for ``None``."""
_ROW = struct.Struct("<iiiiiqqddiiiiii")
DTYPE = np.dtype(
    [
        ("rank", "<i4"),
        ("kind", "<i4"),  # index into Trace.strings
        ("op", "<i4"),  # index into Trace.strings
        ("group", "<i4"),
        ("peer", "<i4"),
        ("tag", "<i8"),
        ("nbytes", "<i8"),
        ("t_start", "<f8"),
        ("t_end", "<f8"),
        ("collective_id", "<i4"),
        ("step", "<i4"),
        ("chunk", "<i4"),
        ("call_site", "<i4"),  # index into Trace.strings, -1: None
        ("algorithm", "<i4"),  # index into Trace.strings, -1: None
        ("snapshot", "<i4"),  # index into the trace's snapshots, -1: None
    ]
)
"""The row of one event in :meth:`Trace.columns` (``None`` is ``NONE32``/``NONE64``, or -1 for an index)."""
assert DTYPE.itemsize == _ROW.size
_OFFSETS = {name: at for name, (_, at, *_) in (DTYPE.fields or {}).items()}  # a field's byte offset in a row
_TIMES, _AT_TIMES = struct.Struct("<dd"), _OFFSETS["t_start"]  # what update() rewrites in a row
_STEP, _AT_STEP = struct.Struct("<i"), _OFFSETS["step"]
assert _OFFSETS["t_end"] == _AT_TIMES + 8
_SIZE = _ROW.size
_FLUSH = 1 << 22
"""Bytes of finished rows a streamed trace keeps before writing them out."""


class Raw:
    """Leading values of a buffer as its bytes: what a snapshot costs to take (read as numbers when iterated).

    ``dtype`` is a numpy dtype string (``'<f4'``); iterating gives Python numbers, as ``tolist()`` of
    those values would. Two are equal when their dtype and bytes are.
    """

    __slots__ = ("data", "dtype")

    def __init__(self, dtype: str, data: bytes):
        self.dtype = dtype
        self.data = data

    def __iter__(self) -> Iterator:
        return iter(np.frombuffer(self.data, self.dtype).tolist())

    def __len__(self) -> int:
        return len(self.data) // np.dtype(self.dtype).itemsize

    def __eq__(self, other: object) -> bool:
        return type(other) is Raw and self.data == other.data and self.dtype == other.dtype

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple:
        return Raw, (self.dtype, self.data)


def _packed(values: list | array | Raw) -> Any:
    """``values`` as stored: an ``array`` when they are all floats or all ints that fit, else the list.

    An ``array`` (``'d'`` or ``'q'``, not empty) or a :class:`Raw` is taken as it is: the caller made it for the
    trace.
    """
    if type(values) is array or type(values) is Raw:
        return values
    kinds = set(map(type, values))
    if kinds == {float}:
        return array("d", values)
    if kinds == {int}:
        try:
            return array("q", values)
        except OverflowError:
            pass
    return list(values)


class Trace:
    """The events of a run, in order (see :class:`Event`), with the run's metadata (``meta``).

    ``stream``: a path (or a text file open for writing) that the events are written to as
    they finish, in :meth:`to_json`'s format; the trace then keeps in memory only events
    that may still change, and :meth:`close` (which ``simulate`` calls) finishes the file.
    Reading a streamed trace's events reads the file.
    """

    def __init__(
        self,
        events: list[Event] | None = None,
        meta: dict[str, Any] | None = None,
        *,
        stream: str | os.PathLike | IO[str] | None = None,
    ):
        self.meta: dict[str, Any] = dict(meta or {})
        self.strings: list[str] = []  # what the string columns index
        self._code: dict[str, int] = {}
        self._rows = bytearray()
        self._snaps: dict[int, Any] = {}  # snapshot index -> values (array or list)
        self._nsnaps = 0  # snapshots stored so far (a stream forgets those it has written out)
        self._last: dict[tuple, tuple[int, Any]] = {}  # (rank, collective, kind) -> its latest snapshot
        self._open: set[int] = set()  # rows that may still change (update())
        self._held: list[int] = []  # a heap of them, and of some that no longer are
        self._base = 0  # rows written out to the stream before the first one in _rows
        self._end = 0.0  # the latest t_end so far
        self._events: list[Event] | None = None  # the materialised events, while no row is added
        self._stream: IO[str] | None = None
        self._path: str | None = None
        self._owns = False
        self._next_flush = _FLUSH  # the size of _rows at which a stream next writes out what it can
        if stream is not None:
            self._start_stream(stream)
        for e in events or ():
            self.add(e)

    # --- writing ------------------------------------------------------------------

    def _str(self, s: str) -> int:
        code = self._code.get(s)
        if code is None:
            if not isinstance(s, str):
                raise TypeError(f"expected a str, got {type(s).__name__} {s!r}")
            code = self._code[s] = len(self.strings)
            self.strings.append(s)
        return code

    def record(
        self,
        rank: int,
        kind: str,
        op: str,
        group: int | None = 0,
        peer: int | None = None,
        tag: int | None = None,
        nbytes: int = 0,
        t_start: float = 0.0,
        t_end: float = 0.0,
        collective_id: int | None = None,
        step: int | None = None,
        chunk: int | None = None,
        call_site: str | None = None,
        algorithm: str | None = None,
        snapshot: list | array | None = None,
        *,
        hold: bool = False,
    ) -> int:
        """Append one event (the fields of :class:`Event`, in order); its index.

        ``snapshot`` is a list of numbers, or an ``array`` (``'d'``/``'q'``, not empty) or a :class:`Raw` that the
        trace keeps.

        ``hold=True``: the event may still change (:meth:`update`), so a stream keeps it until then.
        """
        code = self._code
        snap = -1 if snapshot is None else self._snapshot(rank, collective_id, kind, snapshot)
        try:
            self._rows += _ROW.pack(
                rank,
                code[kind] if kind in code else self._str(kind),
                code[op] if op in code else self._str(op),
                NONE32 if group is None else group,
                NONE32 if peer is None else peer,
                NONE64 if tag is None else tag,
                nbytes,
                t_start,
                t_end,
                NONE32 if collective_id is None else collective_id,
                NONE32 if step is None else step,
                NONE32 if chunk is None else chunk,
                -1 if call_site is None else code[call_site] if call_site in code else self._str(call_site),
                -1 if algorithm is None else code[algorithm] if algorithm in code else self._str(algorithm),
                snap,
            )
        except struct.error as exc:
            raise ValueError(f"an event field is out of range or of the wrong type: {exc}") from None
        if t_end > self._end:  # noqa: PLR1730 - max() costs a call per event
            self._end = t_end
        self._events = None
        index = self._base + len(self._rows) // _SIZE - 1
        if hold:
            self._open.add(index)
            if self._stream is not None:
                heapq.heappush(self._held, index)
        elif self._stream is not None and len(self._rows) >= self._next_flush:
            self._flush()
            self._next_flush = len(self._rows) + _FLUSH
        return index

    def writer(
        self,
        kind: str,
        op: str,
        group: int | None,
        collective_id: int | None,
        call_site: str | None,
        algorithm: str | None,
    ) -> Callable[..., Any]:
        """A function appending events whose other fields are these:
        ``write(rank, peer, tag, nbytes, t_start, t_end, step, chunk)``, as :meth:`record` would (no snapshot).

        For the many events of one collective: the fixed fields are encoded once.
        """
        if self._stream is not None:  # (a stream decides per row what it may write out)
            record = self.record

            def write_streamed(rank, peer, tag, nbytes, t_start, t_end, step, chunk):  # noqa: ANN001, ANN202
                record(rank, kind, op, group, peer, tag, nbytes, t_start, t_end, collective_id, step, chunk,
                       call_site, algorithm)  # fmt: skip

            return write_streamed
        k, o = self._str(kind), self._str(op)
        g = NONE32 if group is None else group
        c = NONE32 if collective_id is None else collective_id
        site = -1 if call_site is None else self._str(call_site)
        alg = -1 if algorithm is None else self._str(algorithm)
        extend, pack = self._rows.extend, _ROW.pack

        def write(rank, peer, tag, nbytes, t_start, t_end, step, chunk):  # noqa: ANN001, ANN202
            extend(pack(rank, k, o, g, NONE32 if peer is None else peer, NONE64 if tag is None else tag, nbytes,
                        t_start, t_end, c, NONE32 if step is None else step, NONE32 if chunk is None else chunk,
                        site, alg, -1))  # fmt: skip
            if t_end > self._end:  # noqa: PLR1730 - max() costs a call per event
                self._end = t_end
            self._events = None

        return write

    def snapshot_writer(
        self, op: str, group: int | None, collective_id: int | None, algorithm: str | None
    ) -> Callable[[int, str, int | None, float, Any], None]:
        """A function appending the snapshots of one collective: ``write(rank, kind, step, t, values)``, as
        :meth:`record` would (``kind`` ``'step'`` or ``'work'``; ``values`` as its ``snapshot``; a rank's equal
        values of a kind in a row stored once)."""
        if self._stream is not None:  # (a stream forgets snapshots it wrote out: record() keeps track)
            record = self.record

            def write_streamed(rank, kind, step, t, values):  # noqa: ANN001, ANN202
                record(rank, kind, op, group, None, None, 0, t, t, collective_id, step, None, None, algorithm, values)

            return write_streamed
        codes = {"step": self._str("step"), "work": self._str("work")}
        o = self._str(op)
        g = NONE32 if group is None else group
        c = NONE32 if collective_id is None else collective_id
        alg = -1 if algorithm is None else self._str(algorithm)
        extend, pack, snaps = self._rows.extend, _ROW.pack, self._snaps
        last: dict[tuple[int, str], tuple[int, Any]] = {}  # (rank, kind) -> its latest snapshot's index and values

        def write(rank, kind, step, t, values):  # noqa: ANN001, ANN202
            stored = values if type(values) is Raw or type(values) is array else _packed(values)
            key = (rank, kind)
            prev = last.get(key)
            if prev is not None and prev[1] == stored:
                snap = prev[0]
            else:
                snap = self._nsnaps
                self._nsnaps += 1
                snaps[snap] = stored
                last[key] = (snap, stored)
            extend(pack(rank, codes[kind], o, g, NONE32, NONE64, 0, t, t, c, NONE32 if step is None else step,
                        NONE32, -1, alg, snap))  # fmt: skip
            if t > self._end:  # noqa: PLR1730 - max() costs a call per event
                self._end = t
            self._events = None

        return write

    def add(self, event: Event) -> int:
        """Append ``event`` (copied: later changes to the object do not reach the trace); its index."""
        return self.record(*(getattr(event, f) for f in _FIELDS))

    def update(self, index: int, *, step: int | None, t_start: float, t_end: float) -> None:
        """Set the step and times of event ``index``, an event recorded with ``hold=True`` (held no longer)."""
        if index not in self._open:
            raise ValueError(f"event {index} is not held (recorded with hold=True and not updated since)")
        if self._stream is not None and index == self._first_held():
            self._next_flush = 0  # what it held back may go out now
        self._open.discard(index)
        at = (index - self._base) * _SIZE
        _TIMES.pack_into(self._rows, at + _AT_TIMES, t_start, t_end)
        _STEP.pack_into(self._rows, at + _AT_STEP, NONE32 if step is None else step)
        self._end = max(self._end, t_end)
        self._events = None

    def _snapshot(self, rank: int, coll: int | None, kind: str, values: list | array) -> int:
        """The index of ``values`` in the snapshot table: that of the same rank's previous one when equal."""
        key = (rank, coll, kind)
        stored = _packed(values)
        last = self._last.get(key)
        if last is not None and last[1] == stored and last[0] in self._snaps:
            return last[0]
        index = self._nsnaps
        self._nsnaps += 1
        self._snaps[index] = stored
        self._last[key] = (index, stored)
        return index

    # --- reading --------------------------------------------------------------------

    def __len__(self) -> int:
        return self._base + len(self._rows) // _SIZE

    def _row_values(self, row: tuple, snaps: dict[int, Any]) -> list:
        strings = self.strings
        (rank, kind, op, group, peer, tag, nbytes, t_start, t_end, coll, step, chunk, site, alg, snap) = row
        return [
            rank,
            strings[kind],
            strings[op],
            None if group == NONE32 else group,
            None if peer == NONE32 else peer,
            None if tag == NONE64 else tag,
            nbytes,
            t_start,
            t_end,
            None if coll == NONE32 else coll,
            None if step == NONE32 else step,
            None if chunk == NONE32 else chunk,
            None if site < 0 else strings[site],
            None if alg < 0 else strings[alg],
            None if snap < 0 else list(snaps[snap]),
        ]

    def _rows_in_memory(self) -> Iterator[list]:
        snaps = self._snaps
        for row in _ROW.iter_unpack(self._rows):
            yield self._row_values(row, snaps)

    def rows(self) -> Iterator[list]:
        """Each event's fields in :class:`Event` order, as :meth:`to_json` writes them (reads a stream's file)."""
        if self._base:
            yield from self._streamed_rows()
        yield from self._rows_in_memory()

    @property
    def events(self) -> list[Event]:
        """The events as :class:`Event` objects (built on first use and kept until the trace changes)."""
        if self._events is None:
            self._events = [Event(*r) for r in self.rows()]
        return self._events

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def of_kind(self, *kinds: str) -> list[Event]:
        return [e for e in self.events if e.kind in kinds]

    def duration(self) -> float:
        """The latest end time of any event (the run's virtual makespan)."""
        return self._end

    def columns(self) -> np.ndarray:
        """The events in memory as a numpy structured array of ``DTYPE`` (a view: no copy).

        String columns index :attr:`strings`; ``None`` is ``NONE32``/``NONE64`` (-1 for indexes).
        A streamed trace holds only its unwritten tail: read the file with :meth:`load` first.
        """
        return np.frombuffer(self._rows, dtype=DTYPE)

    # --- files ----------------------------------------------------------------------

    def to_json(self) -> str:
        """The trace as simdist's own JSON (round-trips through :meth:`from_json`)."""
        return json.dumps(
            {"format": _FORMAT, "fields": _FIELDS, "meta": self.meta, "events": list(self.rows())},
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> Trace:
        data = json.loads(text)
        if data.get("format") != _FORMAT:
            raise ValueError(f"text is not a simdist trace (format '{_FORMAT}')")
        names = data["fields"]
        trace = cls(meta=data.get("meta"))
        for row in data["events"]:
            trace.add(Event(**{k: v for k, v in zip(names, row) if k in _FIELDS}))
        return trace

    @classmethod
    def load(cls, path: str | os.PathLike) -> Trace:
        """The trace in the file ``path`` (written by :meth:`to_json` or streamed)."""
        with open(path, encoding="utf-8") as f:
            return cls.from_json(f.read())

    def _start_stream(self, stream: Any) -> None:
        if isinstance(stream, (str, os.PathLike)):
            self._path = os.fspath(stream)
            self._stream, self._owns = open(self._path, "w", encoding="utf-8"), True  # noqa: SIM115 - closed by close()
        elif hasattr(stream, "write"):
            self._stream, self._path = stream, getattr(stream, "name", None)
        else:
            raise TypeError(f"stream={stream!r} must be a path or a text file open for writing")
        self._stream.write(f'{{"format":"{_FORMAT}","fields":{json.dumps(_FIELDS)},"events":[')

    def _first_held(self) -> int | None:
        """The lowest index of an event that may still change (``None``: none may)."""
        held = self._held
        while held and held[0] not in self._open:
            heapq.heappop(held)
        return held[0] if held else None

    def _flush(self) -> None:
        """Write out the rows before the first open one, and forget them (and snapshots only they use)."""
        first = self._first_held()
        keep_from = len(self) if first is None else first
        n = keep_from - self._base
        if n <= 0:
            return
        cut = n * _SIZE
        head = self._rows[:cut]
        snaps = self._snaps
        text = json.dumps([self._row_values(r, snaps) for r in _ROW.iter_unpack(head)], separators=(",", ":"))
        stream = self._stream
        assert stream is not None, "only a streamed trace writes rows out"
        if self._base:
            stream.write(",")
        stream.write(text[1:-1])
        del self._rows[:cut]
        self._base += n
        used = {r[-1] for r in _ROW.iter_unpack(self._rows)} | {i for i, _ in self._last.values()}
        for i in [i for i in snaps if i not in used]:
            del snaps[i]

    def close(self) -> None:
        """Finish a streamed trace's file (every row and ``meta``); nothing for a trace in memory."""
        if self._stream is None:
            return
        self._open.clear()
        self._flush()
        self._stream.write(f'],"meta":{json.dumps(self.meta, sort_keys=True, separators=(",", ":"))}}}')
        if self._owns:
            self._stream.close()
        else:
            self._stream.flush()
        self._stream = None

    def _streamed_rows(self) -> Iterator[list]:
        if self._stream is not None:
            raise RuntimeError("the streamed trace is still being written: close() it before reading its events")
        if self._path is None:
            raise RuntimeError("this streamed trace went to a file object without a name: read it with Trace.load")
        with open(self._path, encoding="utf-8") as f:
            data = json.load(f)
        yield from data["events"][: self._base]

    # --- combining ------------------------------------------------------------------

    @classmethod
    def merge(cls, traces: list[Trace]) -> Trace:
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
        events = self.events
        ranks = sorted({e.rank for e in events} | {e.peer for e in events if e.peer is not None})
        for r in ranks:
            out.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": r, "args": {"name": f"rank {r}"}})
        for i, e in enumerate(events):
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
