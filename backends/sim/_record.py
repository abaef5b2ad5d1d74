"""Step recording (``record_steps=True``): each rank's data after every step of a collective,
and the step in which it received each message.

A collective's algorithm runs against a :class:`Recorder` wrapped around the engine's
transport. The recorder adds to the trace:

- one ``'received'`` event per receive, in the order the rank posted them (so the
  ``k``-th one from a peer with a tag is the ``k``-th message of that peer and tag):
  ``step`` is the rank's step whose wait completed it (written when the rank's part ends);
- one ``'step'`` event per step boundary: ``step = k`` holds the leading values of the
  rank's data after its first ``k`` waits and the computation that follows them (the
  combine), before anything of the next step arrives; ``k = 0`` is before any wait and
  the last one is after the algorithm returned. The data is the output buffer, or what
  the algorithm :func:`~simdist.algorithms.observe`\\ s (kind ``'work'`` then); a plain CPU tensor's
  values are kept as their bytes (:class:`simdist.core._trace.Raw`), read as numbers when the trace is read.

A snapshot never shows a message before the rank has waited on it: where a receive
still pending (posted, maybe already arrived, not yet waited on) covers recorded
values, the snapshot keeps the values they had when it was posted (an algorithm may
not touch a receive's buffer before it completes).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from simdist.core import arrays as A
from simdist.algorithms import CollectiveCall
from simdist.core import Raw
from simdist.algorithms import Observer, Timed

_Tensor = torch.Tensor

__all__ = ["LIMIT", "recorded"]

LIMIT = 64
"""Leading values recorded per snapshot (as ``simdist.core._arrays.snapshot``)."""


def recorded(call: CollectiveCall, transport: Any, writers: tuple[Any, Any]) -> Iterator[list]:
    """``call``'s algorithm on the engine's ``transport``, each of its steps recorded by a :class:`Recorder`;
    ``writers``: what writes the collective's snapshots and receives (``TraceRecorder.steps``, ``.receives``)."""
    assert call.function is not None, f"{call.op} moves no data of its own"
    rec = Recorder(transport, call.snapshot, writers)
    return rec.run(call.function(rec, *call.args))


