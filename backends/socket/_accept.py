"""Accepting connections with bounds that hold before a client has proved the secret.

Both servers of the socket backend (the store and each rank's peer listener) accept
through one :class:`Acceptor`: a thread that accepts, and one thread per connection
that authenticates it, then serves it. Until a connection has authenticated it is
owed nothing, so these bounds hold whatever a client sends or withholds:

=========================  ==============================================================
``MAX_HANDSHAKES`` (64)    connections in the handshake at once; one more is closed at once,
                           before any thread starts for it
``HANDSHAKE_DEADLINE_S``   seconds (5) for the whole handshake (authentication, and a peer's
                           hello); a fixed deadline, not the operation timeout, so a client
                           that sends one byte a second is cut after 5 s, not 300 s
finished threads           a connection's thread leaves the acceptor's table when it ends;
                           nothing grows with the number of connections ever made
``REFUSAL_LOG_INTERVAL_S`` refused connections are logged at most once per 10 s per level
                           (WARNING: wrong secret or over the cap; INFO: anything else); the
                           next line counts the refusals not logged in between
=========================  ==============================================================

After authentication the client holds the secret, so its connection is served for as
long as it lasts; what it sends is still bounded per frame (:func:`frame_deadline`).
"""

from __future__ import annotations

import errno
import logging
import math
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from simdist.core import AuthenticationError, DistError, ProtocolError

__all__ = [
    "FRAME_DEADLINE_S", "FRAME_MIN_RATE", "HANDSHAKE_DEADLINE_S", "MAX_HANDSHAKES", "REFUSAL_LOG_INTERVAL_S",
    "Acceptor", "RefusalLog", "frame_deadline",
]  # fmt: skip

MAX_HANDSHAKES = 64
HANDSHAKE_DEADLINE_S = 5.0
REFUSAL_LOG_INTERVAL_S = 10.0
FRAME_DEADLINE_S = 30.0
"""Seconds an authenticated frame of the store has from its first byte, plus its size at ``FRAME_MIN_RATE``."""
FRAME_MIN_RATE = 1 << 20
"""Bytes per second: the slowest sender a frame deadline allows for (1 MiB/s; a 64 MiB value gets 64 s more)."""
_BUSY_PAUSE_S = 0.05  # after accept() fails for lack of file descriptors or memory
_ACCEPT_JOIN_S = 5.0  # seconds close() waits at least for the accepting thread, which is woken at once


def frame_deadline(nbytes: int, base: float) -> float:
    """Seconds a frame of ``nbytes`` may take from its first byte to its last: ``base`` plus
    the time ``nbytes`` take at ``FRAME_MIN_RATE``."""
    return base + nbytes / FRAME_MIN_RATE


class RefusalLog:
    """Log lines about refused connections, at most one per ``interval`` seconds per level.

    A refusal inside the interval is counted, not logged; the next line (another
    refusal once the interval has passed, or :meth:`flush`) says how many there were.
    """

    def __init__(self, logger: logging.Logger, what: str, interval: float = REFUSAL_LOG_INTERVAL_S):
        self._log = logger
        self._what = what
        self._interval = interval
        self._lock = threading.Lock()
        self._levels: dict[int, list] = {}  # level -> [time of the last line, refusals not logged, the last reason]

    def refused(self, level: int, reason: str) -> None:
        """Log (or count) one refused connection; ``reason`` names the client and why."""
        with self._lock:
            now = time.monotonic()
            state = self._levels.setdefault(level, [-math.inf, 0, ""])
            if now - state[0] < self._interval:
                state[1] += 1
                state[2] = reason
                return
            skipped = state[1]
            state[:] = [now, 0, ""]
        more = f" ({skipped} more refused since the last line)" if skipped else ""
        self._log.log(level, "%s refused a connection from %s%s", self._what, reason, more)

    def flush(self, force: bool = False) -> None:
        """Log the count of refusals not logged yet, for each level whose interval has passed
        (every level when ``force``)."""
        lines = []
        with self._lock:
            now = time.monotonic()
            for level, state in self._levels.items():
                if state[1] and (force or now - state[0] >= self._interval):
                    lines.append((level, state[1], now - state[0], state[2]))
                    state[:] = [now, 0, ""]
        for level, skipped, seconds, last in lines:
            self._log.log(
                level,
                "%s refused %d more connection(s) in the last %.0f s; the last from %s",
                self._what,
                skipped,
                seconds,
                last,
            )


