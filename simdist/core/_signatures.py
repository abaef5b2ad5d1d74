"""Collective signatures: the report of a mismatch, and a compact binary form for the wire.

A signature is the dict of fields that must agree on every rank for the k-th collective
on a group (``CollectiveCall.signature``: op, dtype, shape or counts, root, reduce op,
algorithm, async or not; a backend may add the group and the sequence number). The
simulator compares the Python dicts; the socket backend compares digests of their
encoding and, only when the digests differ, exchanges the encodings to name the fields.

Encoding (fields in sorted key order, so equal dicts encode equally; ``varint`` is unsigned
LEB128, 7 bits a byte, low bits first; ``zigzag`` maps 0, -1, 1, -2 ... to 0, 1, 2, 3 ...)::

    varint  number of fields, then per field:
        u8      key length, key (UTF-8)
        u8      kind, then the value:
                0 None   1 False   2 True
                3 int    zigzag varint (64-bit range)
                4 str    varint length, UTF-8
                5 ints   varint count, count x zigzag varint   (a shape, counts, ranks)

An all_reduce's signature with its group and sequence number takes about 120 bytes (most of
them the field names); only its 16-byte digest travels while ranks agree.
Anything else (a float, a nested tuple, an int beyond 64 bits) is refused with
``TypeError``: signatures hold only these kinds.
"""

from __future__ import annotations

import hashlib
from typing import Any

from ._errors import CollectiveMismatchError, ProtocolError

__all__ = ["DIGEST_BYTES", "decode_signature", "encode_signature", "mismatch_error", "signature_digest"]

DIGEST_BYTES = 16
"""Bytes of :func:`signature_digest` (BLAKE2b): what a rank sends when signatures agree."""

_NONE, _FALSE, _TRUE, _INT, _STR, _INTS = range(6)
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


def mismatch_error(group_id: int, seq: int, first: tuple, other: tuple) -> CollectiveMismatchError | None:
    """The error for two ranks' calls of collective ``seq`` on a group; ``None`` if they agree.

    ``first`` and ``other`` are ``(rank, signature, call_site)``; ``first`` is the call the
    other is compared with (the simulator: the first rank to arrive; sockets: group rank 0).
    The message names both call sites and, for each differing field, both values and ranks.
    """
    (first_rank, a, first_site), (rank, b, site) = first, other
    if a == b:
        return None
    diff = {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
    if not diff:
        return None
    fields = ", ".join(f"{k}: {va!r} on rank {first_rank} vs {vb!r} on rank {rank}" for k, (va, vb) in diff.items())
    return CollectiveMismatchError(
        f"collective mismatch on group {group_id} (collective {seq} of the group): "
        f"rank {first_rank} called {a.get('op')} at {first_site}, rank {rank} called "
        f"{b.get('op')} at {site}; differing fields: {fields}",
        ranks=(first_rank, rank),
        call_sites=(first_site, site),
        fields=diff,
    )


def signature_digest(signature: dict[str, Any]) -> bytes:
    """16 bytes that are equal for equal signatures (BLAKE2b of :func:`encode_signature`)."""
    return hashlib.blake2b(encode_signature(signature), digest_size=DIGEST_BYTES).digest()


def encode_signature(signature: dict[str, Any]) -> bytes:
    """``signature`` in the compact binary form of this module's table.

    Raises:
        TypeError: a key that is not a short str, or a value of a kind the table lacks.
    """
    out = bytearray()
    _put_varint(out, len(signature))
    for key in sorted(signature):
        name = key.encode() if isinstance(key, str) else b""
        if not name or len(name) > 255:
            raise TypeError(f"signature key {key!r:.60} must be a non-empty str of at most 255 bytes")
        out.append(len(name))
        out += name
        _encode_value(out, key, signature[key])
    return bytes(out)


def _is_i64(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and _I64_MIN <= v <= _I64_MAX


def _encode_value(out: bytearray, key: str, value: Any) -> None:
    if value is None or isinstance(value, bool):
        out.append({None: _NONE, False: _FALSE, True: _TRUE}[value])
    elif _is_i64(value):
        out.append(_INT)
        _put_varint(out, _zigzag(value))
    elif isinstance(value, str):
        data = value.encode()
        out.append(_STR)
        _put_varint(out, len(data))
        out += data
    elif isinstance(value, tuple) and all(_is_i64(v) for v in value):
        out.append(_INTS)
        _put_varint(out, len(value))
        for v in value:
            _put_varint(out, _zigzag(v))
    else:
        raise TypeError(
            f"signature field {key!r} = {value!r:.60} cannot be encoded: expected None, a bool, a 64-bit int, "
            "a str or a tuple of 64-bit ints"
        )


def _zigzag(v: int) -> int:
    return (v << 1) if v >= 0 else ((-v << 1) - 1)


def _put_varint(out: bytearray, n: int) -> None:
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def decode_signature(data: bytes) -> dict[str, Any]:
    """The signature that :func:`encode_signature` turned into ``data``.

    Raises:
        ProtocolError: ``data`` does not follow the table (cut short, an unknown kind, bytes left over).
    """
    reader = _Reader(data)
    try:
        out: dict[str, Any] = {}
        for _ in range(reader.varint()):
            key = reader.take(reader.byte()).decode()
            out[key] = reader.value()
    except ValueError as exc:  # UnicodeDecodeError is one
        raise ProtocolError(f"a collective signature of {len(data)} bytes does not decode: {exc}") from None
    if reader.pos != len(data):
        raise ProtocolError(f"a collective signature of {len(data)} bytes has {len(data) - reader.pos} bytes left over")
    return out


class _Reader:
    """Reads the table's items from ``data``; ``ValueError`` when it is cut short or malformed."""

    def __init__(self, data: bytes):
        self.data, self.pos = bytes(data), 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise ValueError(f"cut short at byte {self.pos}")
        self.pos += 1
        return self.data[self.pos - 1]

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError(f"cut short: {n} bytes wanted at byte {self.pos}")
        self.pos += n
        return self.data[self.pos - n : self.pos]

    def varint(self) -> int:
        n = shift = 0
        while True:
            b = self.byte()
            n |= (b & 0x7F) << shift
            if b < 0x80:
                return n
            shift += 7
            if shift > 63:
                raise ValueError(f"a varint longer than 64 bits at byte {self.pos}")

    def signed(self) -> int:
        z = self.varint()
        return (z >> 1) if not z & 1 else -((z + 1) >> 1)

    def value(self) -> Any:
        kind = self.byte()
        if kind in (_NONE, _FALSE, _TRUE):
            return (None, False, True)[kind]
        if kind == _INT:
            return self.signed()
        if kind == _STR:
            return self.take(self.varint()).decode()
        if kind == _INTS:
            count = self.varint()
            if count > len(self.data) - self.pos:  # each int takes at least one byte
                raise ValueError(f"{count} ints announced with {len(self.data) - self.pos} bytes left")
            return tuple(self.signed() for _ in range(count))
        raise ValueError(f"unknown kind {kind} at byte {self.pos - 1}")
