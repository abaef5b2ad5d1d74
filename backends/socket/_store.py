"""The rendezvous key-value store: torch's ``Store`` semantics over a small binary protocol.

:class:`StoreServer` holds the keys (a thread per client); :class:`StoreClient` talks to
it over one authenticated connection. Waits (``get``, ``wait``) happen on the server,
on a condition variable, with the timeout sent in the request, so a timed-out wait is
answered "timed out" by the server; the client's socket deadline (the timeout plus
``REPLY_MARGIN_S``) covers a server that never answers. Nothing is ever unpickled.

The messages, their wire format and their limits are in :mod:`._store_wire`. WILL
``(key, value)`` adds to a connection's last will: if the connection ends before the will is
withdrawn (a WILL with an empty key), the server sets each such ``key`` to its ``value``, in
the order given, unless ``key`` exists. A rank's will records that it died (``._failures``).
:meth:`StoreServer.load` counts the requests served and the keys they named; ``simdist run --log-dir``
logs them each second (``store_load.jsonl``). The server closes a
connection that sends a malformed frame and keeps serving the others.

Bounds of the server (see :mod:`._accept`): at most ``MAX_HANDSHAKES`` connections in the
handshake, each with ``HANDSHAKE_DEADLINE_S`` to authenticate; refusals logged at most once
per ``REFUSAL_LOG_INTERVAL_S``; after authentication, a frame has ``frame_timeout`` seconds
from its first byte (plus its size at ``FRAME_MIN_RATE``); a GET or WAIT whose client has
closed its connection ends within ``GONE_PROBE_S``, freeing its thread.

Run a standalone server with ``python -m simdist.backends.socket._store --host H --port P``
(the secret comes from ``$SIMDIST_SECRET``, which is required).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterable, Sequence

from simdist.core import timeout_seconds
from simdist.core import DistError, DistTimeoutError, ProtocolError

from ._accept import FRAME_DEADLINE_S, HANDSHAKE_DEADLINE_S, Acceptor
from ._auth import SECRET_ENV, authenticated, resolve_secret, secret_from_env, server_handshake
from ._frames import MAX_SOCKET_TIMEOUT
from ._store_wire import (
    DEFAULT_MAX_VALUE_BYTES,
    HEADER_SLACK,
    Kind,
    Op,
    Request,
    Response,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    read_frame,
)

__all__ = ["REPLY_MARGIN_S", "StoreClient", "StoreServer", "main"]

log = logging.getLogger(__name__)

# How much longer than a request's timeout the client waits for the answer: a server on a busy
# machine may answer a timed-out wait late, and only a server that never answers should meet it.
REPLY_MARGIN_S = 5.0
DEFAULT_PORT = 29500
GONE_PROBE_S = 0.25  # seconds between checks, while a GET or WAIT waits, that its client is still there

_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1  # the range of the wire's int fields
_INTEGER = re.compile(rb"[+-]?[0-9]+")


def _check_limit(max_value_bytes: int) -> int:
    if isinstance(max_value_bytes, bool) or not isinstance(max_value_bytes, int) or not 0 < max_value_bytes < 2**32:
        raise ValueError(f"max_value_bytes must be an int in [1, 2**32), got {max_value_bytes!r}")
    return max_value_bytes


# ---------------------------------------------------------------------------------------
# server


def _error(message: str) -> Response:
    return Response(Kind.ERROR, values=(message.encode("utf-8"),))


_RDHUP = getattr(select, "POLLRDHUP", 0)  # Linux: the peer closed its side, even with bytes still unread


def _client_gone(conn: socket.socket) -> bool:
    """Whether the client on ``conn`` has closed its side (or reset); nothing is consumed.

    Where ``poll`` reports ``POLLRDHUP`` this holds even when requests it sent before
    leaving are still unread; elsewhere such a client is seen once they are read.
    """
    if _RDHUP and hasattr(select, "poll"):
        poller = select.poll()
        poller.register(conn, _RDHUP)
        return bool(poller.poll(0))  # POLLHUP, POLLERR and POLLNVAL come unasked
    try:
        conn.settimeout(0)
        return not conn.recv(1, socket.MSG_PEEK)
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True
    finally:
        try:
            conn.settimeout(None)
        except OSError:
            pass


class StoreServer:
    """A threaded TCP key-value store; it serves from construction until :meth:`close`.

    Args:
        host: the address to listen on; loopback unless told otherwise.
        port: the port; 0 picks a free one (read it back from :attr:`port`).
        secret: the shared secret every client must prove (``None``: ``$SIMDIST_SECRET``).
        max_value_bytes: the largest value (and, plus ``HEADER_SLACK``, frame) accepted.
        handshake_timeout: seconds a new connection has to authenticate (``HANDSHAKE_DEADLINE_S``).
        max_handshakes: connections in the handshake at once; more are closed at once
            (``None``: ``MAX_HANDSHAKES``).
        frame_timeout: seconds an authenticated client's request has from its first byte,
            plus its size at ``FRAME_MIN_RATE``; a slower one closes the connection.

    Raises:
        DistError: the address cannot be bound (for example, the port is in use).
        ValueError: a bound that is not a positive number.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        secret: bytes | str | None = None,
        *,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        handshake_timeout: float = HANDSHAKE_DEADLINE_S,
        max_handshakes: int | None = None,
        frame_timeout: float = FRAME_DEADLINE_S,
    ):
        self._secret = resolve_secret(secret)
        self._max = _check_limit(max_value_bytes)
        self._frame_timeout = timeout_seconds(frame_timeout, "frame_timeout")
        self._data: dict[str, bytes] = {}
        self._cond = threading.Condition()
        self._wills: dict[socket.socket, dict[str, bytes]] = {}  # each connection's last will (Op.WILL)
        self._requests = self._keys = 0  # served so far (load)
        self._closed = False
        try:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self._listener = socket.create_server((host, port), family=family, backlog=128)
        except OSError as exc:
            raise DistError(f"the store cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
        self.host = host
        self.port: int = self._listener.getsockname()[1]
        try:
            self._acceptor = Acceptor(
                self._listener,
                authenticate=self._authenticate,
                serve=self._serve,
                name=f"simdist-store:{self.port}",
                what=f"simdist store on port {self.port}",
                logger=log,
                max_handshakes=max_handshakes,
                handshake_deadline=handshake_timeout,
            )
        except BaseException:
            self._listener.close()
            raise

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` as bound."""
        return (self.host, self.port)

    def __enter__(self) -> StoreServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"StoreServer({self.host!r}, {self.port}, closed={self._closed})"

    def close(self) -> None:
        """Stop listening, drop every connection and end pending waits; idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._acceptor.close()
        self._listener.close()

    def _authenticate(self, conn: socket.socket, seconds: float) -> None:
        server_handshake(conn, self._secret, seconds)

    def _serve(self, conn: socket.socket, _: None) -> None:
        """Answer an authenticated client's requests until it leaves, errs, or the server closes."""
        try:
            while not self._closed:
                payload = read_frame(conn, self._max, None, self._frame_timeout)
                if payload is None:
                    return
                resp = self._execute(decode_request(payload, self._max), conn)
                if resp is None:  # the server is closing, or the client left during a wait
                    return
                conn.sendall(encode_response(resp))
        except ProtocolError as exc:
            log.info("simdist store on port %d closed a connection: %s", self.port, exc)
        except TimeoutError:
            log.info(
                "simdist store on port %d closed a connection: a request did not arrive within its "
                "deadline of %g s (+1 s per MiB)",
                self.port,
                self._frame_timeout,
            )
        except OSError as exc:
            log.debug("simdist store on port %d lost a connection: %s", self.port, exc)
        finally:
            self._read_will(conn)

    def load(self) -> tuple[int, int]:
        """``(requests, keys)``: the requests served so far and the keys they named (a MULTI_GET of
        8 keys counts 8), the store's load."""
        with self._cond:
            return self._requests, self._keys

    def log_load(self, path: str, every: float = 1.0) -> None:
        """Append the store's load to ``path`` every ``every`` seconds until :meth:`close`, a JSON line each:
        ``{"time": wall-clock s, "requests": n, "keys": k, "cpu": s}``, the counts of :meth:`load` and the
        CPU time of this process so far (the store's cost where the process does little else)."""

        def run() -> None:
            with open(path, "a", encoding="utf-8") as out:
                while True:
                    requests, keys = self.load()
                    cpu = time.process_time()
                    out.write(json.dumps({"time": time.time(), "requests": requests, "keys": keys, "cpu": cpu}) + "\n")
                    out.flush()
                    with self._cond:
                        if self._closed or self._cond.wait_for(lambda: self._closed, every):
                            return

        threading.Thread(target=run, name=f"simdist-store-load:{self.port}", daemon=True).start()

    def _read_will(self, conn: socket.socket) -> None:
        """``conn`` has ended: carry out its last will, unless the server is closing."""
        with self._cond:
            will = self._wills.pop(conn, {})
            for key, value in will.items():
                if not self._closed and key not in self._data:
                    self._data[key] = value
                    self._cond.notify_all()

    def _items(self, keys: Sequence[str]) -> Response:
        """The ITEMS answer to MULTI_GET (the lock is held): the keys that exist and their values."""
        present = tuple(k for k in keys if k in self._data)
        values = tuple(self._data[k] for k in present)
        size = sum(len(v) + len(k) + 8 for k, v in zip(present, values))
        if size > self._max + HEADER_SLACK - 64:
            return _error(
                f"MULTI_GET of {len(keys)} keys: the answer would be {size} bytes, over the limit of "
                f"{self._max + HEADER_SLACK} bytes; ask for fewer keys"
            )
        return Response(Kind.ITEMS, keys=present, values=values)

    def _wait_for(self, keys: Iterable[str], timeout_ms: int, conn: socket.socket | None = None) -> list[str] | None:
        """Wait (holding the condition) until all ``keys`` exist; the missing ones on timeout,
        None if the server closed or the client on ``conn`` left meanwhile (checked every
        ``GONE_PROBE_S``). The caller holds ``self._cond``."""
        keys = list(keys)
        deadline = time.monotonic() + timeout_ms / 1000.0
        while True:
            if self._closed:
                return None
            missing = [k for k in keys if k not in self._data]
            if not missing:
                return []
            left = deadline - time.monotonic()
            if left <= 0:
                return missing
            if conn is not None and _client_gone(conn):
                return None
            self._cond.wait(min(left, GONE_PROBE_S if conn is not None else threading.TIMEOUT_MAX))

    def _execute(self, req: Request, conn: socket.socket | None = None) -> Response | None:
        data = self._data
        with self._cond:
            self._requests += 1
            self._keys += len(req.keys)
            if req.op is Op.MULTI_GET:
                return self._items(req.keys)
            if req.op is Op.WILL:
                if req.keys[0]:
                    self._wills.setdefault(conn, {})[req.keys[0]] = req.values[0]
                else:
                    self._wills.pop(conn, None)
                return Response(Kind.NONE)
            if req.op is Op.SET:
                data[req.keys[0]] = req.values[0]
                self._cond.notify_all()
                return Response(Kind.NONE)
            if req.op is Op.ADD:
                key = req.keys[0]
                current = data.get(key, b"0")
                if len(current) > 32 or not _INTEGER.fullmatch(current):
                    return _error(f"key {key!r} holds {current[:40]!r}, not a decimal integer")
                total = int(current) + req.number
                if not _I64_MIN <= total <= _I64_MAX:
                    return _error(f"{key!r} would become {total}, outside the i64 range")
                data[key] = str(total).encode("ascii")
                self._cond.notify_all()
                return Response(Kind.INT, number=total)
            if req.op is Op.COMPARE_SET:
                key, (expected, desired) = req.keys[0], req.values
                current = data.get(key)
                if (current is None and expected == b"") or current == expected:
                    data[key] = desired
                    self._cond.notify_all()
                    return Response(Kind.BYTES, values=(desired,))
                # torch's rule: a missing key with a non-empty expected value answers `expected`
                return Response(Kind.BYTES, values=(expected if current is None else current,))
            if req.op in (Op.GET, Op.WAIT):
                missing = self._wait_for(req.keys, req.number, conn)
                if missing is None:
                    return None
                if missing:
                    return Response(Kind.TIMEOUT, keys=tuple(missing))
                return Response(Kind.BYTES, values=(data[req.keys[0]],)) if req.op is Op.GET else Response(Kind.NONE)
            if req.op is Op.CHECK:
                return Response(Kind.INT, number=int(all(k in data for k in req.keys)))
            if req.op is Op.DELETE:
                return Response(Kind.INT, number=int(data.pop(req.keys[0], None) is not None))
            return Response(Kind.INT, number=len(data))  # Op.NUM_KEYS


# ---------------------------------------------------------------------------------------
# client

_WHY_CLOSED = " (the server stopped, or refused a malformed or oversized request)"
_EXPECTED = {  # the kind of a successful answer to each op
    Op.SET: Kind.NONE, Op.GET: Kind.BYTES, Op.ADD: Kind.INT, Op.COMPARE_SET: Kind.BYTES,
    Op.WAIT: Kind.NONE, Op.CHECK: Kind.INT, Op.DELETE: Kind.INT, Op.NUM_KEYS: Kind.INT,
    Op.MULTI_GET: Kind.ITEMS, Op.WILL: Kind.NONE,
}  # fmt: skip


def _key(key: object, name: str = "key") -> str:
    if not isinstance(key, str):
        raise TypeError(f"{name} must be a str, got {type(key).__name__}")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{name} {key!r} cannot be encoded as UTF-8: {exc}") from None
    return key


def _keys(keys: object) -> tuple[str, ...]:
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Iterable):
        raise TypeError(f"keys must be a list of str, got {type(keys).__name__}")
    return tuple(_key(k, "every key in keys") for k in keys)


class StoreClient:
    """One authenticated connection to a :class:`StoreServer`; safe to share between threads
    (requests are serialized, so a long ``get`` delays the other threads' requests).

    Args:
        host, port: the server's address.
        secret: the shared secret (``None``: ``$SIMDIST_SECRET``).
        timeout: the default timeout in seconds of every method (waits included).
        connect_timeout: how long to retry while the server is not up yet (default: ``timeout``).
        max_value_bytes: the largest value this client sends or accepts.

    Raises:
        DistTimeoutError: no server answered within ``connect_timeout``, or the handshake
            did not finish within ``timeout``.
        AuthenticationError: the server holds another secret.
        ProtocolError: the peer is not a simdist store.
    """

    def __init__(
        self,
        host: str,
        port: int,
        secret: bytes | str | None = None,
        *,
        timeout: float = 300.0,
        connect_timeout: float | None = None,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    ):
        self.host = host
        self.port = port
        self.timeout = timeout_seconds(timeout, "timeout")
        connect_timeout = timeout_seconds(connect_timeout, "connect_timeout", default=self.timeout)
        self._max = _check_limit(max_value_bytes)
        secret = resolve_secret(secret)
        self._lock = threading.Lock()
        self._closed = False
        self._broken: str | None = None
        deadline = time.monotonic() + connect_timeout
        self._sock = authenticated(
            lambda: self._connect(deadline, connect_timeout), secret, max(self.timeout, 0.001), connect_timeout
        )

    def _connect(self, deadline: float, connect_timeout: float) -> socket.socket:
        """A TCP connection to the server, tried again until ``deadline`` (``connect_timeout`` s from the start)."""
        delay = 0.01
        while True:
            left = deadline - time.monotonic()
            try:
                sock = socket.create_connection(
                    (self.host, self.port), timeout=min(max(left, 0.001), MAX_SOCKET_TIMEOUT)
                )
            except OSError as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DistTimeoutError(
                        f"could not connect to the store at {self.host}:{self.port} within "
                        f"{connect_timeout:g} s (last error: {exc})"
                    ) from exc
                time.sleep(min(delay, left))
                delay = min(delay * 2, 0.5)
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock

    def __enter__(self) -> StoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"StoreClient({self.host!r}, {self.port}, closed={self._closed})"

    @property
    def local_address(self) -> str:
        """The address this connection leaves from: how the store's host reaches this machine ("?" once closed)."""
        try:
            return str(self._sock.getsockname()[0])
        except OSError:
            return "?"

    def close(self) -> None:
        """Close the connection; a request blocked in another thread raises DistError."""
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        with self._lock:
            self._sock.close()

    def _timeout(self, timeout: object) -> float:
        return timeout_seconds(timeout, "timeout", default=self.timeout)

    def _request(self, req: Request, timeout: float, what: str, margin: float = REPLY_MARGIN_S) -> Response:
        frame = encode_request(req)
        if len(frame) - 4 > self._max + HEADER_SLACK:
            raise ValueError(
                f"{what}: the request is {len(frame) - 4} bytes, over the limit of {self._max + HEADER_SLACK}"
            )
        where = f"the store at {self.host}:{self.port}"
        deadline = time.monotonic() + timeout + margin
        if not self._lock.acquire(timeout=min(timeout + margin, threading.TIMEOUT_MAX)):
            raise DistTimeoutError(
                f"{what}: {where} did not answer within {timeout + margin:g} s: another "
                "request of this process is still waiting for its answer"
            )
        try:
            if self._closed:
                raise DistError(f"{what}: the client of {where} is closed")
            if self._broken:
                raise DistError(
                    f"{what}: the connection to {where} is unusable after an earlier failure: {self._broken}"
                )
            failure: DistError | None = None
            try:
                self._sock.settimeout(min(max(deadline - time.monotonic(), 0.001), MAX_SOCKET_TIMEOUT))
                self._sock.sendall(frame)
                payload = read_frame(self._sock, self._max, deadline)
                if payload is None:
                    failure = DistError(f"{what}: {where} closed the connection{_WHY_CLOSED}")
                else:
                    resp = decode_response(payload, self._max)
            except TimeoutError:
                failure = DistTimeoutError(
                    f"{what}: {where} did not answer within {timeout:g} s (+{margin:g} s margin)"
                )
            except ProtocolError as exc:
                failure = ProtocolError(f"{what}: {where} sent a malformed answer: {exc}")
            except OSError as exc:
                failure = DistError(f"{what}: lost the connection to {where}: {exc}{_WHY_CLOSED}")
                failure.__cause__ = exc
            if failure is not None:
                if self._closed:
                    failure = DistError(f"{what}: the client of {where} was closed")
                self._broken = str(failure)
                self._sock.close()
                raise failure
        finally:
            self._lock.release()
        return self._check(req, resp, timeout, what, where)

    def _check(self, req: Request, resp: Response, timeout: float, what: str, where: str) -> Response:
        if resp.kind is Kind.TIMEOUT and req.op in (Op.GET, Op.WAIT):
            missing = list(resp.keys)
            also = "" if len(missing) == len(req.keys) else f" (of {list(req.keys)!r})"
            raise DistTimeoutError(f"{what} timed out after {timeout:g} s: key(s) {missing!r}{also} missing in {where}")
        if resp.kind is Kind.ERROR:
            raise ValueError(f"{what}: {resp.values[0].decode('utf-8')}")
        if resp.kind is not _EXPECTED[req.op]:
            raise ProtocolError(f"{what}: {where} answered {resp.kind.name} to {req.op.name}")
        return resp

    def _value(self, value: object, name: str) -> bytes:
        if isinstance(value, str):
            value = value.encode("utf-8")
        elif isinstance(value, (bytearray, memoryview)):
            value = bytes(value)
        if not isinstance(value, bytes):
            raise TypeError(f"{name} must be bytes or str, got {type(value).__name__}")
        if len(value) > self._max:
            raise ValueError(f"{name} of {len(value)} bytes exceeds max_value_bytes={self._max}")
        return value

    @staticmethod
    def _ms(timeout: float) -> int:
        return min(math.ceil(timeout * 1000), _I64_MAX)

    def set(self, key: str, value: bytes, timeout: float | None = None, *, strict: bool = False) -> None:
        """Store ``value`` under ``key`` (replacing any value) and wake the waiters on it.

        ``strict``: the answer must come within ``timeout`` itself, without the margin
        (``REPLY_MARGIN_S``) left for a busy server."""
        key, value, t = _key(key), self._value(value, "value"), self._timeout(timeout)
        margin = 0.0 if strict else REPLY_MARGIN_S
        self._request(Request(Op.SET, keys=(key,), values=(value,)), t, f"set({key!r})", margin=margin)

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """The value of ``key``, waiting until it exists.

        Raises:
            DistTimeoutError: ``key`` did not appear within ``timeout`` seconds.
        """
        key, t = _key(key), self._timeout(timeout)
        return self._request(Request(Op.GET, (key,), number=self._ms(t)), t, f"get({key!r})").values[0]

    def add(self, key: str, amount: int, timeout: float | None = None) -> int:
        """Add ``amount`` to the counter ``key`` (missing counts as 0) and return the new value.

        The counter is stored as decimal ASCII, as in torch, so ``get`` reads ``b"42"``.

        Raises:
            ValueError: ``key`` holds something that is not a decimal integer, or the
                result leaves the signed 64-bit range.
        """
        key, t = _key(key), self._timeout(timeout)
        if isinstance(amount, bool) or not isinstance(amount, int):
            raise TypeError(f"amount must be an int, got {type(amount).__name__}")
        if not _I64_MIN <= amount <= _I64_MAX:
            raise ValueError(f"amount must fit in a signed 64-bit integer, got {amount}")
        resp = self._request(Request(Op.ADD, (key,), number=amount), t, f"add({key!r}, {amount})")
        return resp.number

    def compare_set(self, key: str, expected: bytes, desired: bytes, timeout: float | None = None) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected`` (or is missing and ``expected``
        is ``b""``); return the value it holds afterwards.

        As in torch, a missing key with a non-empty ``expected`` is left missing and the
        answer is ``expected``.
        """
        key, t = _key(key), self._timeout(timeout)
        expected, desired = self._value(expected, "expected"), self._value(desired, "desired")
        req = Request(Op.COMPARE_SET, keys=(key,), values=(expected, desired))
        return self._request(req, t, f"compare_set({key!r})").values[0]

    def wait(self, keys: list[str], timeout: float | None = None) -> None:
        """Return once every key in ``keys`` exists.

        Raises:
            DistTimeoutError: some keys (named in the message) are still missing after
                ``timeout`` seconds.
        """
        keys_, t = _keys(keys), self._timeout(timeout)
        self._request(Request(Op.WAIT, keys_, number=self._ms(t)), t, f"wait({list(keys_)!r})")

    def check(self, keys: list[str], timeout: float | None = None) -> bool:
        """Whether every key in ``keys`` exists now (no waiting)."""
        keys_, t = _keys(keys), self._timeout(timeout)
        return bool(self._request(Request(Op.CHECK, keys=keys_), t, f"check({list(keys_)!r})").number)

    def delete(self, key: str, timeout: float | None = None) -> bool:
        """Remove ``key``; whether it existed."""
        key, t = _key(key), self._timeout(timeout)
        return bool(self._request(Request(Op.DELETE, keys=(key,)), t, f"delete({key!r})").number)

    def num_keys(self, timeout: float | None = None) -> int:
        """The number of keys in the store."""
        return int(self._request(Request(Op.NUM_KEYS), self._timeout(timeout), "num_keys()").number)

    def multi_get(self, keys: list[str], timeout: float | None = None) -> dict[str, bytes]:
        """The values of those of ``keys`` that exist now, fetched in one request (no waiting).

        ``timeout`` bounds the whole request, with no margin: a store that does not answer
        within it raises ``DistTimeoutError`` (and leaves this client unusable).
        """
        keys_, t = _keys(keys), self._timeout(timeout)
        resp = self._request(Request(Op.MULTI_GET, keys_), t, f"multi_get({len(keys_)} keys)", margin=0.0)
        if not set(resp.keys) <= set(keys_) or len(resp.keys) != len(resp.values):
            raise ProtocolError(f"multi_get: the store answered keys {list(resp.keys)[:8]!r} it was not asked for")
        return dict(zip(resp.keys, resp.values))

    def will(self, key: str, value: bytes, timeout: float | None = None) -> None:
        """Add ``key = value`` to this connection's last will: if the connection ends before
        ``will("", b"")`` withdraws the will (this process exited or died), the server sets ``key``
        to ``value`` unless ``key`` exists, for each key willed, in order. Willing a key again
        replaces its value."""
        key, value, t = _key(key), self._value(value, "value"), self._timeout(timeout)
        self._request(Request(Op.WILL, keys=(key,), values=(value,)), t, f"will({key!r})")


# ---------------------------------------------------------------------------------------
# standalone server


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m simdist.backends.socket._store``: serve until SIGTERM or Ctrl-C."""
    parser = argparse.ArgumentParser(
        prog="python -m simdist.backends.socket._store",
        description=f"Run a standalone simdist rendezvous store. The secret comes from ${SECRET_ENV} (required).",
        epilog="examples:\n"
        f"  {SECRET_ENV}=$(cat secret) python -m simdist.backends.socket._store               # loopback, port "
        f"{DEFAULT_PORT}\n"
        f"  {SECRET_ENV}=$(cat secret) python -m simdist.backends.socket._store --host 0.0.0.0 --port 0   # any "
        "free port, every interface",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 picks one)")
    parser.add_argument("--max-value-bytes", type=int, default=DEFAULT_MAX_VALUE_BYTES)
    args = parser.parse_args(argv)
    secret = secret_from_env()
    if secret is None:
        parser.error(f"${SECRET_ENV} must be set to the shared secret (clients need the same value)")
    try:
        server = StoreServer(args.host, args.port, secret, max_value_bytes=args.max_value_bytes)
    except (DistError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"simdist store listening on {server.host}:{server.port}", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