class Recorder(Observer, Timed):
    """The transport an algorithm sees while its steps are recorded (see the module doc)."""

    __slots__ = ("bounds", "exact", "head", "hidden", "pending", "posted", "rank", "rank_global", "size", "steps", "t",
                 "view", "write", "receives")  # fmt: skip

    def __init__(self, transport: Any, buf: Any, writers: tuple[Any, Any]):
        self.t = transport
        self.rank, self.size = transport.rank, transport.size
        self.rank_global = transport.run.rank
        self.write, self.receives = writers
        self.head = None if buf is None else A.narrow(buf, 0, LIMIT)  # the output's recorded values
        self.bounds = None if buf is None else A.byte_bounds(self.head)  # its memory, for each receive's overlap
        self.exact = None if buf is None else A.values_view(self.head, LIMIT)  # read as an array, where it can be
        self.view: list | None = None  # the observed working data, once there is some
        self.steps = 0
        self.posted: list[list] = []  # each receive, in the order posted: [peer, tag, nbytes, chunk, step, time]
        self.pending: dict[int, list] = {}  # id(handle) -> its entry in ``posted``, until a wait completes it
        self.hidden: dict[int, tuple[int, Any]] = {}  # id(handle) -> (start, values) it covers in ``head``

    # --- the Transport ------------------------------------------------------------

    def isend(self, buf: Any, peer: int, tag: int = 0, *, chunk: int | None = None) -> Any:
        return self.t.isend(buf, peer, tag, chunk=chunk)

    def irecv(self, buf: Any, peer: int, tag: int = 0, *, chunk: int | None = None) -> Any:
        bounds = self.bounds
        if bounds is None:
            span = None
        elif type(buf) is _Tensor and buf.is_contiguous():  # (the common case, without overlap_span's generality)
            low = buf.data_ptr()
            span = A.overlap_span(buf, self.head, bounds) if low < bounds[1] and bounds[0] < low + buf.nbytes else None
        else:
            span = A.overlap_span(buf, self.head, bounds)
        if span is not None:
            before = self._values(span[0], span[1])
        handle = self.t.irecv(buf, peer, tag, chunk=chunk)
        entry = [self.t.ranks[peer], tag, handle.nbytes, chunk, None, 0.0]
        self.posted.append(entry)
        self.pending[id(handle)] = entry
        if span is not None:
            self.hidden[id(handle)] = (span[0], before)
        return handle

    def wait(self, handles: Any) -> None:
        self.t.wait(handles)

    @property
    def hosts(self) -> Any:
        return getattr(self.t, "hosts", None)

    def reduced(self, nbytes: int) -> None:
        self.t.reduced(nbytes)

    def allocated(self, nbytes: int) -> None:
        self.t.allocated(nbytes)

    def copied(self, nbytes: int) -> None:
        self.t.copied(nbytes)

    def observe(self, buf: Any, offset: int) -> None:
        if self.view is None:
            self.view = []
        if offset >= LIMIT:
            return
        values = A.snapshot(buf, LIMIT - offset)
        if len(self.view) < offset:
            self.view += [0.0] * (offset - len(self.view))
        self.view[offset : offset + len(values)] = values

    # --- the generator --------------------------------------------------------------

    def run(self, gen: Iterator[list]) -> Iterator[list]:
        """``gen``'s steps, with a snapshot at every step boundary and each receive's step noted."""
        for handles in gen:
            self._snapshot()
            yield handles
            pending = self.pending
            if pending:
                for h in handles:
                    entry = pending.pop(id(h), None)
                    if entry is not None:
                        entry[4], entry[5] = self.steps, h.t_done
                        if self.hidden:
                            self.hidden.pop(id(h), None)
            self.steps += 1
        self._snapshot()
        write, me = self.receives, self.rank_global
        for peer, tag, nbytes, chunk, step, t in self.posted:
            write(me, peer, tag, nbytes, t, t, step, chunk)

    def _snapshot(self) -> None:
        values: list | Raw
        if self.view is not None:
            kind, values = "work", list(self.view)
        elif self.head is not None:
            kind = "step"
            if self.exact is not None:  # the bytes, with those of pending receives as they were at their post
                view = self.exact[1]
                data = view.tobytes()
                if self.hidden:
                    size, patched = view.itemsize, bytearray(data)
                    for start, before in self.hidden.values():
                        patched[start * size : start * size + len(before)] = before
                    data = bytes(patched)
                values = Raw(view.dtype.str, data)
            else:  # (no view of its memory: the values as a list)
                listed = A.snapshot(self.head, LIMIT)
                for start, before in self.hidden.values():
                    listed[start : start + len(before)] = before
                values = listed
        else:
            return
        self.write(self.rank_global, kind, self.steps, self.t.run.t, values)

    def _values(self, start: int, end: int) -> list | bytes:
        """The recorded values ``head[start:end]``: their bytes where the view is kept, else as
        :func:`_snapshot_values` gives them."""
        if self.exact is None:
            return A.snapshot(A.narrow(self.head, start, end - start), LIMIT)
        return self.exact[1][start:end].tobytes()


def _snapshot_values(buf: Any) -> list | Raw:
    """The leading ``LIMIT`` values of ``buf`` as a step snapshot takes them (``Trace.record``'s ``snapshot``).

    Their bytes (:class:`~simdist.core._trace.Raw`: iterated, the numbers :func:`simdist.core._arrays.snapshot` lists)
    where :func:`simdist.core._arrays.values_view` reads the buffer's memory, else that list.
    """
    exact = A.values_view(buf, LIMIT)
    if exact is None:
        return A.snapshot(buf, LIMIT)
    view = exact[1]
    return Raw(view.dtype.str, view.tobytes())