class Acceptor:
    """Accepts connections on ``listener`` in a thread, within the bounds above.

    Each accepted connection gets a thread that calls ``authenticate(conn, seconds)``
    (which must finish within ``seconds`` or raise), then ``serve(conn, state)`` with what
    ``authenticate`` returned; the connection is closed when either returns or raises.
    A connection refused (over the cap, or ``authenticate`` raised
    :class:`~simdist.DistError` or :class:`OSError`) goes to ``on_refused(addr, exc)`` and
    to the rate-limited log. ``serve`` handles its own errors; an exception it lets out is
    a bug and reaches :func:`threading.excepthook`.

    Args:
        name: the name of the connections' threads (the accepting one adds ``-accept``).
        what: how log lines name the server, e.g. ``"simdist store on port 29500"``.
    """

    def __init__(
        self,
        listener: socket.socket,
        *,
        authenticate: Callable[[socket.socket, float], Any],
        serve: Callable[[socket.socket, Any], None],
        name: str,
        what: str,
        logger: logging.Logger,
        on_refused: Callable[[Any, BaseException], None] | None = None,
        max_handshakes: int | None = None,
        handshake_deadline: float | None = None,
    ):
        self._listener = listener
        self._authenticate = authenticate
        self._serve = serve
        self._name = name
        self._on_refused = on_refused
        self.max_handshakes = MAX_HANDSHAKES if max_handshakes is None else max_handshakes
        self.handshake_deadline = HANDSHAKE_DEADLINE_S if handshake_deadline is None else float(handshake_deadline)
        if isinstance(self.max_handshakes, bool) or not isinstance(self.max_handshakes, int) or self.max_handshakes < 1:
            raise ValueError(f"max_handshakes must be an int >= 1, got {max_handshakes!r}")
        if not 0 < self.handshake_deadline < math.inf:
            raise ValueError(f"handshake_timeout must be a finite number of seconds > 0, got {handshake_deadline!r}")
        self.log = RefusalLog(logger, what)
        self._lock = threading.Lock()
        self._closed = False
        self._conns: dict[socket.socket, threading.Thread] = {}  # live connections and their threads
        self._handshaking = 0
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._accept_loop, name=f"{name}-accept", daemon=True)
        self._thread.start()

    def counts(self) -> tuple[int, int]:
        """``(connections in the handshake, connections open)`` now."""
        with self._lock:
            return self._handshaking, len(self._conns)

    def _accept_loop(self) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self._listener, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while True:
                ready = sel.select(REFUSAL_LOG_INTERVAL_S)
                self.log.flush()
                if self._closed or any(key.fileobj is self._wake_r for key, _ in ready):
                    return
                if ready:
                    self._accept_one()

    def _accept_one(self) -> None:
        try:
            conn, addr = self._listener.accept()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                time.sleep(_BUSY_PAUSE_S)  # the listener stays readable: do not spin
            return
        why = None
        with self._lock:
            if self._closed:
                conn.close()
                return
            if self._handshaking >= self.max_handshakes:
                why = f"over the cap of {self.max_handshakes} connections in the handshake; closed at once"
            else:
                thread = threading.Thread(target=self._run, args=(conn, addr), name=self._name, daemon=True)
                try:
                    thread.start()
                except RuntimeError as exc:  # the process cannot start another thread now
                    why = f"no thread for it ({exc}); closed at once"
                else:
                    self._handshaking += 1
                    self._conns[conn] = thread
        if why is not None:
            conn.close()
            self._refused(addr, ProtocolError(why), logging.WARNING)

    def _refused(self, addr: Any, exc: BaseException, level: int) -> None:
        where = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) and len(addr) >= 2 else str(addr)
        self.log.refused(level, f"{where}: {type(exc).__name__}: {exc}")
        if self._on_refused is not None:
            self._on_refused(addr, exc)

    def _run(self, conn: socket.socket, addr: Any) -> None:
        try:
            try:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                state = self._authenticate(conn, self.handshake_deadline)
            except (DistError, OSError) as exc:
                if not self._closed or isinstance(exc, AuthenticationError):  # not an effect of close()
                    level = logging.WARNING if isinstance(exc, AuthenticationError) else logging.INFO
                    self._refused(addr, exc, level)
                return
            finally:
                with self._lock:
                    self._handshaking -= 1
            self._serve(conn, state)
        finally:
            with self._lock:
                self._conns.pop(conn, None)
            conn.close()

    def close(self, timeout: float = 5.0) -> None:
        """Stop accepting, shut down every connection and wait (up to ``timeout`` s) for their
        threads; logs the refusals not logged yet. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        deadline = time.monotonic() + timeout
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(max(timeout, _ACCEPT_JOIN_S))
        if not self._thread.is_alive():  # else it still has a wake-up to read: leave it its sockets
            self._wake_r.close()
            self._wake_w.close()
        with self._lock:
            conns = dict(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in conns.values():
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        self.log.flush(force=True)
