"""The rendezvous key-value store: torch's ``Store`` semantics over a small binary protocol.

:class:`StoreServer` holds the keys (a thread per client); :class:`StoreClient` talks to
it over one authenticated connection. Waits (``get``, ``wait``) happen on the server,
on a condition variable, with the timeout sent in the request, so a timed-out wait is
answered "timed out" by the server; the client's socket deadline (the timeout plus
``REPLY_MARGIN_S``) covers a server that never answers. Nothing is ever unpickled.

Wire format (big-endian). A frame is ``[u32 payload length][payload]``.

* request payload: ``[u8 op][fields]``, response payload: ``[u8 kind][fields]``; the
  fields of each op and kind are listed in ``REQUEST_LAYOUT`` and ``RESPONSE_LAYOUT``.
  A *field* is ``[u32 length][bytes]``, an *int* a signed ``i64``, a *key list*
  ``[i64 count][count key fields]``; keys and messages are UTF-8. For example
  GET is ``[2][i64 timeout_ms][u32 n][key]`` and its answer ``[1][u32 n][value]`` (BYTES)
  or ``[3][i64 count][missing keys]`` (TIMEOUT). A *value list* is ``[i64 count][count
  value fields]``: MULTI_GET answers ITEMS, the keys that exist and their values, in one
  frame without waiting.
* WILL ``(key, value)`` is the connection's last will: if the connection ends before it
  is withdrawn (a WILL with an empty key), the server sets ``key`` to ``value`` unless
  ``key`` exists. A rank's will records that it died (``._failures``).

A payload is at most ``max_value_bytes + HEADER_SLACK`` bytes and every field at most
``max_value_bytes``; both are checked before anything is read. A payload is allocated in
pieces as its bytes arrive, never at the size its prefix announces. The server closes a
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
import enum
import logging
import math
import re
import select
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from simdist._checks import timeout_seconds
from simdist._errors import DistError, DistTimeoutError, ProtocolError

from ._accept import FRAME_DEADLINE_S, HANDSHAKE_DEADLINE_S, Acceptor, frame_deadline
from ._auth import SECRET_ENV, authenticated, resolve_secret, secret_from_env, server_handshake

__all__ = [
    "DEFAULT_MAX_VALUE_BYTES", "HEADER_SLACK", "REPLY_MARGIN_S", "REQUEST_LAYOUT", "RESPONSE_LAYOUT", "Kind", "Op",
    "Request", "Response", "StoreClient", "StoreServer", "encode_request", "encode_response", "main",
    "parse_request", "parse_response",
]  # fmt: skip

log = logging.getLogger(__name__)

DEFAULT_MAX_VALUE_BYTES = 64 * 1024 * 1024
HEADER_SLACK = 1024 * 1024  # room for the op, ints and keys around the largest value
# How much longer than a request's timeout the client waits for the answer: a server on a busy
# machine may answer a timed-out wait late, and only a server that never answers should meet it.
REPLY_MARGIN_S = 5.0
DEFAULT_PORT = 29500
_MAX_SOCKET_TIMEOUT = 1e8  # seconds; sockets refuse timeouts past time_t
GONE_PROBE_S = 0.25  # seconds between checks, while a GET or WAIT waits, that its client is still there
_FIRST_PIECE = 64 * 1024  # bytes: the first piece of a payload; each later one at most doubles what arrived

_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_INTEGER = re.compile(rb"[+-]?[0-9]+")


class Op(enum.IntEnum):
    """Request operation codes."""

    SET = 1
    GET = 2
    ADD = 3
    COMPARE_SET = 4
    WAIT = 5
    CHECK = 6
    DELETE = 7
    NUM_KEYS = 8
    MULTI_GET = 9
    WILL = 10


class Kind(enum.IntEnum):
    """Response kinds."""

    NONE = 0
    BYTES = 1
    INT = 2
    TIMEOUT = 3
    ERROR = 4
    ITEMS = 5


# The fields after the op (or kind) byte, in wire order: "key" a key field, "keys" a key
# list, "value" a field, "values" a value list, "text" a UTF-8 field, "int" an i64, "timeout" an
# i64 >= 0 (ms).
REQUEST_LAYOUT: dict[int, tuple[str, ...]] = {
    Op.SET: ("key", "value"),
    Op.GET: ("timeout", "key"),
    Op.ADD: ("key", "int"),
    Op.COMPARE_SET: ("key", "value", "value"),
    Op.WAIT: ("timeout", "keys"),
    Op.CHECK: ("keys",),
    Op.DELETE: ("key",),
    Op.NUM_KEYS: (),
    Op.MULTI_GET: ("keys",),
    Op.WILL: ("key", "value"),
}
RESPONSE_LAYOUT: dict[int, tuple[str, ...]] = {
    Kind.NONE: (),
    Kind.BYTES: ("value",),
    Kind.INT: ("int",),
    Kind.TIMEOUT: ("keys",),
    Kind.ERROR: ("text",),
    Kind.ITEMS: ("keys", "values"),
}


@dataclass(frozen=True)
class Request:
    """One decoded request: ``values`` is ``(value,)`` for SET and ``(expected, desired)`` for
    COMPARE_SET; ``number`` is ADD's amount, or GET's and WAIT's timeout in milliseconds."""

    op: Op
    keys: tuple[str, ...] = ()
    values: tuple[bytes, ...] = ()
    number: int = 0


