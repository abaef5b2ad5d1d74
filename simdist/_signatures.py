"""Collective signatures: the report of a mismatch, and a compact binary form for the wire.

A signature is the dict of fields that must agree on every rank for the k-th collective
on a group (``CollectiveCall.signature``: op, dtype, shape or counts, root, reduce op,
algorithm, async or not; a backend may add the group and the sequence number). The
simulator compares the Python dicts; the socket backend compares digests of their
encoding and, only when the digests differ, exchanges the encodings to name the fields.

Encoding (network byte order; fields in sorted key order, so equal dicts encode equally)::

    u16 number of fields, then per field:
        u8  key length, key (UTF-8)
        u8  kind, then the value:
            0 None   1 False   2 True
            3 int    i64
            4 str    u16 length, UTF-8
            5 ints   u32 count, count x i64   (a tuple of ints: a shape, counts, ranks)

Anything else (a float, a nested tuple, an int beyond 64 bits) is refused with
``TypeError``: signatures hold only these kinds.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

from ._errors import CollectiveMismatchError, ProtocolError

__all__ = ["DIGEST_BYTES", "decode_signature", "encode_signature", "mismatch_error", "signature_digest"]

DIGEST_BYTES = 16
"""Bytes of :func:`signature_digest` (BLAKE2b): what a rank sends when signatures agree."""

_NONE, _FALSE, _TRUE, _INT, _STR, _INTS = range(6)
_U8, _U16, _U32, _I64 = (struct.Struct(f) for f in ("!B", "!H", "!I", "!q"))
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
    parts = [_U16.pack(len(signature))]
    for key in sorted(signature):
        name = key.encode() if isinstance(key, str) else b""
        if not name or len(name) > 255:
            raise TypeError(f"signature key {key!r:.60} must be a non-empty str of at most 255 bytes")
        parts += [_U8.pack(len(name)), name, _encode_value(key, signature[key])]
    return b"".join(parts)


def _encode_value(key: str, value: Any) -> bytes:
    if value is None:
        return _U8.pack(_NONE)
    if isinstance(value, bool):
        return _U8.pack(_TRUE if value else _FALSE)
    if isinstance(value, int) and _I64_MIN <= value <= _I64_MAX:
        return _U8.pack(_INT) + _I64.pack(value)
    if isinstance(value, str) and len(value.encode()) <= 0xFFFF:
        data = value.encode()
        return _U8.pack(_STR) + _U16.pack(len(data)) + data
    if isinstance(value, tuple) and all(
        isinstance(v, int) and not isinstance(v, bool) and _I64_MIN <= v <= _I64_MAX for v in value
    ):
        return _U8.pack(_INTS) + _U32.pack(len(value)) + struct.pack(f"!{len(value)}q", *value)
    raise TypeError(
        f"signature field {key!r} = {value!r:.60} cannot be encoded: expected None, a bool, a 64-bit int, "
        "a str or a tuple of 64-bit ints"
    )


def decode_signature(data: bytes) -> dict[str, Any]:
    """The signature that :func:`encode_signature` turned into ``data``.

    Raises:
        ProtocolError: ``data`` does not follow the table (cut short, an unknown kind, bytes left over).
    """
    view = memoryview(data)
    try:
        (count,), pos = _U16.unpack_from(view, 0), _U16.size
        out: dict[str, Any] = {}
        for _ in range(count):
            (n,) = _U8.unpack_from(view, pos)
            key = bytes(view[pos + 1:pos + 1 + n]).decode()
            pos += 1 + n
            if len(key.encode()) != n:
                raise ValueError("key cut short")
            out[key], pos = _decode_value(view, pos)
    except (struct.error, ValueError) as exc:
        raise ProtocolError(f"a collective signature of {len(data)} bytes does not decode: {exc}") from None
    if pos != len(data):
        raise ProtocolError(f"a collective signature of {len(data)} bytes has {len(data) - pos} bytes left over")
    return out


def _decode_value(view: memoryview, pos: int) -> tuple[Any, int]:
    (kind,), pos = _U8.unpack_from(view, pos), pos + 1
    if kind in (_NONE, _FALSE, _TRUE):
        return (None, False, True)[kind], pos
    if kind == _INT:
        return _I64.unpack_from(view, pos)[0], pos + _I64.size
    if kind == _STR:
        (n,) = _U16.unpack_from(view, pos)
        data = bytes(view[pos + 2:pos + 2 + n])
        if len(data) != n:
            raise ValueError("str cut short")
        return data.decode(), pos + 2 + n
    if kind == _INTS:
        (n,) = _U32.unpack_from(view, pos)
        return struct.unpack_from(f"!{n}q", view, pos + 4), pos + 4 + 8 * n
    raise ValueError(f"unknown kind {kind}")
