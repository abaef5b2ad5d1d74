"""Pairwise connections between the ranks of a socket job: framed, full duplex, tagged.

A :class:`PeerNetwork` listens on ``host:0`` and publishes its address in the store
under ``peer/{rank}``. The first send to a peer connects to the peer's address,
authenticates (:mod:`._auth`) and says hello with its rank (:mod:`._links`); from then
on that connection carries this rank's frames to the peer. Each accepted connection gets
a receiver thread that reads the peer's frames (:mod:`._receiving`). So every pair of
ranks talks over two connections, one per direction, and an algorithm can send and
receive at once.

This module keeps what ties the parts together: posting, completion, waiting, lost
peers and closing, all under the network's one lock (``PeerNetwork._cond``). The parts:

==================  ===============================================================
:mod:`._links`      connecting, the hello, what a peer writes back on the
                    connection this rank sends on, the shared-ring offer
:mod:`._sending`    writing one peer's frames in posting order, and the goodbye
:mod:`._receiving`  reading one peer's frames and delivering them
:mod:`._matching`   the posted and unexpected tables and their rules
==================  ===============================================================

Sending: a send of up to ``_INLINE_MAX`` bytes to a peer with nothing else queued or
being written (and a connection already made) is written by the calling thread inside
:meth:`PeerNetwork.isend`, which saves the hand-off to another thread. Every other send
goes to the peer's sender thread, in posting order. Both write through
:meth:`._sending.Sender.write` under the peer's send lock, so frames never interleave and
a send never overtakes one posted before it.

Shared memory: a send of at least ``_shm.MIN_BYTES`` to a peer on the same host (and in the
same pid namespace) puts its payload in a shared ring the two ranks map (:mod:`._shm`); the
connection still carries its header, in order, so matching, goodbyes and failures are those
of TCP. The first such send offers the ring; a peer that cannot map it says so and the
payloads stay on TCP (other hosts, ``SIMDIST_SHM=0``).

Matching: messages from one peer with one ``(ctx, tag)`` match receives in the order
both were posted. A receive posted before its frame arrives is filled straight from
the socket (no copy); a frame that arrives first is kept as an *unexpected* message
and copied when the receive is posted (:class:`._matching.Mailbox`).

Accepting: through :class:`._accept.Acceptor`, which bounds connections before they have
authenticated (a cap on handshakes, a fixed deadline for the handshake and the hello,
rate-limited log lines). After the hello, a frame's payload must arrive within
``frame_deadline(nbytes, timeout)`` of its header, and an unexpected payload is allocated
in pieces that grow with what arrived.

Goodbye: :meth:`PeerNetwork.close` writes a CLOSE frame on every connection, after
the sends already queued. A peer whose connection ends without one (it died) is lost:
every pending and later operation with it fails with
:class:`~simdist.PeerLostError` naming its rank. A rank that leaves because it failed
says so (CLOSE with tag ``FAILING``): its peers count it as lost at once.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from queue import SimpleQueue
from typing import Any

from simdist.core import arrays as A
from simdist.core import check_int
from simdist.core import DistError, DistTimeoutError, PeerLostError, ProtocolError
from simdist.algorithms import Lender

from . import _links, _shm
from ._accept import Acceptor
from ._failures import FAILING, LIVENESS_ENV, POLL_S
from ._frames import CLOSE, encode_header
from ._links import hung_up, read_hello
from ._matching import Mailbox, Message, mismatch
from ._receiving import Receiver
from ._scratch import ScratchPool
from ._sending import RESUME, STOP, Sender

__all__ = ["Handle", "PeerNetwork", "PeerTransport"]

log = logging.getLogger(__name__)

_MAX_TAG = (1 << 63) - 1
_MAX_CTX = (1 << 64) - 1
_PROBE_INTERVAL = 0.25  # seconds between checks of idle connections while a wait blocks
# seconds a wait blocks before it publishes this rank's state itself: a hang is seen where it is, and
# collectives that finish sooner skip the store round trip (publishing on every wait doubled the
# latency of a small all_reduce between two processes, 300 -> 600-750 us)
_BLOCKED_S = 0.05
_EXPLAIN_TRIES, _EXPLAIN_GAP_S = 4, 0.1  # reads of the failure records that may explain a failed wait
_INLINE_MAX = 1 << 20  # bytes: larger sends always go to the sender thread (see Sender.write)
_PEEK_BYTES = 1 << 16  # what a probe peeks at: more than the credits a ring can owe (``SLOTS`` frames)


def _byte_view(buf: Any, argname: str = "buf") -> memoryview:
    """A 1-D byte view of flat host buffer ``buf``, sharing its memory."""
    view = A.plain_bytes(buf)
    if view is not None:
        return view
    A.check_array(buf, argname)
    try:
        flat = A.flat(buf)
    except ValueError:
        raise ValueError(f"{argname} must be contiguous (shape {A.shape_of(buf)})") from None
    return memoryview(A.host_bytes(flat)).cast("B")


def _make_error(cls: type, message: str, rank: int | None) -> DistError:
    return cls(message, rank=rank) if issubclass(cls, PeerLostError) else cls(message)


class Handle:
    """One posted send or receive. ``done`` turns true when it completed or failed."""

    __slots__ = (
        "ctx",
        "device",
        "done",
        "error",
        "kind",
        "nbytes",
        "peer",
        "rest",
        "seq",
        "source",
        "state",
        "tag",
        "view",
    )

    def __init__(self, kind: str, peer: int | None, ctx: int, tag: int, view: memoryview):
        self.kind = kind
        self.peer = peer
        self.ctx = ctx
        self.tag = tag
        self.nbytes = len(view)
        self.view: memoryview | None = view
        self.seq = 0
        self.state = "posted"
        self.done = False
        self.error: BaseException | None = None
        self.source = peer  # for a receive from any source: the rank it matched
        self.device: tuple | None = None  # a receive into device memory: (device buffer, host buffer)
        self.rest: list[memoryview] | None = None  # a send's frame, what an inline write left for the sender thread

    def describe(self) -> str:
        where = (
            f"to rank {self.peer}"
            if self.kind == "send"
            else ("from any source" if self.peer is None else f"from rank {self.peer}")
        )
        return f"{self.kind} {where} (ctx {self.ctx}, tag {self.tag}, {self.nbytes} bytes, {self.state})"

    def __repr__(self) -> str:
        return f"<Handle {self.describe()}{' done' if self.done else ''}>"


class _Peer:
    """What this rank knows about one other rank."""

    def __init__(self, rank: int):
        self.rank = rank
        self.recv_failure: tuple[type, str] | None = None  # set once frames from the peer can no longer come
        self.send_failure: tuple[type, str] | None = None  # set once frames to the peer can no longer go
        self.lost: str | None = None  # why, once the peer is gone without a goodbye
        self.queue: SimpleQueue | None = None  # the sender thread's work, once started
        self.sender: threading.Thread | None = None
        self.send_lock = threading.Lock()  # held by whoever writes on ``outbound``
        self.unsent = 0  # sends posted and not yet finished (queued or being written)
        self.resume: Handle | None = None  # a send an inline write began, for the sender thread to finish
        self.outbound: socket.socket | None = None
        self.poller: select.poll | None = None  # tells when ``outbound`` has something to read
        self.inbound: socket.socket | None = None
        self.ring: _shm.Ring | bool | None = None  # the shared ring this rank writes to the peer; False: TCP only
        self.reader: _shm.RingReader | None = None  # the peer's shared ring, mapped, once it offered one
        self.back_lock = threading.Lock()  # held by whoever writes on ``inbound`` (credits, the goodbye)


class PeerNetwork:
    """This rank's connections to the other ranks of a job.

    Args:
        rank, world_size: this process's global rank and the number of ranks.
        store: the rendezvous store: anything with ``set(key, bytes)`` and a ``get(key)``
            that waits until the key exists.
        secret: the shared secret every connection must prove (:mod:`._auth`).
        host: the address to listen on and publish (loopback unless told otherwise).
        timeout: the default timeout of :meth:`wait`, and of connecting and handshakes.
        monitor: what :meth:`wait` consults while it blocks (a :class:`._failures.FailureMonitor`):
            the failure records of the ranks it waits for; ``None``: only the connections.

    Example (two processes; ``store`` reachable by both)::

        net = PeerNetwork(rank, 2, store, secret)
        buf = torch.arange(4.0) if rank == 0 else torch.zeros(4)
        h = net.isend(buf, 1, ctx=0, tag=7) if rank == 0 else net.irecv(buf, 0, ctx=0, tag=7)
        net.wait([h])     # rank 1: buf is now [0., 1., 2., 3.]
        net.close()
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        store: Any,
        secret: bytes,
        *,
        host: str = "127.0.0.1",
        timeout: float = 300.0,
        monitor: Any = None,
    ):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self.rank = rank
        self.world_size = world_size
        self.timeout = float(timeout)
        self._store = store
        self._monitor = monitor
        self._secret = secret
        self._cond = threading.Condition(threading.Lock())
        self._peers = [_Peer(p) for p in range(world_size)]
        self._senders = [Sender(self, p) for p in self._peers]
        self._mail = Mailbox(world_size)  # the posted and unexpected tables, guarded by ``_cond``
        self.scratch = ScratchPool()  # the scratch buffers of finished collectives (``PeerTransport.lend``)
        self._closed = False
        self._farewell = 0  # the tag of the goodbye (CLOSE) frames: FAILING when this rank failed
        self._threads: list[threading.Thread] = []
        self._rejected: deque[str] = deque(maxlen=8)
        self._shm = _shm.enabled()  # large payloads to same-host peers go through shared memory (._shm)
        self._rings = 0  # shared rings this rank decided on (it offers at most _shm.MAX_RINGS)
        try:
            self._listener = socket.create_server((host, 0), backlog=128)
        except OSError as exc:
            raise DistError(f"rank {rank} cannot listen on {host}: {exc.strerror or exc}") from exc
        self.address = f"{host}:{self._listener.getsockname()[1]}"
        self._acceptor = Acceptor(
            self._listener,
            authenticate=self._authenticate,
            serve=self._serve,
            name=f"simdist-peers-recv:{rank}",
            what=f"simdist rank {rank} (peers on {self.address})",
            logger=log,
            on_refused=self._refused,
        )
        try:
            store.set(f"peer/{rank}", self.address.encode())
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        return f"PeerNetwork(rank={self.rank}, world_size={self.world_size}, address={self.address!r})"

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- posting -------------------------------------------------------------------

    def _check(self, peer: Any, ctx: Any, tag: Any, what: str) -> tuple[int | None, int, int]:
        """``(peer, ctx, tag)`` as ints, or ``ValueError`` naming the bad one."""
        if peer is not None:
            peer = check_int(peer, f"{what}: peer", 0, self.world_size - 1)
            if peer == self.rank:
                raise ValueError(f"{what}: rank {self.rank} cannot {what} to or from itself")
        return peer, check_int(ctx, f"{what}: ctx", 0, _MAX_CTX), check_int(tag, f"{what}: tag", 0, _MAX_TAG)

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise DistError(f"{what} on rank {self.rank}: the peer network is closed")

    def isend(self, buf: Any, peer: int, ctx: int, tag: int) -> Handle:
        """Post a send of flat buffer ``buf`` to global rank ``peer``; ``buf`` must not
        change until the handle completes (its bytes are written to the connection). A
        buffer in device memory (CUDA) is copied to the host first.

        A small send to an idle, connected peer is written here and now, as far as the
        connection takes it without waiting (the handle comes back done or failed); the rest
        of it, and any other send, goes to the peer's sender thread, so a peer that reads
        nothing or a link that is down never holds up the caller (its waits report them).

        Raises:
            ValueError: a bad peer, ctx or tag, or a buffer that is not contiguous.
            DistError: the network is closed.
        """
        peer, ctx, tag = self._check(peer, ctx, tag, "isend")
        op = Handle("send", peer, ctx, tag, _byte_view(A.on_host(buf)))
        with self._cond:
            self._check_open("isend")
            p = self._peers[peer]
            if p.send_failure is not None:
                self._fail(op, p.send_failure, peer)
                return op
            p.unsent += 1
            inline = (
                p.unsent == 1
                and p.outbound is not None
                and op.nbytes <= _INLINE_MAX
                and p.send_lock.acquire(blocking=False)
            )
            if not inline:
                op.state = "queued"
                self._sender_queue(p).put(op)
                return op
        try:
            if not self._senders[peer].write(op, now=True):  # the rest waits for the connection: the thread's
                with self._cond:
                    op.state = "queued"
                    p.resume = op
                    self._sender_queue(p).put(RESUME)
        finally:
            p.send_lock.release()
        return op

    def irecv(self, buf: Any, peer: int | None, ctx: int, tag: int) -> Handle:
        """Post a receive from global rank ``peer`` (``None``: any source) into flat buffer
        ``buf``, which must be exactly the size of the message (else :meth:`wait` raises
        :class:`~simdist.ProtocolError`). ``handle.source`` tells the sender once matched.
        A buffer in device memory (CUDA) receives through a host buffer, copied in by :meth:`wait`.

        Raises:
            ValueError: a bad peer, ctx or tag, or a buffer that is read-only or not contiguous.
            DistError: the network is closed.
        """
        peer, ctx, tag = self._check(peer, ctx, tag, "irecv")
        host = buf if A.device_of(buf) == "cpu" else A.host_empty(buf)
        view = _byte_view(host)
        if view.readonly:
            raise ValueError("irecv: buf is read-only; results cannot be written into it")
        op = Handle("recv", peer, ctx, tag, view)
        if host is not buf:
            op.device = (buf, host)
        with self._cond:
            self._check_open("irecv")
            msg = self._mail.take(op)
            if msg is None:
                failure = None if peer is None else self._peers[peer].recv_failure
                if failure is not None:
                    self._fail(op, failure, peer)
                else:
                    self._mail.post(op)
                return op
            op.source = msg.src
            if not msg.arrived:
                op.state = "receiving"
                msg.op = op
                return op
        self._deliver(msg, op)
        return op

    # -- completion ------------------------------------------------------------------

    def _complete(self, op: Handle) -> None:
        with self._cond:
            op.view = None
            op.state = "done"
            op.done = True
            self._cond.notify_all()

    def _fail(self, op: Handle, failure: tuple[type, str], rank: int | None) -> None:
        """Fail ``op`` (the lock is held) with a fresh error of ``failure = (class, reason)``."""
        if op.done:
            return
        cls, reason = failure
        op.error = _make_error(cls, f"rank {self.rank}: {op.describe()} failed: {reason}", rank)
        op.view = None
        op.state = "failed"
        op.done = True
        self._cond.notify_all()

    def _deliver(self, msg: Message, op: Handle) -> None:
        """Copy an unexpected message into the receive it matched."""
        if msg.nbytes != op.nbytes:
            with self._cond:
                self._fail(op, (ProtocolError, mismatch(msg.nbytes, op, msg.src)), msg.src)
            return
        self._mail.unload(msg, op.view)
        self._complete(op)

    def wait(
        self, handles: Iterable[Handle], timeout: float | None = None, *, group: Sequence[int] | None = None
    ) -> None:
        """Block until every handle has completed.

        Args:
            timeout: seconds; ``None``: the network's timeout.
            group: the global ranks of a collective call. If one of them is lost (died)
                meanwhile, the call cannot complete and this raises at once.

        With a ``monitor``, a wait blocked for ``_BLOCKED_S`` has this rank's state published, then
        reads the failure records of the ranks it depends on every ``POLL_S`` seconds: a
        rank that failed anywhere (even one never connected to) ends the wait, and a lost
        peer or a timeout is reported as the failure it was, with the rank's error.

        Raises:
            PeerLostError: a peer of one of the handles (or of ``group``) failed, closed its
                connection or died; ``rank`` names it.
            ProtocolError: a message's size differs from its receive buffer's.
            DistTimeoutError: ``timeout`` seconds passed first; the message names what is
                still pending. The operations stay posted.
        """
        handles = list(handles)
        limit = self.timeout if timeout is None else timeout
        now = time.monotonic()
        deadline, poll_at = now + limit, now + POLL_S
        ranks = {*(group or ()), *(op.peer for op in handles)} - {self.rank}
        blocked = False
        unreachable_since: float | None = None  # when the store stopped answering this wait's reads
        while True:
            with self._cond:
                error, pending = self._wait_locked(
                    handles, group, limit, deadline, poll_at if blocked else now + _BLOCKED_S
                )
            if error is None and not pending:
                break
            if self._monitor is None:
                raise error
            if error is not None:
                raise self._explained(error, ranks)
            if not blocked:
                blocked = True
                self._monitor.blocked()
                continue
            asked_at = time.monotonic()
            try:
                failed = self._monitor.failures(ranks)
                unreachable_since = None
            except DistError as exc:  # the store is unreachable: the peers may still finish, for a while
                failed = {}
                unreachable_since = unreachable_since or self._monitor.answered_at(asked_at)
                if time.monotonic() - unreachable_since > self._monitor.liveness:
                    raise DistError(
                        f"{exc}, for more than {self._monitor.liveness:g} s ({LIVENESS_ENV}): this host's link is "
                        "down, or the store's host is frozen or gone; pending:\n"
                        + "\n".join(f"  {op.describe()}" for op in pending[:8])
                    ) from exc
            if failed:
                with self._cond:
                    for rank, (_, why) in failed.items():
                        self._lose(self._peers[rank], (PeerLostError, why), receiving=False)
                root, why = next(iter(failed.values()))
                raise PeerLostError(
                    f"rank {self.rank}: {why}; pending:\n" + "\n".join(f"  {op.describe()}" for op in pending[:8]),
                    rank=root,
                )
            poll_at = time.monotonic() + (0.0 if unreachable_since else POLL_S)  # a read that failed waited 2 s
        for op in handles:
            if op.device is not None:  # received through host memory: copy into the device buffer
                (dst, host), op.device = op.device, None
                A.copy_(dst, host)

    def _wait_locked(
        self, handles: list[Handle], group: Sequence[int] | None, limit: float, deadline: float, wake_at: float
    ) -> tuple[DistError | None, list[Handle]]:
        """Wait (the lock is held) until the handles are done, one fails, a peer of ``group`` is lost,
        the deadline passes, or ``wake_at`` comes; ``(error, pending handles)``."""
        probe_at = time.monotonic() + _PROBE_INTERVAL
        while True:
            failed = next((op for op in handles if op.error is not None), None)
            if failed is not None:
                return failed.error.with_traceback(None), []
            pending = [op for op in handles if not op.done]
            if not pending:
                return None, []
            gone = next((q for q in group or () if self._peers[q].lost), None)
            if gone is not None:
                return PeerLostError(
                    f"rank {self.rank}: rank {gone} of group {tuple(group)} was lost "
                    f"({self._peers[gone].lost}); the collective cannot complete. Pending:\n"
                    + "\n".join(f"  {op.describe()}" for op in pending[:8]),
                    rank=gone,
                ), pending
            now = time.monotonic()
            if now >= deadline:
                return DistTimeoutError(self._timeout_message(pending, limit)), pending
            if now >= wake_at and self._monitor is not None:
                return None, pending
            if now >= probe_at:
                self._probe({*(group or ()), *(op.peer for op in pending)} - {None, self.rank})
                probe_at = now + _PROBE_INTERVAL
            self._cond.wait(min(deadline, probe_at, *((wake_at,) if self._monitor is not None else ())) - now)

    def _explained(self, error: DistError, ranks: set[int | None]) -> DistError:
        """``error`` (a lost peer, a timeout), or the failure recorded for a rank it depends on, which
        caused it: a failed rank is named with its own error, never hidden behind a timeout."""
        for _ in range(_EXPLAIN_TRIES):  # a peer that just died: the store records it a moment later
            try:
                failed = self._monitor.failures(ranks, fresh=True)
            except DistError:
                return error
            if failed:
                break
            time.sleep(_EXPLAIN_GAP_S)
        else:
            return error
        lost = error.rank if isinstance(error, PeerLostError) else None
        root, why = failed[lost] if lost in failed else next(iter(failed.values()))
        explained = PeerLostError(f"rank {self.rank}: {why} ({type(error).__name__}: {error})", rank=root)
        explained.__cause__ = error
        return explained

    def _probe(self, ranks: Iterable[int]) -> None:
        """Find peers that died while this rank was not sending to them (the lock is held).

        A connection this rank sends on carries nothing back but credits of the shared
        ring and a goodbye, so an end of stream (or a reset) there with nothing but credits
        before it means the peer is gone.
        """
        for q in ranks:
            p = self._peers[q]
            sock = p.outbound
            if sock is None or p.send_failure is not None:
                continue
            try:
                with sock.dup() as probe:  # a non-blocking twin; the sender thread keeps its timeout
                    probe.settimeout(0)
                    waiting = probe.recv(_PEEK_BYTES, socket.MSG_PEEK)
                    if waiting and not (_shm.credits_only(waiting) and hung_up(probe)):
                        continue  # a goodbye is waiting (the sender thread reads it), or credits from a live peer
                reason = f"rank {q} closed its connection without a goodbye (it exited or died)"
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as exc:
                reason = f"rank {q}'s connection broke: {exc}"
            self._lose(p, (PeerLostError, reason), receiving=False)

    def _lose(self, p: _Peer, failure: tuple[type, str], *, receiving: bool) -> None:
        """Peer ``p`` is gone without a goodbye: fail what involves it (the lock is held).

        Receives fail here only when no connection from ``p`` exists, or ``receiving``
        says that connection has ended: frames ``p`` wrote before dying may still be
        in flight on it.
        """
        if p.lost is None:
            p.lost = failure[1]
        if p.send_failure is None:
            p.send_failure = failure
        if receiving or p.inbound is None:
            self._fail_receives(p, failure)
        self._cond.notify_all()

    def _timeout_message(self, pending: list[Handle], limit: float) -> str:
        lines = [f"rank {self.rank}: {len(pending)} operation(s) still pending after the timeout of {limit:g} s:"]
        lines += [f"  {op.describe()}" for op in pending[:8]]
        if len(pending) > 8:
            lines.append(f"  ... and {len(pending) - 8} more")
        if self._rejected:
            lines.append("incoming connections rejected: " + "; ".join(self._rejected))
        return "\n".join(lines)

    # -- receiving --------------------------------------------------------------------

    def _authenticate(self, conn: socket.socket, seconds: float) -> _Peer:
        """Authenticate an incoming connection and read its hello, all within ``seconds``; the
        peer it comes from, whose ``inbound`` it now is."""
        rank = read_hello(conn, self._secret, seconds, self.rank, self.world_size)
        with self._cond:
            if self._closed:
                raise DistError("the peer network is closing")
            p = self._peers[rank]
            if p.inbound is not None:
                raise ProtocolError(f"a second connection claims to be rank {rank}")
            p.inbound = conn
        return p

    def _refused(self, addr: Any, exc: BaseException) -> None:
        """Remember an incoming connection refused before its hello (timeouts name the last few)."""
        if not self._closed:
            with self._cond:
                self._rejected.append(f"{addr}: {type(exc).__name__}: {exc}")

    def _serve(self, conn: socket.socket, p: _Peer) -> None:
        Receiver(self, p, conn).run()

    def _fail_receives(self, p: _Peer, failure: tuple[type, str]) -> None:
        """No more frames will come from ``p``: fail its posted receives, and later ones (the lock is held)."""
        if p.recv_failure is None:
            p.recv_failure = failure
        for op in self._mail.withdraw(p.rank):
            self._fail(op, failure, p.rank)

    # -- transports and closing -----------------------------------------------------

    def hosts(self, ranks: Sequence[int]) -> list[str]:
        """The address each of ``ranks`` listens on, without its port, waiting until each published it
        (ranks of one machine share it: it is the machine's address on the route to node 0)."""
        return [bytes(self._store.get(f"peer/{r}")).decode("ascii", "replace").rpartition(":")[0] for r in ranks]

    def transport(
        self,
        group_ranks: Sequence[int],
        group_rank: int,
        ctx: int,
        timeout: float | None = None,
        hosts: Sequence[str] | None = None,
    ) -> PeerTransport:
        """A :class:`~simdist.algorithms.Transport` for one collective call of a group.

        Args:
            group_ranks: the global rank of each group rank.
            group_rank: this process's rank in the group.
            ctx: the context that keeps this call's messages apart from every other's.
            timeout: the group's timeout in seconds for each wait; ``None``: the network's.
            hosts: the machine of each group rank, for the algorithms that read them (:meth:`hosts`).
        """
        return PeerTransport(self, group_ranks, group_rank, ctx, timeout, hosts)

    def _sender_queue(self, p: _Peer) -> SimpleQueue:
        """The queue of ``p``'s sender thread, started on first use; the caller holds the lock."""
        if p.queue is None:
            p.queue = SimpleQueue()
            p.sender = self._start(self._senders[p.rank].run, f"simdist-peers-send:{self.rank}->{p.rank}")
        return p.queue

    def _start(self, target: Any, name: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()
        return thread

    def close(self, failed: bool = False) -> None:
        """Say goodbye to every peer and stop the threads; idempotent.

        Sends already posted are written first. Receives still pending fail with
        :class:`~simdist.DistError`. ``failed``: this rank leaves because it failed, and
        its goodbye says so (the peers fail what waits for it at once).
        """
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._farewell = FAILING if failed else 0
            failure = (DistError, "the peer network was closed")
            for op in self._mail.withdraw():
                self._fail(op, failure, op.peer)
            for p in self._peers:
                if p.queue is not None:
                    p.queue.put(STOP)
        deadline = time.monotonic() + min(self.timeout, _links.LINGER) + 1.0
        for p in self._peers:
            if p.sender is not None:
                p.sender.join(max(0.0, deadline - time.monotonic()))
        with self._cond:
            inbound = [p for p in self._peers if p.inbound is not None]
            stuck = [p.outbound for p in self._peers if p.outbound is not None and p.sender.is_alive()]
        for p in inbound:  # the goodbye in the other direction, so the peer stops sending
            try:
                with p.back_lock:
                    p.inbound.settimeout(0.5)
                    p.inbound.sendall(encode_header(CLOSE, 0, self._farewell, 0, self.rank))
            except OSError:
                pass
        for sock in stuck:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._acceptor.close(max(0.1, deadline - time.monotonic()))  # shuts down every accepted connection
        for t in self._threads:
            t.join(max(0.1, deadline - time.monotonic()))
        self._listener.close()
        for p in self._peers:  # the shared rings: unmapped here, freed by the kernel once the peer's go too
            if isinstance(p.ring, _shm.Ring):
                p.ring.close()
            if p.reader is not None:
                p.reader.close()


class PeerTransport(Lender):
    """The :class:`~simdist.algorithms.Transport` of one collective call: group ranks, one ctx. Its
    scratch buffers come from the network's pool, and go back to it by :meth:`give_back`."""

    __slots__ = ("_ctx", "_lent", "_net", "_ranks", "_timeout", "hosts", "rank", "size")

    def __init__(
        self,
        network: PeerNetwork,
        group_ranks: Sequence[int],
        group_rank: int,
        ctx: int,
        timeout: float | None = None,
        hosts: Sequence[str] | None = None,
    ):
        self._net = network
        self.hosts = hosts
        self._ranks = tuple(group_ranks)
        self._ctx = ctx
        self._timeout = timeout
        self.rank = group_rank
        self.size = len(self._ranks)
        self._lent: list = []
        if not 0 <= group_rank < self.size or self._ranks[group_rank] != network.rank:
            raise ValueError(f"group rank {group_rank} of {self._ranks} is not global rank {network.rank}")

    def _global(self, peer: int) -> int:
        return self._ranks[check_int(peer, "peer (a group rank)", 0, self.size - 1)]

    def isend(self, buf: Any, peer: int, tag: int = 0, *, chunk: int | None = None) -> Handle:
        return self._net.isend(buf, self._global(peer), self._ctx, tag)

    def irecv(self, buf: Any, peer: int, tag: int = 0, *, chunk: int | None = None) -> Handle:
        return self._net.irecv(buf, self._global(peer), self._ctx, tag)

    def wait(self, handles: Iterable[Handle]) -> None:
        self._net.wait(handles, self._timeout, group=self._ranks)

    def lend(self, like: Any, numel: int) -> Any:
        key, buf = self._net.scratch.take(like, numel)
        self._lent.append((key, buf))
        return buf

    def give_back(self) -> None:
        """Return the scratch buffers this call was lent, once every message of the call has completed
        (not after a failure: a message may still read or write them)."""
        for key, buf in self._lent:
            self._net.scratch.give(key, buf)
        self._lent.clear()