@dataclass(frozen=True)
class Response:
    """One decoded response: ``values`` is ``(value,)`` for BYTES and ``(UTF-8 message,)`` for
    ERROR; ``number`` is INT's (booleans are 0/1); ``keys`` are the keys a TIMEOUT still misses;
    ITEMS holds the keys that exist and their ``values``, in the same order."""

    kind: Kind
    keys: tuple[str, ...] = ()
    values: tuple[bytes, ...] = ()
    number: int = 0


# ---------------------------------------------------------------------------------------
# encoding and parsing


def _field(data: bytes) -> bytes:
    return _U32.pack(len(data)) + data


def _encode(code: int, layout: tuple[str, ...], keys: Sequence[str], values: Sequence[bytes], number: int) -> bytes:
    parts = [bytes([code])]
    rest = iter(values)
    for kind in layout:
        if kind == "key":
            parts.append(_field(keys[0].encode("utf-8")))
        elif kind == "keys":
            parts += [_I64.pack(len(keys)), *(_field(k.encode("utf-8")) for k in keys)]
        elif kind in ("value", "text"):
            value = next(rest)
            parts += [_U32.pack(len(value)), value]
        elif kind == "values":
            items = list(rest)
            parts += [_I64.pack(len(items)), *map(_field, items)]
        else:
            parts.append(_I64.pack(number))
    return b"".join([_U32.pack(sum(map(len, parts))), *parts])


def encode_request(req: Request) -> bytes:
    """The frame (length prefix included) for ``req``."""
    return _encode(req.op, REQUEST_LAYOUT[req.op], req.keys, req.values, req.number)


def encode_response(resp: Response) -> bytes:
    """The frame (length prefix included) for ``resp``."""
    return _encode(resp.kind, RESPONSE_LAYOUT[resp.kind], resp.keys, resp.values, resp.number)


