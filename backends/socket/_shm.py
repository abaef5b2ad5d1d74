"""Shared memory between two ranks on one host: the payloads of large messages skip TCP.

The sending rank of a pair owns a *ring*: an anonymous memory file (``memfd_create``)
of ``slots`` slots of ``slot_size`` bytes. It offers the ring on its connection to the
peer (an ``SHM_OPEN`` frame); the peer's receiver thread opens the file through
``/proc/PID/fd/FD``, maps it read-only, checks a random nonce written at its start, and
answers ``SHM_ACK`` (tag 1: mapped, tag 0: refused, so TCP stays). On ``SHM_ACK`` the sender
closes its descriptor: from then on only the two mappings keep the memory, and the
kernel frees it when both are gone, whatever way the processes end (``kill -9`` included).
Nothing is ever named in ``/dev/shm`` or any file system.

The TCP connection keeps carrying the control frames, in order, so matching and
goodbyes are exactly those of TCP payloads. A message travels as::

    sender -> receiver   SHM    ctx, tag, nbytes (the message; no payload follows)
    sender -> receiver   CHUNK  ctx = slot, nbytes = bytes written in that slot (<= slot_size)
                         ... one CHUNK per slot used, ceil(nbytes / slot_size) in all
    receiver -> sender   CREDIT ctx = slot: copied out, the slot is free again

CREDIT frames travel back on the same connection (the one the sender writes on), so
only the sending thread ever reads them, and only when it needs a free slot: a send
completes once its bytes are in the ring, like a TCP send once the kernel has them.
The receiver copies every chunk out at once (into the posted receive, or into memory
for a message not yet received), so the ring always drains and a send never waits for a
receive to be posted.

``SHM_OPEN`` carries a payload of ``_OFFER``: ``pid, fd, slot_size, slots, nonce (16
bytes), host (16 bytes)``, where ``host`` digests the boot id, host name, pid and network
namespaces: a peer that differs refuses without looking in ``/proc``.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import socket
import struct
import threading

import numpy as np

from simdist.core import ProtocolError

from ._frames import (
    CHUNK,
    CREDIT,
    HEADER_SIZE,
    SHM_ACK,
    SHM_OPEN,
    Header,
    decode_header,
    encode_header,
    recv_exact_into,
    send_frame,
)

__all__ = ["ENV", "MAX_RINGS", "MIN_BYTES", "Ring", "RingReader", "credits_only", "enabled", "host_digest"]

ENV = "SIMDIST_SHM"
"""``SIMDIST_SHM=0`` turns the shared-memory path off (every payload goes over TCP)."""
MIN_BYTES = 64 << 10  # messages from this size on go through the ring; smaller ones stay on TCP
SLOT_BYTES = 1 << 20
SLOTS = 8  # 8 MiB of ring per direction of each same-host pair
MAX_RINGS = 16  # rings one rank writes (128 MiB); its payloads to further peers stay on TCP
_OFFER = struct.Struct("!IIQI16s16s")
_NONCE = 16  # the ring starts with the nonce; slots follow at _HEAD
_HEAD = 4096
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # fault every page in at once, not one by one in the first transfers


def enabled() -> bool:
    """Whether this process may use shared memory with its peers (``$SIMDIST_SHM`` is not ``0``)."""
    return os.environ.get(ENV, "1") != "0" and hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")


def host_digest() -> bytes:
    """16 bytes equal on two processes of one host: same boot, host name, pid and network namespaces.

    Shared memory needs the first three (a peer's ring is opened through ``/proc``). Processes in two
    network namespaces are two hosts to the network (containers, or the network-namespace hosts of the
    tests), so they talk TCP, as hosts do, though they could share memory.
    """
    parts = [socket.gethostname().encode()]
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            parts.append(f.read())
        parts.append(os.readlink("/proc/self/ns/pid").encode())
        parts.append(os.readlink("/proc/self/ns/net").encode())
    except OSError:
        parts.append(os.urandom(16))  # unknown: equal to no other process's, so never shared
    return hashlib.sha256(b"\0".join(parts)).digest()[:16]


class Ring:
    """The sending side of a pair's shared memory: slots this rank writes and the peer reads.

    Not thread safe: one sender (who holds the peer's send lock) uses it at a time.
    """

    def __init__(self, slot_size: int = SLOT_BYTES, slots: int = SLOTS):
        self.slot_size, self.slots = slot_size, slots
        self.size = _HEAD + slot_size * slots
        self.fd: int | None = os.memfd_create("simdist-shm", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, self.size)
            self._map = mmap.mmap(self.fd, self.size, flags=mmap.MAP_SHARED | _POPULATE)
        except BaseException:
            os.close(self.fd)
            raise
        self.view = memoryview(self._map)
        self.nonce = os.urandom(_NONCE)
        self.view[:_NONCE] = self.nonce
        self.sent = 0  # chunks written
        self.credited = 0  # chunks the peer has copied out

    def offer(self, rank: int) -> bytes:
        """The ``SHM_OPEN`` frame (header and payload) that offers this ring to the peer."""
        payload = _OFFER.pack(os.getpid(), self.fd, self.slot_size, self.slots, self.nonce, host_digest())
        return encode_header(SHM_OPEN, 0, 0, len(payload), rank) + payload

    def accepted(self) -> None:
        """The peer has mapped the ring: drop the descriptor, so only the two mappings hold the memory."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def full(self) -> bool:
        """Whether every slot holds a chunk the peer has not copied out yet."""
        return self.sent - self.credited >= self.slots

    def put(self, data: memoryview, rank: int) -> bytes:
        """Write ``data`` (at most ``slot_size`` bytes) into the next slot, which must be free; its CHUNK header."""
        slot = self.sent % self.slots
        start = _HEAD + slot * self.slot_size
        _copy(self.view[start : start + len(data)], data)
        self.sent += 1
        return encode_header(CHUNK, slot, 0, len(data), rank)

    def credit(self, h: Header, peer: int) -> None:
        """The peer copied out the oldest chunk (CREDIT frame ``h``).

        Raises:
            ProtocolError: a credit for a slot that holds nothing, or not the oldest.
        """
        if self.credited >= self.sent or h.ctx != self.credited % self.slots or h.src != peer:
            raise ProtocolError(
                f"rank {h.src} returned slot {h.ctx} of the shared ring; rank {peer} owes slot "
                f"{self.credited % self.slots} ({self.sent - self.credited} outstanding)"
            )
        self.credited += 1

    def close(self) -> None:
        """Unmap the ring (the peer's mapping, if any, keeps the memory until it goes too); idempotent."""
        self.accepted()
        _unmap(self.view, self._map)


class RingReader:
    """The receiving side of a pair's shared memory: the peer's ring, mapped read-only.

    Used by the receiver thread of the connection only; ``lock`` guards writes on that
    connection (credits here, the goodbye in :meth:`PeerNetwork.close`).
    """

    def __init__(self, conn: socket.socket, offer: tuple, rank: int, peer: int, lock: threading.Lock):
        pid, fd, self.slot_size, self.slots, nonce, _ = offer
        size = _HEAD + self.slot_size * self.slots
        handle = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            if os.fstat(handle).st_size != size:
                raise OSError(f"the shared ring of rank {peer} is not {size} bytes")
            self._map = mmap.mmap(handle, size, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ)
        finally:
            os.close(handle)
        self.view = memoryview(self._map)
        if bytes(self.view[:_NONCE]) != nonce:
            self.close()
            raise OSError(f"/proc/{pid}/fd/{fd} is not the shared ring rank {peer} offered")
        self._conn, self._rank, self._peer, self.lock = conn, rank, peer, lock
        self._slot = 0  # the slot of the next chunk
        self._at = self._left = 0  # the current chunk: where its unread bytes start, how many are left
        self._message_left = self._unannounced = 0  # bytes of the message not yet read, not yet in a CHUNK

    @classmethod
    def accept(
        cls, conn: socket.socket, h: Header, rank: int, peer: int, lock: threading.Lock, deadline: float, allowed: bool
    ) -> RingReader | None:
        """Read the offer of ``SHM_OPEN`` frame ``h`` and answer it: the mapped ring, or ``None`` (refused).

        Raises:
            ProtocolError: the offer is malformed.
        """
        if h.nbytes != _OFFER.size:
            raise ProtocolError(f"rank {peer} sent an SHM_OPEN frame of {h.nbytes} bytes; expected {_OFFER.size}")
        payload = bytearray(_OFFER.size)
        recv_exact_into(conn, memoryview(payload), peer=peer, deadline=deadline)
        offer = _OFFER.unpack(payload)
        if not 0 < offer[2] <= 1 << 30 or not 0 < offer[3] <= 1024:
            raise ProtocolError(f"rank {peer} offered a shared ring of {offer[3]} slots of {offer[2]} bytes")
        reader = None
        if allowed and offer[5] == host_digest():
            try:
                reader = cls(conn, offer, rank, peer, lock)
            except (OSError, ValueError):
                reader = None  # not reachable from here after all: the payloads stay on TCP
        with lock:
            send_frame(conn, encode_header(SHM_ACK, 0, int(reader is not None), 0, rank), peer=peer)
        return reader

    def begin(self, nbytes: int) -> None:
        """A message of ``nbytes`` starts (its SHM frame arrived)."""
        self._message_left = self._unannounced = nbytes

    def read_into(self, view: memoryview, deadline: float) -> None:
        """Fill ``view`` with the next ``len(view)`` bytes of the current message, waiting for its chunks.

        Raises:
            ProtocolError: a frame other than the next CHUNK, or a chunk larger than its slot or the message.
            PeerLostError, DistTimeoutError: from the connection.
        """
        if len(view) > self._message_left:
            raise ProtocolError(f"read of {len(view)} bytes past the end of rank {self._peer}'s message")
        self._message_left -= len(view)
        got = 0
        while got < len(view):
            if not self._left:
                self._next_chunk(deadline)
            n = min(self._left, len(view) - got)
            _copy(view[got : got + n], self.view[self._at : self._at + n])
            got += n
            self._at += n
            self._left -= n
            if not self._left:
                with self.lock:
                    send_frame(self._conn, encode_header(CREDIT, self._slot, 0, 0, self._rank), peer=self._peer)
                self._slot = (self._slot + 1) % self.slots

    def _next_chunk(self, deadline: float) -> None:
        head = bytearray(HEADER_SIZE)
        recv_exact_into(self._conn, memoryview(head), peer=self._peer, deadline=deadline)
        h = decode_header(head)
        if h.kind != CHUNK or h.ctx != self._slot or not 0 < h.nbytes <= min(self.slot_size, self._unannounced):
            raise ProtocolError(f"rank {self._peer} sent {h} where chunk {self._slot} of its shared ring was due")
        self._unannounced -= h.nbytes
        self._at, self._left = _HEAD + self._slot * self.slot_size, h.nbytes

    def close(self) -> None:
        """Unmap the peer's ring; idempotent."""
        _unmap(self.view, self._map)


def credits_only(data: bytes) -> bool:
    """Whether ``data`` (bytes waiting on a sending connection) holds nothing but whole CREDIT frames."""
    return len(data) % HEADER_SIZE == 0 and all(data[i + 3] == CREDIT for i in range(0, len(data), HEADER_SIZE))


def _copy(dst: memoryview, src: memoryview) -> None:
    """``dst[:] = src`` without the GIL (numpy releases it), so a rank's sender and receiver threads copy at once."""
    np.copyto(np.frombuffer(dst, np.uint8), np.frombuffer(src, np.uint8))


def _unmap(view: memoryview, mapping: mmap.mmap) -> None:
    """Release ``view`` and close ``mapping``; a view still in use elsewhere leaves both to the collector."""
    try:
        view.release()
        mapping.close()
    except BufferError:
        pass
