"""Which receive a frame fills: the posted and unexpected tables of a peer network.

A :class:`Mailbox` matches what arrives with what was posted. Messages from one peer
with one ``(ctx, tag)`` match receives in the order both were posted; a receive from
any source takes the first of the candidates to arrive, and a frame goes to the
earliest-posted of the receives it can match (from its peer, or from any source).

=================  =================================================================
posted receives    per source rank, and for any source, by ``(ctx, tag)``: receives
                   waiting for their frame, filled straight from the socket
unexpected         per source rank, by ``(ctx, tag)``: frames that arrived before
                   their receive (:class:`Message`), copied in when it is posted
spare chunks       up to ``SPARES`` full-size pieces of earlier unexpected payloads,
                   reused so large payloads cost no fresh zeroed memory each time
=================  =================================================================

Locking: the tables are guarded by the lock of the network that holds the mailbox
(``PeerNetwork._cond``); every method says whether it needs it. The spare chunks
need no lock (``deque`` append and pop are atomic).
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # a circle by choice, for types only: the network (_peers) owns the peers this module
    # serves, and imports it to do so
    from ._peers import Handle

__all__ = ["CHUNK", "SPARES", "SPARE_MIN", "Mailbox", "Message", "mismatch"]

CHUNK = 4 << 20  # bytes per piece of an unexpected payload
SPARE_MIN = 64 << 10  # pieces from this size on come from (and go back to) the spare chunks
SPARES = 4  # spare chunks kept per mailbox: 16 MiB at most

_Key = tuple[int, int]  # (ctx, tag)


class Message:
    """A frame that arrived before its receive was posted.

    Its payload is kept in chunks allocated as the bytes come, so memory follows what
    was received, never what a header claims.
    """

    __slots__ = ("arrived", "chunks", "nbytes", "op", "seq", "src")

    def __init__(self, src: int, nbytes: int, seq: int):
        self.src, self.nbytes, self.seq = src, nbytes, seq
        self.chunks: list[memoryview] = []
        self.arrived = False
        self.op: Handle | None = None  # the receive that matched it while it was arriving


class Mailbox:
    """The posted receives and unexpected messages of one rank, and the rules that match them.

    Args:
        world_size: the number of ranks (the sources a frame can come from).
    """

    def __init__(self, world_size: int):
        self._posted: list[dict[_Key, deque]] = [{} for _ in range(world_size)]
        self._any_posted: dict[_Key, deque] = {}
        self._unexpected: list[dict[_Key, deque[Message]]] = [{} for _ in range(world_size)]
        self._spares: deque[bytearray] = deque()
        self._post_seq = itertools.count(1)
        self._arrival_seq = itertools.count(1)

    # -- matching (the lock is held) ---------------------------------------------------

    def take(self, op: Handle) -> Message | None:
        """The oldest unexpected message receive ``op`` matches, taken from the table (from any
        source: the first to arrive); ``None`` if there is none. Numbers ``op`` in posting order."""
        op.seq = next(self._post_seq)
        key = (op.ctx, op.tag)
        sources = range(len(self._unexpected)) if op.peer is None else (op.peer,)
        best = None
        for src in sources:
            queue = self._unexpected[src].get(key)
            if queue and (best is None or queue[0].seq < best[1][0].seq):
                best = (src, queue)
        return _pop(self._unexpected[best[0]], key) if best else None

    def post(self, op: Handle) -> None:
        """Queue receive ``op`` (which :meth:`take` matched with nothing) for the frame it waits for."""
        table = self._any_posted if op.peer is None else self._posted[op.peer]
        table.setdefault((op.ctx, op.tag), deque()).append(op)

    def arrive(self, src: int, key: _Key, nbytes: int) -> Handle | Message:
        """The earliest-posted receive a frame from ``src`` with ``key`` matches, taken from the table
        (state ``"receiving"``, ``source`` set); else a new :class:`Message` kept as unexpected."""
        mine, anyq = self._posted[src].get(key), self._any_posted.get(key)
        if mine and (not anyq or mine[0].seq < anyq[0].seq):
            op = _pop(self._posted[src], key)
        elif anyq:
            op = _pop(self._any_posted, key)
            op.source = src
        else:
            msg = Message(src, nbytes, next(self._arrival_seq))
            self._unexpected[src].setdefault(key, deque()).append(msg)
            return msg
        op.state = "receiving"
        return op

    def forget(self, msg: Message, key: _Key) -> None:
        """Drop unexpected ``msg`` (kept under ``key``) whose payload will never complete."""
        queue = self._unexpected[msg.src][key]
        queue.remove(msg)
        if not queue:
            del self._unexpected[msg.src][key]

    def withdraw(self, src: int | None = None) -> list[Handle]:
        """Take every posted receive from ``src`` out of the table, in posting order per key
        (``None``: every posted receive, those from any source first)."""
        tables = [self._posted[src]] if src is not None else [self._any_posted, *self._posted]
        ops = [op for table in tables for queue in table.values() for op in queue]
        for table in tables:
            table.clear()
        return ops

    # -- payloads (no lock needed) ---------------------------------------------------

    def piece(self, nbytes: int, got: int) -> memoryview:
        """A writable view of at most ``nbytes`` (at most ``CHUNK``) for an unexpected payload of
        which ``got`` bytes arrived: part of a spare chunk where one is free, so large payloads
        cost no fresh zeroed memory each time; else fresh memory no larger than what arrived
        (at least ``SPARE_MIN``), so memory follows the bytes received, not the header's claim."""
        if nbytes < SPARE_MIN:
            return memoryview(bytearray(nbytes))
        try:
            chunk = self._spares.pop()
        except IndexError:
            return memoryview(bytearray(min(nbytes, max(got, SPARE_MIN))))
        return memoryview(chunk)[:nbytes]

    def unload(self, msg: Message, view: memoryview) -> None:
        """Copy ``msg``'s chunks to the start of ``view``, then drop them, keeping up to ``SPARES``
        full-size chunks for later payloads."""
        offset = 0
        for chunk in msg.chunks:
            view[offset : offset + len(chunk)] = chunk
            offset += len(chunk)
        for chunk in msg.chunks:
            if len(chunk.obj) == CHUNK and len(self._spares) < SPARES:
                self._spares.append(chunk.obj)
        msg.chunks = []


def mismatch(nbytes: int, op: Handle, src: int) -> str:
    """Why receive ``op`` cannot take the ``nbytes``-byte message rank ``src`` sent."""
    return (
        f"message size mismatch: rank {src} sent {nbytes} bytes (ctx {op.ctx}, tag {op.tag}) but the "
        f"posted buffer holds {op.nbytes} bytes; a send and its receive must have the same size"
    )


def _pop(table: dict[_Key, deque], key: _Key) -> Any:
    """Pop the head of ``table[key]``, dropping the queue once empty (every call has its own ctx)."""
    queue = table[key]
    item = queue.popleft()
    if not queue:
        del table[key]
    return item
