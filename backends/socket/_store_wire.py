"""The wire format of the rendezvous store: its messages, how they are encoded and parsed,
and how a frame is read from a socket within its limits (:mod:`._store` serves and uses it).

Wire format (big-endian). A frame is ``[u32 payload length][payload]``.

* request payload: ``[u8 op][fields]``, response payload: ``[u8 kind][fields]``; the
  fields of each op and kind are listed in ``REQUEST_LAYOUT`` and ``RESPONSE_LAYOUT``.
  A *field* is ``[u32 length][bytes]``, an *int* a signed ``i64``, a *key list*
  ``[i64 count][count key fields]``; keys and messages are UTF-8. For example
  GET is ``[2][i64 timeout_ms][u32 n][key]`` and its answer ``[1][u32 n][value]`` (BYTES)
  or ``[3][i64 count][missing keys]`` (TIMEOUT). A *value list* is ``[i64 count][count
  value fields]``: MULTI_GET answers ITEMS, the keys that exist and their values, in one
  frame without waiting.
* WILL ``(key, value)`` sets the connection's last will; a WILL with an empty key withdraws it.

A payload is at most ``max_value_bytes + HEADER_SLACK`` bytes and every field at most
``max_value_bytes``; both are checked before anything is read. A payload is allocated in
pieces as its bytes arrive, never at the size its prefix announces (:func:`read_frame`).
:func:`parse_request` and :func:`parse_response` take a whole frame, :func:`decode_request`
and :func:`decode_response` the payload :func:`read_frame` returns; all of them raise only
``ProtocolError`` on malformed bytes.
"""

from __future__ import annotations

import enum
import math
import socket
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass

from simdist.core import ProtocolError

from ._accept import frame_deadline
from ._frames import MAX_SOCKET_TIMEOUT

__all__ = [
    "DEFAULT_MAX_VALUE_BYTES", "HEADER_SLACK", "REQUEST_LAYOUT", "RESPONSE_LAYOUT", "Kind",
    "Op", "Request", "Response", "decode_request", "decode_response", "encode_request", "encode_response",
    "parse_request", "parse_response", "read_frame",
]  # fmt: skip

DEFAULT_MAX_VALUE_BYTES = 64 * 1024 * 1024
HEADER_SLACK = 1024 * 1024  # room for the op, ints and keys around the largest value
_FIRST_PIECE = 64 * 1024  # bytes: the first piece of a payload; each later one at most doubles what arrived

_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")


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


def decode_request(payload: memoryview, max_value_bytes: int) -> Request:
    """The request in ``payload`` (a frame without its length prefix); raises only ProtocolError."""
    code, keys, values, number = _Reader(payload, max_value_bytes).message(REQUEST_LAYOUT, "op")
    return Request(Op(code), tuple(keys), tuple(values), number)


def decode_response(payload: memoryview, max_value_bytes: int) -> Response:
    """The response in ``payload`` (a frame without its length prefix); raises only ProtocolError."""
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
    return decode_request(_unframe(data, max_value_bytes), max_value_bytes)


def parse_response(data: bytes, max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES) -> Response:
    """Decode one complete response frame (length prefix included); raises only ProtocolError."""
    return decode_response(_unframe(data, max_value_bytes), max_value_bytes)


# ---------------------------------------------------------------------------------------
# reading a frame from a socket


def _recv_into(sock: socket.socket, view: memoryview, deadline: float | None) -> int:
    """Fill ``view``; returns the number of bytes read (short only at EOF)."""
    got = 0
    while got < len(view):
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("timed out")
            sock.settimeout(min(left, MAX_SOCKET_TIMEOUT))
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


def read_frame(
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
