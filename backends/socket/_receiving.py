"""Reading one peer's frames: the thread that serves a connection a peer opened to this rank.

A :class:`Receiver` reads the frames of one accepted connection, after its hello, until
the peer's goodbye (CLOSE) or the connection's end. Each message frame (DATA on the
connection, SHM through the peer's shared ring) goes to the receive the network's
:class:`._matching.Mailbox` matches it with: read straight into a posted receive, or
kept in pieces as an unexpected message until its receive is posted. A frame's payload
must arrive within ``frame_deadline(nbytes, timeout)`` of its header.

A connection that ends without a goodbye loses its peer: what waits for its frames
fails with :class:`~simdist.PeerLostError`; any other failure (bad bytes, a deadline
missed) fails them with its own error.

Locking: a receiver holds no state of its own beyond its connection. It reads payloads
without a lock, and takes the network's lock (``PeerNetwork._cond``) to match frames and
to fail receives; it completes and fails receives through the network (``_complete``,
``_fail``, ``_deliver``) and reports a lost peer to it (``_lose``, ``_fail_receives``).
"""

from __future__ import annotations

import socket
import time
from typing import TYPE_CHECKING

from simdist.core import DistError, PeerLostError, ProtocolError

from . import _links, _shm
from ._accept import frame_deadline
from ._failures import FAILING
from ._frames import CLOSE, DATA, HEADER_SIZE, KINDS, SHM, SHM_OPEN, Header, decode_header, recv_exact_into
from ._matching import CHUNK, Message, mismatch

if TYPE_CHECKING:  # a circle by choice, for types only: the network (_peers) owns the peers this module
    # serves, and imports it to do so
    from ._peers import Handle, PeerNetwork, _Peer

__all__ = ["Receiver"]


def _from(conn: socket.socket) -> str:
    """`` from 10.0.0.2`` (the peer's host address), or nothing where it cannot be read any more."""
    try:
        return f" from {conn.getpeername()[0]}"
    except (OSError, IndexError):
        return ""