class _Reader:
    """Reads fields from a payload; every malformation raises ProtocolError before any copy."""

    def __init__(self, payload: memoryview, max_value_bytes: int):
        self.buf = payload
        self.pos = 0
        self.max = max_value_bytes

    def _take(self, n: int, what: str) -> memoryview:
        if n > len(self.buf) - self.pos:
            raise ProtocolError(
                f"truncated frame: {what} needs {n} bytes, {len(self.buf) - self.pos} left at offset {self.pos}"
            )
        view = self.buf[self.pos : self.pos + n]
        self.pos += n
        return view

    def i64(self, what: str) -> int:
        return _I64.unpack(self._take(8, what))[0]

    def field(self, what: str) -> memoryview:
        (n,) = _U32.unpack(self._take(4, f"the length of {what}"))
        if n > self.max:
            raise ProtocolError(f"{what} of {n} bytes exceeds the limit of {self.max} bytes")
        return self._take(n, what)

    def text(self, what: str) -> str:
        raw = self.field(what)
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"{what} is not valid UTF-8: {exc}") from None

    def _count(self, what: str) -> int:
        count = self.i64(f"{what} count")
        if count < 0 or count > (len(self.buf) - self.pos) // 4:
            raise ProtocolError(f"{what} count {count} does not fit in the {len(self.buf) - self.pos} bytes left")
        return count

    def keys(self) -> list[str]:
        return [self.text(f"key {i}") for i in range(self._count("key"))]

    def values(self) -> list[bytes]:
        return [bytes(self.field(f"value {i}")) for i in range(self._count("value"))]

    def message(self, layouts: dict[int, tuple[str, ...]], what: str) -> tuple[int, list[str], list[bytes], int]:
        """``(code, keys, values, number)`` of the whole payload, which must hold nothing more."""
        code = self._take(1, what)[0]
        if code not in layouts:
            raise ProtocolError(f"unknown {what} {code}")
        keys: list[str] = []
        values: list[bytes] = []
        number = 0
        for kind in layouts[code]:
            if kind == "key":
                keys.append(self.text("key"))
            elif kind == "keys":
                keys += self.keys()
            elif kind == "value":
                values.append(bytes(self.field("value")))
            elif kind == "values":
                values += self.values()
            elif kind == "text":
                values.append(self.text("message").encode("utf-8"))
            else:
                number = self.i64(kind)
                if kind == "timeout" and number < 0:
                    raise ProtocolError(f"negative timeout {number} ms")
        if self.pos != len(self.buf):
            raise ProtocolError(f"{len(self.buf) - self.pos} trailing bytes after a complete message")
        return code, keys, values, number


def _decode_request(payload: memoryview, max_value_bytes: int) -> Request:
    code, keys, values, number = _Reader(payload, max_value_bytes).message(REQUEST_LAYOUT, "op")
    return Request(Op(code), tuple(keys), tuple(values), number)


def _decode_response(payload: memoryview, max_value_bytes: int) -> Response:
    code, keys, values, number = _Reader(payload, max_value_bytes).message(RESPONSE_LAYOUT, "response kind")
    return Response(Kind(code), tuple(keys), tuple(values), number)


def _unframe(data: bytes | bytearray | memoryview, max_value_bytes: int) -> memoryview:
    view = memoryview(data).cast("B")
    if len(view) < 4:
        raise ProtocolError(f"truncated frame: {len(view)} bytes, the length prefix alone is 4")
    (n,) = _U32.unpack(view[:4])
    if n > max_value_bytes + HEADER_SLACK:
        raise ProtocolError(f"frame of {n} bytes exceeds the limit of {max_value_bytes + HEADER_SLACK} bytes")
    if len(view) - 4 < n:
        raise ProtocolError(f"truncated frame: the prefix says {n} bytes, {len(view) - 4} follow")
    if len(view) - 4 > n:
        raise ProtocolError(f"{len(view) - 4 - n} trailing bytes after a frame of {n} bytes")
    return view[4:]


def parse_request(data: bytes, max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES) -> Request:
    """Decode one complete request frame (length prefix included).

    Raises:
        ProtocolError: anything malformed (and nothing else): unknown op, truncation,
            a length past the end or over the limits, a non-UTF-8 key, trailing bytes.
    """
    return _decode_request(_unframe(data, max_value_bytes), max_value_bytes)


def parse_response(data: bytes, max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES) -> Response:
    """Decode one complete response frame (length prefix included); raises only ProtocolError."""
    return _decode_response(_unframe(data, max_value_bytes), max_value_bytes)


def _recv_into(sock: socket.socket, view: memoryview, deadline: float | None) -> int:
    """Fill ``view``; returns the number of bytes read (short only at EOF)."""
    got = 0
    while got < len(view):
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("timed out")
            sock.settimeout(min(left, _MAX_SOCKET_TIMEOUT))
        n = sock.recv_into(view[got:])
        if n == 0:
            break
        got += n
    return got


def _recv_payload(sock: socket.socket, n: int, deadline: float | None) -> memoryview:
    """``n`` bytes from ``sock``, allocated in pieces as they arrive: after the first
    ``_FIRST_PIECE`` bytes no piece is larger than what already came, so memory follows the
    bytes received (at most twice them, plus the join at the end), not the announced ``n``."""
    pieces: list[bytearray] = []
    got = 0
    while got < n:
        piece = bytearray(min(n - got, max(_FIRST_PIECE, got)))
        if _recv_into(sock, memoryview(piece), deadline) < len(piece):
            raise ProtocolError(f"connection closed inside a frame of {n} bytes")
        pieces.append(piece)
        got += len(piece)
    return memoryview(pieces[0] if len(pieces) == 1 else b"".join(pieces))


