"""The socket backend's frame format: header round trip, a fuzzed parser, exact reads."""

from __future__ import annotations

import socket
import struct
import threading
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from simdist.backends.socket import _frames as F

from simdist import DistTimeoutError, PeerLostError, ProtocolError

U64, I64, U32 = (1 << 64) - 1, (1 << 63) - 1, (1 << 32) - 1


def _decode_bounded(data: bytes):
    """decode_header under tracemalloc: a Header or ProtocolError, and no big allocation."""
    tracemalloc.start()
    try:
        try:
            out = F.decode_header(data)
        except ProtocolError as exc:
            out = exc
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024, f"decode_header allocated {peak} bytes for {data!r}"
    if isinstance(out, F.Header):
        assert out.kind in F.KINDS
        assert 0 <= out.nbytes <= F.MAX_FRAME_BYTES and out.tag >= 0
        assert 0 <= out.ctx <= U64 and 0 <= out.src <= U32
        assert out.kind != F.CLOSE or out.nbytes == 0
    return out


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "fields",
    [
        (F.DATA, 0, 0, 0, 0),
        (F.DATA, 1, 2, 3, 4),
        (F.DATA, U64, I64, F.MAX_FRAME_BYTES, U32),
        (F.CLOSE, 7, 0, 0, 3),
    ],
)
def test_header_round_trip(fields) -> None:
    data = F.encode_header(*fields)
    assert len(data) == F.HEADER_SIZE == 32
    assert data[:2] == F.MAGIC and data[2] == F.VERSION
    assert F.decode_header(data) == F.Header(*fields)
    assert F.decode_header(bytearray(data)) == F.decode_header(memoryview(data))


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((9, 0, 0, 0, 0), ValueError),
        ((F.DATA, -1, 0, 0, 0), ValueError),
        ((F.DATA, 0, -1, 0, 0), ValueError),
        ((F.DATA, 0, 0, F.MAX_FRAME_BYTES + 1, 0), ValueError),
        ((F.DATA, 0, 0, 0, U32 + 1), ValueError),
        ((F.CLOSE, 0, 0, 5, 0), ValueError),
        ((F.DATA, 0, 1.5, 0, 0), TypeError),
    ],
)
def test_encode_rejects_what_decode_would_reject(args, error) -> None:
    with pytest.raises(error):
        F.encode_header(*args)


def _raw(magic=F.MAGIC, version=F.VERSION, kind=F.DATA, ctx=0, tag=0, nbytes=0, src=0) -> bytes:
    return struct.pack("!2sBBQqQI", magic, version, kind, ctx, tag, nbytes, src)


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"", "32 bytes"),
        (_raw()[:-1], "32 bytes"),
        (_raw() + b"\0", "32 bytes"),
        (_raw(magic=b"XX"), "magic"),
        (_raw(version=2), "version"),
        (_raw(kind=0), "kind"),
        (_raw(kind=max(F.KINDS) + 1), "kind"),
        (_raw(tag=-5), "negative tag"),
        (_raw(nbytes=F.MAX_FRAME_BYTES + 1), "over the limit"),
        (_raw(nbytes=U64), "over the limit"),
        (_raw(kind=F.CLOSE, nbytes=1), "CLOSE"),
    ],
)
def test_decode_rejects_bad_headers(data: bytes, words: str) -> None:
    with pytest.raises(ProtocolError, match=words):
        F.decode_header(data)


@pytest.mark.timeout(60)
@settings(max_examples=2500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=80) | st.binary(min_size=32, max_size=32))
def test_fuzz_random_bytes(data: bytes) -> None:
    """Random byte strings (a third of them header-sized): only Header or ProtocolError."""
    _decode_bounded(data)


_VALID = st.one_of(
    st.builds(
        F.encode_header,
        st.just(F.DATA),
        st.integers(0, U64),
        st.integers(0, I64),
        st.integers(0, F.MAX_FRAME_BYTES),
        st.integers(0, U32),
    ),
    st.builds(
        F.encode_header, st.just(F.CLOSE), st.integers(0, U64), st.integers(0, I64), st.just(0), st.integers(0, U32)
    ),
)