class Receiver:
    """The receiving end of the connection ``conn`` from peer ``p`` to ``network``'s rank.

    :meth:`run` returns once the peer said goodbye or the connection ended; every failure
    on the way becomes the failure of the receives from ``p``, never an exception.
    """

    __slots__ = ("conn", "net", "p", "stream")

    def __init__(self, network: PeerNetwork, p: _Peer, conn: socket.socket):
        self.net, self.p, self.conn = network, p, conn
        self.stream = _Stream(conn, p.rank)

    def run(self) -> None:
        """Read and deliver frames until the goodbye or the end of the connection."""
        net, p, conn = self.net, self.p, self.conn
        head = bytearray(HEADER_SIZE)
        view = memoryview(head)
        current: Handle | Message | None = None
        try:
            while True:
                conn.settimeout(None)  # idle between frames: no deadline
                recv_exact_into(conn, view, peer=p.rank)
                h = decode_header(head)
                deadline = time.monotonic() + frame_deadline(h.nbytes, net.timeout)
                if h.src != p.rank:
                    raise ProtocolError(f"a frame from rank {p.rank} claims to come from rank {h.src}")
                if h.kind == CLOSE:
                    self._goodbye(h)
                    return
                if h.kind == SHM_OPEN:
                    reader = _shm.RingReader.accept(conn, h, net.rank, p.rank, p.back_lock, deadline, net._shm)
                    p.reader = reader or p.reader
                    continue
                source = self._source(h)
                with net._cond:
                    current = net._mail.arrive(p.rank, (h.ctx, h.tag), h.nbytes)
                if isinstance(current, Message):
                    self._receive_unexpected(source, current, deadline)
                elif current.nbytes != h.nbytes:
                    _discard(source, h.nbytes, deadline)
                    with net._cond:
                        net._fail(current, (ProtocolError, mismatch(h.nbytes, current, p.rank)), p.rank)
                else:
                    source.read_into(current.view, deadline)
                    net._complete(current)
                current = None
        except Exception as exc:  # noqa: BLE001 - every failure becomes the peer's receive failure
            if net._closed:
                failure = (DistError, "the peer network was closed")
            elif isinstance(exc, PeerLostError):
                where = (
                    ""
                    if current is None
                    else (f", in the middle of a {h.nbytes}-byte message (ctx {h.ctx}, tag {h.tag})")
                )
                reason = f"rank {p.rank}'s connection{_from(conn)} ended without a goodbye{where}"
                failure = (PeerLostError, f"{reason} (the process exited or died): {exc}")
            elif isinstance(exc, DistError):
                failure = (type(exc), str(exc))
            else:
                failure = (DistError, f"{type(exc).__name__}: {exc}")
            with net._cond:
                if isinstance(current, Message):
                    if current.op is not None:
                        net._fail(current.op, failure, p.rank)
                    else:
                        net._mail.forget(current, (h.ctx, h.tag))
                elif current is not None:  # a posted receive, matched
                    net._fail(current, failure, p.rank)
                if net._closed:
                    net._fail_receives(p, failure)
                else:
                    net._lose(p, failure, receiving=True)

    def _goodbye(self, h: Header) -> None:
        """The peer said goodbye (CLOSE ``h``): fail what still waits for its frames, then read
        until it closes (briefly)."""
        net, p, conn = self.net, self.p, self.conn
        with net._cond:
            if h.tag == FAILING:
                net._lose(p, (PeerLostError, f"rank {p.rank} failed (it said so in its goodbye)"), receiving=True)
            reason = f"rank {p.rank} closed its peer network (an orderly goodbye)"
            net._fail_receives(p, (PeerLostError, reason + " before this receive matched"))
        try:
            conn.settimeout(min(net.timeout, _links.LINGER))
            while conn.recv(4096):
                pass
        except OSError:
            pass

    def _source(self, h: Header) -> _Stream | _shm.RingReader:
        """Where the payload of frame ``h`` comes from: the connection (DATA) or the peer's ring (SHM)."""
        p = self.p
        if h.kind == DATA:
            return self.stream
        if h.kind == SHM and p.reader is not None:
            p.reader.begin(h.nbytes)
            return p.reader
        raise ProtocolError(
            f"rank {p.rank} sent a {KINDS[h.kind]} frame where a message was due"
            + (" (it offered no shared ring)" if h.kind == SHM else "")
        )

    def _receive_unexpected(self, source: _Stream | _shm.RingReader, msg: Message, deadline: float) -> None:
        """Read an unexpected payload in chunks; once a receive matches it, read the rest straight in."""
        net = self.net
        got = 0
        while got < msg.nbytes:
            op = msg.op  # set under the lock by irecv; seen here at the next chunk at the latest
            if op is not None and op.nbytes == msg.nbytes:
                source.read_into(op.view[got:], deadline)
                net._mail.unload(msg, op.view)
                with net._cond:
                    msg.arrived = True
                net._complete(op)
                return
            chunk = net._mail.piece(min(msg.nbytes - got, CHUNK), got)
            source.read_into(chunk, deadline)
            msg.chunks.append(chunk)
            got += len(chunk)
        with net._cond:
            msg.arrived = True
            op = msg.op
        if op is not None:
            net._deliver(msg, op)


class _Stream:
    """The payload of a DATA frame: the bytes that follow its header on the connection."""

    __slots__ = ("conn", "peer")

    def __init__(self, conn: socket.socket, peer: int):
        self.conn, self.peer = conn, peer

    def read_into(self, view: memoryview, deadline: float) -> None:
        recv_exact_into(self.conn, view, peer=self.peer, deadline=deadline)


def _discard(source: _Stream | _shm.RingReader, nbytes: int, deadline: float) -> None:
    """Read and drop ``nbytes`` payload bytes (a frame no buffer can take) by ``deadline``."""
    scratch = memoryview(bytearray(min(nbytes, 1 << 20)))
    while nbytes:
        n = min(nbytes, len(scratch))
        source.read_into(scratch[:n], deadline)
        nbytes -= n