def _read_frame(
    sock: socket.socket, max_value_bytes: int, deadline: float | None, frame_timeout: float | None = None
) -> memoryview | None:
    """The payload of the next frame, or None at a clean EOF between frames.

    ``deadline`` (monotonic) bounds the whole read. With ``frame_timeout``, the wait for
    a frame's first byte has no other bound, and the frame then has
    ``frame_deadline(n, frame_timeout)`` seconds to arrive. The length is checked
    against the limit before anything is allocated; see :func:`_recv_payload`.
    """
    head = memoryview(bytearray(4))
    first = 4 if frame_timeout is None else 1  # a frame deadline starts at the frame's first byte
    if frame_timeout is not None and deadline is None:
        sock.settimeout(None)
    got = _recv_into(sock, head[:first], deadline)
    if got == 0:
        return None
    start = time.monotonic()
    if frame_timeout is not None:
        deadline = min(math.inf if deadline is None else deadline, start + frame_deadline(0, frame_timeout))
    got += _recv_into(sock, head[got:], deadline)
    if got < 4:
        raise ProtocolError(f"connection closed inside a frame header ({got} of 4 bytes)")
    (n,) = _U32.unpack(head)
    if n > max_value_bytes + HEADER_SLACK:
        raise ProtocolError(f"frame of {n} bytes exceeds the limit of {max_value_bytes + HEADER_SLACK} bytes")
    if frame_timeout is not None:
        deadline = min(deadline, start + frame_deadline(n, frame_timeout))
    return _recv_payload(sock, n, deadline)


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
        self._wills: dict[socket.socket, tuple[str, bytes]] = {}  # each connection's last will (Op.WILL)
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
                payload = _read_frame(conn, self._max, None, self._frame_timeout)
                if payload is None:
                    return
                resp = self._execute(_decode_request(payload, self._max), conn)
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

    def _read_will(self, conn: socket.socket) -> None:
        """``conn`` has ended: carry out its last will, unless the server is closing."""
        with self._cond:
            will = self._wills.pop(conn, None)
            if will is not None and not self._closed and will[0] not in self._data:
                self._data[will[0]] = will[1]
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
            if req.op is Op.MULTI_GET:
                return self._items(req.keys)
            if req.op is Op.WILL:
                if req.keys[0]:
                    self._wills[conn] = (req.keys[0], req.values[0])
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
                    (self.host, self.port), timeout=min(max(left, 0.001), _MAX_SOCKET_TIMEOUT)
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
                self._sock.settimeout(min(max(deadline - time.monotonic(), 0.001), _MAX_SOCKET_TIMEOUT))
                self._sock.sendall(frame)
                payload = _read_frame(self._sock, self._max, deadline)
                if payload is None:
                    failure = DistError(f"{what}: {where} closed the connection{_WHY_CLOSED}")
                else:
                    resp = _decode_response(payload, self._max)
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

    def set(self, key: str, value: bytes, timeout: float | None = None) -> None:
        """Store ``value`` under ``key`` (replacing any value) and wake the waiters on it."""
        key, value, t = _key(key), self._value(value, "value"), self._timeout(timeout)
        self._request(Request(Op.SET, keys=(key,), values=(value,)), t, f"set({key!r})")

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
        """Make ``key = value`` this connection's last will: if the connection ends before
        ``will("", b"")`` withdraws it (this process exited or died), the server sets ``key``
        to ``value`` unless ``key`` exists. A later will replaces an earlier one."""
        key, value, t = _key(key), self._value(value, "value"), self._timeout(timeout)
        self._request(Request(Op.WILL, keys=(key,), values=(value,)), t, f"will({key!r})")


# ---------------------------------------------------------------------------------------
# standalone server


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m simdist.backends.socket._store``: serve until SIGTERM or Ctrl-C."""
    parser = argparse.ArgumentParser(
        prog="python -m simdist.backends.socket._store",
        description=f"Run a standalone simdist rendezvous store. The secret comes from ${SECRET_ENV} (required).",
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
