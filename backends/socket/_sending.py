"""Writing to one peer: the frames of this rank's sends, in posting order, and its goodbye.

A :class:`Sender` is the one way a frame goes out to its peer: from the peer's sender
thread (:meth:`Sender.run`, which writes the queued sends in order and, at ``STOP``,
says goodbye) and from :meth:`PeerNetwork.isend`, which writes a small send to an idle
peer itself (:meth:`Sender.write` with ``now``: until the connection stalls, the thread
finishing the rest, ``RESUME``). Both hold the peer's send lock, so frames never
interleave and a send never overtakes one posted before it.

The first send to a peer connects (:func:`._links.connect`); a payload of at least
``_shm.MIN_BYTES`` goes through a shared ring once the peer mapped it (:mod:`._shm`),
the first such send offering it; what the peer writes back (credits, the answer to the
offer, its goodbye) is read before each frame (:func:`._links.read_back`).

Locking: a sender holds no state of its own. The peer's sending state (its connection,
ring, count of unsent sends and send failure) is written under the network's lock
(``PeerNetwork._cond``) where other threads read it, and the connection is written only
by the holder of ``p.send_lock``. A send completes under the network's lock and fails through
the network (``_fail``, ``_lose``).
"""

from __future__ import annotations

import select
import socket
from typing import TYPE_CHECKING

from simdist.core import DistError, PeerLostError

from . import _links, _shm
from ._frames import CLOSE, DATA, encode_header, frame_parts, send_frame, send_parts
from ._links import Goodbye, connect, offer_ring, read_back, write_ring

if TYPE_CHECKING:  # a circle by choice, for types only: the network (_peers) owns the peers this module
    # serves, and imports it to do so
    from ._peers import Handle, PeerNetwork, _Peer

__all__ = ["RESUME", "STOP", "Sender"]

STOP = object()  # put on a sender thread's queue: say goodbye and end
RESUME = object()  # put on a sender thread's queue: finish the send an inline write began (``p.resume``)
INLINE_STALL_S = 0.1
"""How long an inline write waits for a connection that takes nothing before it leaves the rest to the
sender thread: a peer that reads keeps the caller writing, as a blocking write would."""


class Sender:
    """The sending end of ``network``'s rank to peer ``p``."""

    __slots__ = ("net", "p")

    def __init__(self, network: PeerNetwork, p: _Peer):
        self.net, self.p = network, p

    def run(self) -> None:
        """The sender thread of the peer: write each queued send in order; at ``STOP``, say goodbye.

        A send an inline write began (``p.resume``, announced by ``RESUME``) is finished before anything else.
        """
        p = self.p
        while True:
            op = p.queue.get()
            with p.send_lock:
                begun, p.resume = p.resume, None
                if begun is not None:
                    self.write(begun)
                if op is RESUME:
                    continue
                if op is STOP:
                    if p.outbound is not None:
                        self._goodbye()
                    return
                self.write(op)

    def write(self, op: Handle, now: bool = False) -> bool:
        """Whether send ``op`` is finished: its frame written to the peer, connecting first if need be,
        then ``op`` completed or failed; the caller holds ``p.send_lock``.

        ``now`` (an inline write, on the caller's thread): return False where the write would wait
        (a ring not offered yet or full, a connection that took nothing for ``INLINE_STALL_S``: a
        peer that reads nothing, a link that is down), the rest of the frame kept in ``op.rest`` for
        the sender thread. Otherwise a large payload keeps the caller here until the kernel has
        taken it.

        A failure fails ``op`` and every later send to the peer; a broken connection (or a
        goodbye waiting on it) also marks the peer lost.
        """
        net, p = self.net, self.p
        with net._cond:
            if p.send_failure is not None:
                p.unsent -= 1
                net._fail(op, p.send_failure, p.rank)
                return True
            op.state = "connecting" if p.outbound is None else "sending"
        sock = p.outbound
        try:
            if sock is None:
                sock = connect(net._store, net._secret, net.rank, net.world_size, p.rank, net.timeout)
                p.poller = select.poll()
                p.poller.register(sock, select.POLLIN)
                with net._cond:
                    p.outbound = sock
                    op.state = "sending"
            while p.poller.poll(0):
                read_back(sock, p.rank, p.ring)
            if op.rest is not None:  # the rest of a frame an inline write began
                op.rest = send_parts(sock, op.rest, peer=p.rank)
            elif not self._write_frame(sock, op, now):
                return False
        except Exception as exc:  # noqa: BLE001 - every failure becomes the peer's send failure
            if isinstance(exc, DistError):
                failure = (type(exc), str(exc))
            elif isinstance(exc, (Goodbye, OSError)):
                failure = (PeerLostError, str(exc))
            else:
                failure = (DistError, f"{type(exc).__name__}: {exc}")
            with net._cond:
                p.unsent -= 1
                if isinstance(exc, PeerLostError):
                    net._lose(p, failure, receiving=False)
                elif p.send_failure is None:
                    p.send_failure = failure
                net._fail(op, p.send_failure, p.rank)
                p.outbound = None
            if sock is not None:
                sock.close()
            return True
        with net._cond:
            p.unsent -= 1
            op.view = None
            op.state = "done"
            op.done = True
            net._cond.notify_all()
        return True

    def _write_frame(self, sock: socket.socket, op: Handle, now: bool) -> bool:
        """Whether ``op``'s frame went out whole, through the shared ring or the connection. With ``now``,
        False where it would wait: the rest of the frame is in ``op.rest``, or, where the ring is in
        the way (not offered yet: the offer waits for the answer; or full), nothing was written."""
        net, p = self.net, self.p
        if op.nbytes >= _shm.MIN_BYTES and net._shm and p.ring is None:
            if now:
                return False
            with net._cond:
                net._rings += 1
                room = net._rings <= _shm.MAX_RINGS
            p.ring = offer_ring(sock, net.rank, p.rank) if room else False
        ring = p.ring
        if op.nbytes >= _shm.MIN_BYTES and isinstance(ring, _shm.Ring):
            if now and ring.full():
                return False
            write_ring(sock, ring, net.rank, p.rank, op)
            return True
        header = encode_header(DATA, op.ctx, op.tag, op.nbytes, net.rank)
        op.rest = send_parts(sock, frame_parts(header, op.view), peer=p.rank, stall=INLINE_STALL_S if now else None)
        op.rest = op.rest or None
        return op.rest is None

    def _goodbye(self) -> None:
        """CLOSE on ``p.outbound``, end of stream, then wait (briefly) until the peer has read
        everything; the caller holds ``p.send_lock``."""
        net, p = self.net, self.p
        with net._cond:
            sock, p.outbound = p.outbound, None
        try:
            if p.send_failure is None:
                sock.settimeout(min(net.timeout, _links.LINGER))
                send_frame(sock, encode_header(CLOSE, 0, net._farewell, 0, net.rank), peer=p.rank)
                sock.shutdown(socket.SHUT_WR)
                while sock.recv(4096):
                    pass
        except (DistError, OSError):
            pass
        finally:
            sock.close()
