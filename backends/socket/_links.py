"""One connection between two ranks: set up, say hello, and read what comes back on it.

A rank sends to a peer over a connection it opens (:func:`connect`): it authenticates
(:mod:`._auth`) and says hello with its rank and world size (``HELLO``). The peer's
listener checks the same two steps (:func:`read_hello`) and from then on only reads
frames from that connection. What the peer writes back on it is small and fixed
(:func:`read_back`): credits of the shared ring this rank writes to, the answer to the
offer of that ring (:func:`offer_ring`), and its goodbye.

Nothing here holds a lock or keeps state: callers own the sockets and the rings, and
the caller of :func:`read_back`, :func:`offer_ring` and :func:`write_ring` holds the
peer's send lock (it is the one writer of the connection).
"""

from __future__ import annotations

import logging
import select
import socket
import struct
import time
from typing import Any

from simdist.core import PeerLostError, ProtocolError

from . import _shm
from ._failures import FAILING
from ._frames import (
    CLOSE,
    CREDIT,
    HEADER_SIZE,
    KINDS,
    SHM,
    SHM_ACK,
    Header,
    decode_header,
    encode_header,
    recv_exact_into,
    send_frame,
)

__all__ = [
    "HELLO",
    "HELLO_MAGIC",
    "LINGER",
    "Goodbye",
    "connect",
    "hung_up",
    "offer_ring",
    "read_back",
    "read_hello",
    "write_ring",
]

log = logging.getLogger(__name__)

HELLO = struct.Struct("!4sII")  # magic, rank, world size: the first bytes after the handshake
HELLO_MAGIC = b"SDPH"
LINGER = 5.0  # seconds a goodbye waits for the peer to take the last frames (and to close)
_RDHUP = getattr(select, "POLLRDHUP", 0x2000) | select.POLLHUP | select.POLLERR


class Goodbye(Exception):
    """The peer said goodbye on the connection this rank sends on."""


def connect(store: Any, secret: bytes, rank: int, world_size: int, peer: int, timeout: float) -> socket.socket:
    """A connection from ``rank`` to ``peer`` at the address the store holds for it, authenticated
    with ``secret`` and past the hello; each step within ``timeout`` seconds.

    Raises:
        PeerLostError: the peer cannot be reached, or the connection broke.
        ProtocolError: the store holds a malformed address for ``peer``.
    """
    from ._auth import authenticated

    raw = store.get(f"peer/{peer}")
    address = bytes(raw).decode("ascii", "replace")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ProtocolError(f"the store holds a malformed address {address!r} for rank {peer}")

    def dial() -> socket.socket:
        try:
            sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
        except OSError as exc:
            raise PeerLostError(f"cannot connect to rank {peer} at {address}: {exc}", rank=peer) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    try:
        sock = authenticated(dial, secret, timeout, timeout)
    except OSError as exc:
        raise PeerLostError(f"connection to rank {peer} at {address} broke: {exc}", rank=peer) from exc
    try:
        sock.settimeout(timeout)
        sock.sendall(HELLO.pack(HELLO_MAGIC, rank, world_size))
    except OSError as exc:
        sock.close()
        raise PeerLostError(f"connection to rank {peer} at {address} broke: {exc}", rank=peer) from exc
    except BaseException:
        sock.close()
        raise
    return sock


def read_hello(conn: socket.socket, secret: bytes, seconds: float, rank: int, world_size: int) -> int:
    """The rank an incoming connection to ``rank`` comes from, once it authenticated with ``secret``
    and said a valid hello, all within ``seconds``.

    Raises:
        AuthenticationError: the peer does not hold the secret.
        ProtocolError: a bad hello (magic, world size, or rank).
    """
    from ._auth import server_handshake

    deadline = time.monotonic() + seconds
    server_handshake(conn, secret, seconds)
    hello = bytearray(HELLO.size)
    recv_exact_into(conn, memoryview(hello), deadline=deadline)
    magic, peer, world = HELLO.unpack(hello)
    if magic != HELLO_MAGIC:
        raise ProtocolError(f"bad hello {bytes(hello)!r}")
    if world != world_size or not 0 <= peer < world or peer == rank:
        raise ProtocolError(f"hello from rank {peer} of {world}; this is rank {rank} of {world_size}")
    return peer


def read_back(sock: socket.socket, peer: int, ring: _shm.Ring | bool | None) -> Header:
    """Read the frame ``peer`` wrote on the connection this rank sends on: a credit of ``ring``, the
    shared ring this rank writes to (taken), or the answer to its offer (returned); else its
    goodbye (:class:`Goodbye`), or it is gone (:class:`~simdist.PeerLostError`)."""
    try:
        data = sock.recv(HEADER_SIZE, socket.MSG_PEEK)
    except OSError as exc:
        raise PeerLostError(f"rank {peer}'s connection broke: {exc}", rank=peer) from exc
    if not data:
        raise PeerLostError(f"rank {peer} closed its connection without a goodbye (it exited or died)", rank=peer)
    head = bytearray(HEADER_SIZE)
    recv_exact_into(sock, memoryview(head), peer=peer)
    h = decode_header(head)
    if h.kind == CREDIT and isinstance(ring, _shm.Ring):
        ring.credit(h, peer)
        return h
    if h.kind == SHM_ACK:
        return h
    if h.kind == CLOSE and h.tag == FAILING:
        raise PeerLostError(f"rank {peer} failed (it said so in its goodbye)", rank=peer)
    if h.kind == CLOSE:
        raise Goodbye(f"rank {peer} has closed its peer network")
    raise ProtocolError(f"rank {peer} sent a {KINDS[h.kind]} frame on the connection this rank sends on")


def offer_ring(sock: socket.socket, rank: int, peer: int) -> _shm.Ring | bool:
    """Offer ``peer`` a shared ring for ``rank``'s large payloads: the ring once ``peer`` mapped it, else
    ``False`` (another host, or no shared memory here: TCP carries them)."""
    try:
        ring = _shm.Ring()
    except OSError as exc:
        log.info("rank %d: no shared memory for rank %d (%s); payloads go over TCP", rank, peer, exc)
        return False
    try:
        send_frame(sock, ring.offer(rank), peer=peer)
        answer = read_back(sock, peer, None)
    except BaseException:
        ring.close()
        raise
    if answer.kind != SHM_ACK or answer.tag != 1:
        ring.close()
        return False
    ring.accepted()
    return ring


def write_ring(sock: socket.socket, ring: _shm.Ring, rank: int, peer: int, op: Any) -> None:
    """Send ``op`` from ``rank`` to ``peer`` through ``ring``: an SHM frame, then one CHUNK frame per slot filled."""
    head = encode_header(SHM, op.ctx, op.tag, op.nbytes, rank)
    for start in range(0, op.nbytes, ring.slot_size):
        while ring.full():
            read_back(sock, peer, ring)
        head += ring.put(op.view[start : start + ring.slot_size], rank)
        send_frame(sock, head, peer=peer)
        head = b""


def hung_up(sock: socket.socket) -> bool:
    """Whether the peer of ``sock`` has closed its end (data it wrote before may still wait unread)."""
    poller = select.poll()
    poller.register(sock, _RDHUP)
    return bool(poller.poll(0))