@pytest.mark.timeout(60)
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    header=_VALID,
    cut=st.integers(0, 31),
    flips=st.lists(st.integers(0, 255), min_size=1, max_size=4),
    extra=st.binary(max_size=8),
)
def test_fuzz_truncated_and_flipped_headers(header: bytes, cut: int, flips: list[int], extra: bytes) -> None:
    """Valid headers cut short, with bits flipped, or with bytes appended."""
    assert F.decode_header(header) is not None
    assert isinstance(_decode_bounded(header[:cut]), ProtocolError)
    flipped = bytearray(header)
    for bit in flips:
        flipped[bit // 8] ^= 1 << (bit % 8)
    _decode_bounded(bytes(flipped))
    if extra:
        assert isinstance(_decode_bounded(header + extra), ProtocolError)


# -- reading and writing over real sockets ----------------------------------------------


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


@pytest.mark.timeout(10)
def test_recv_exact_into_collects_pieces(pair) -> None:
    a, b = pair
    payload = bytes(range(256)) * 1000

    def dribble():
        for i in range(0, len(payload), 7919):
            a.sendall(payload[i : i + 7919])
            time.sleep(0.001)

    t = threading.Thread(target=dribble)
    t.start()
    out = bytearray(len(payload))
    F.recv_exact_into(b, memoryview(out))
    t.join()
    assert out == payload
    F.recv_exact_into(b, memoryview(bytearray(0)))  # zero bytes: returns at once


@pytest.mark.timeout(10)
def test_recv_exact_into_eof_partway_is_peer_lost(pair) -> None:
    a, b = pair
    a.sendall(b"x" * 10)
    a.close()
    with pytest.raises(PeerLostError, match="after 10 of 20 bytes") as info:
        F.recv_exact_into(b, memoryview(bytearray(20)), peer=3)
    assert info.value.rank == 3


@pytest.mark.timeout(60)
def test_recv_exact_into_timeout(pair) -> None:
    a, b = pair
    a.sendall(b"abc")
    b.settimeout(0.2)
    start = time.monotonic()
    with pytest.raises(DistTimeoutError, match="after 3 of 8 bytes"):
        F.recv_exact_into(b, memoryview(bytearray(8)), peer=1)
    assert 0.15 < time.monotonic() - start < 20  # the socket's 0.2 s timeout ended the read, not a hang


@pytest.mark.timeout(20)
def test_send_frame_writes_header_then_payload(pair) -> None:
    a, b = pair
    payload = bytearray(range(251)) * 40_000  # ~10 MB: many partial sendmsg calls
    header = F.encode_header(F.DATA, 5, 6, len(payload), 2)
    t = threading.Thread(target=F.send_frame, args=(a, header, memoryview(payload)))
    t.start()
    head = bytearray(F.HEADER_SIZE)
    F.recv_exact_into(b, memoryview(head))
    h = F.decode_header(head)
    assert h == F.Header(F.DATA, 5, 6, len(payload), 2)
    out = bytearray(h.nbytes)
    F.recv_exact_into(b, memoryview(out))
    t.join()
    assert out == payload
    F.send_frame(a, F.encode_header(F.CLOSE, 0, 0, 0, 2))
    F.recv_exact_into(b, memoryview(head))
    assert F.decode_header(head).kind == F.CLOSE


@pytest.mark.timeout(10)
def test_send_frame_to_a_closed_peer_is_peer_lost(pair) -> None:
    a, b = pair
    b.close()
    with pytest.raises(PeerLostError) as info:
        for _ in range(100):
            F.send_frame(a, F.encode_header(F.DATA, 0, 0, 1 << 16, 0), memoryview(bytearray(1 << 16)), peer=4)
    assert info.value.rank == 4


@pytest.mark.timeout(10)
def test_send_frame_times_out_when_nothing_is_read(pair) -> None:
    a, _ = pair
    a.settimeout(0.2)
    payload = memoryview(bytearray(16 << 20))
    with pytest.raises(DistTimeoutError, match="took nothing"):
        F.send_frame(a, F.encode_header(F.DATA, 0, 0, len(payload), 0), payload, peer=1)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("sock_timeout", [None, 30.0])
def test_send_parts_with_a_stall_returns_the_rest_once_the_peer_takes_nothing(sock_timeout) -> None:
    """A peer that reads nothing holds the writer up for ``stall``, not for the socket's own timeout, and
    a frame that fits goes out whole (in order, after what went before)."""
    writer, reader = socket.socketpair()
    try:
        writer.settimeout(sock_timeout)
        small = F.frame_parts(F.encode_header(F.DATA, 1, 2, 3, 0), b"abc")
        assert F.send_parts(writer, small, stall=0.2) == []
        payload = memoryview(bytes(range(256)) * (64 << 12))  # 16 MiB: more than the socket buffers hold
        start = time.monotonic()
        rest = F.send_parts(writer, [payload], stall=0.2)
        waited = time.monotonic() - start
        assert 0 < sum(map(len, rest)) < len(payload) and 0.2 <= waited < 5
        reader.settimeout(5)
        head = bytearray(F.HEADER_SIZE + 3)
        F.recv_exact_into(reader, memoryview(head))
        assert F.decode_header(bytes(head[: F.HEADER_SIZE])) == F.Header(F.DATA, 1, 2, 3, 0)
        assert bytes(head[F.HEADER_SIZE :]) == b"abc"
        taken = len(payload) - sum(map(len, rest))
        got = bytearray(taken)
        F.recv_exact_into(reader, memoryview(got))
        assert got == payload[:taken]
    finally:
        writer.close()
        reader.close()
