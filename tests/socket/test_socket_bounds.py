"""The socket servers' bounds, each shown on a real server on 127.0.0.1.

Before authentication: a cap on connections in the handshake, a fixed handshake deadline,
finished threads gone, refusals logged at a bounded rate. After it: a request's memory
follows the bytes that arrived, a frame has a deadline, and a GET whose client left ends.
Thread counts are ``threading.active_count()`` or the server's threads by name in
``threading.enumerate()``; memory is what tracemalloc saw.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
import tracemalloc

import numpy as np
import pytest
from simdist.backends.socket import _accept, _auth
from simdist.backends.socket import _frames as F
from simdist.backends.socket import _links as L
from simdist.backends.socket._auth import ServerBusy
from simdist.backends.socket._peers import PeerNetwork
from simdist.backends.socket._store import StoreClient, StoreServer
from simdist.backends.socket._store_wire import DEFAULT_MAX_VALUE_BYTES, HEADER_SLACK, Op, Request, encode_request
from test_socket_peers import DictStore
from test_socket_store import SignallingServer
from test_socket_store import _read_to_eof as read_to_eof

from simdist import AuthenticationError, DistTimeoutError

SECRET = b"bounds secret"
HOST = "127.0.0.1"
HELLO = len(_auth.MAGIC) + 1 + 32  # the server's first message


def threads(name: str | None = None) -> int:
    """The threads alive (``threading.active_count()``), or those called ``name``."""
    return threading.active_count() if name is None else sum(t.name == name for t in threading.enumerate())


def settle(at_most: int, seconds: float = 30.0, name: str | None = None) -> int:
    """:func:`threads` once it is at most ``at_most``, or after ``seconds``. Threads of earlier
    tests may end meanwhile, so the count may be lower."""
    deadline = time.monotonic() + seconds
    while threads(name) > at_most and time.monotonic() < deadline:
        time.sleep(0.02)
    return threads(name)


def authenticated(port: int, secret: bytes = SECRET) -> socket.socket:
    sock = socket.create_connection((HOST, port), timeout=30)
    _auth.client_handshake(sock, secret, 30)
    return sock


def peer_port(net: PeerNetwork) -> int:
    return int(net.address.rpartition(":")[2])


def raw_peer(net: PeerNetwork, rank: int, world: int) -> socket.socket:
    """A connection to ``net`` that passed the handshake and said hello as ``rank`` of ``world``."""
    sock = authenticated(peer_port(net))
    sock.sendall(L.HELLO.pack(L.HELLO_MAGIC, rank, world))
    return sock


def idle(port: int, n: int) -> list[tuple[socket.socket, bytes]]:
    """``n`` connections that send nothing, with what each received within 10 s (a HELLO, or
    nothing when the server closed it at once)."""
    conns = [socket.create_connection((HOST, port), timeout=30) for _ in range(n)]
    out = []
    for sock in conns:
        sock.settimeout(10)
        got = b""
        try:
            while len(got) < HELLO:
                chunk = sock.recv(HELLO - len(got))
                if not chunk:
                    break
                got += chunk
        except (ConnectionResetError, TimeoutError):
            pass
        out.append((sock, got))
    return out


# ---------------------------------------------------------------------------------------
# before authentication


@pytest.mark.timeout(120)
def test_store_closes_connections_over_the_cap_at_once_and_threads_stay_bounded():
    """8 idle connections fill a cap of 8; 40 more are closed at once (EOF, no hello); the thread
    count grows by 8 and no more, and falls back once the idle ones leave."""
    with StoreServer(HOST, 0, SECRET, max_handshakes=8, handshake_timeout=60) as srv:
        base = threads()
        held = idle(srv.port, 8)
        assert [len(got) for _, got in held] == [HELLO] * 8
        assert threads(f"simdist-store:{srv.port}") == 8
        over = idle(srv.port, 40)
        assert [got for _, got in over] == [b""] * 40  # closed before a hello: no thread started for them
        assert threads(f"simdist-store:{srv.port}") == 8 and threads() <= base + 8
        with pytest.raises(ServerBusy, match="before its hello"):  # a real client retries, then gives up
            StoreClient(HOST, srv.port, SECRET, timeout=10, connect_timeout=1)
        leave = threading.Timer(0.5, lambda: [sock.close() for sock, _ in held + over])
        leave.start()
        with StoreClient(HOST, srv.port, SECRET, timeout=10, connect_timeout=60) as client:  # in once they leave
            client.set("k", b"v")
            assert client.get("k") == b"v"
        leave.join()
        assert settle(base) <= base


@pytest.mark.timeout(120)
def test_more_clients_at_once_than_the_cap_all_get_in(caplog):
    """40 clients connecting at once to a store whose cap is 4: those closed before the hello try
    again, and every one of them sets its key."""
    caplog.set_level(logging.INFO)
    with StoreServer(HOST, 0, SECRET, max_handshakes=4) as srv:
        errors: list[BaseException] = []

        def join(i: int) -> None:
            try:
                with StoreClient(HOST, srv.port, SECRET, timeout=30, connect_timeout=60) as client:
                    client.set(f"k{i}", b"v")
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        clients = [threading.Thread(target=join, args=(i,)) for i in range(40)]
        for t in clients:
            t.start()
        for t in clients:
            t.join()
        assert errors == []
        with StoreClient(HOST, srv.port, SECRET, timeout=10) as client:
            assert client.num_keys() == 40
    assert any("over the cap of 4" in r.getMessage() for r in caplog.records)  # some were refused, then got in


@pytest.mark.timeout(120)
def test_peer_listener_caps_handshakes_at_64(monkeypatch):
    """300 idle connections to a rank (the probe that once took it from 13 to 313 threads): 64
    get a hello, 236 are closed at once, and the rank runs 64 more threads at most."""
    monkeypatch.setattr(_accept, "HANDSHAKE_DEADLINE_S", 120.0)  # none expires during the test
    with PeerNetwork(0, 2, DictStore(), SECRET, timeout=30) as net:
        base = threads()
        conns = idle(peer_port(net), 300)
        hellos = sum(len(got) == HELLO for _, got in conns)
        assert (hellos, sum(got == b"" for _, got in conns)) == (_accept.MAX_HANDSHAKES, 300 - 64)
        assert threads() <= base + _accept.MAX_HANDSHAKES
        for sock, _ in conns:
            sock.close()
        assert settle(base) <= base


def _trickle(port: int, seconds: float) -> tuple[float, bytes]:
    """Read the hello, then send one byte every 0.2 s for up to ``seconds``; how long after
    connecting the server closed, and what it sent."""
    sock = socket.create_connection((HOST, port), timeout=30)
    t0 = time.monotonic()
    with sock:
        got = sock.recv(HELLO)
        answer = _auth.MAGIC + b"A" + bytes(64)
        for byte in answer:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break
            time.sleep(0.2)
            if time.monotonic() - t0 > seconds:
                break
        got += read_to_eof(sock, seconds)
        return time.monotonic() - t0, got


@pytest.mark.timeout(120)
def test_a_slow_handshake_is_cut_at_the_store_deadline():
    with StoreServer(HOST, 0, SECRET, handshake_timeout=1.0) as srv:
        elapsed, got = _trickle(srv.port, 30)
    assert got[:HELLO].startswith(_auth.MAGIC + b"H") and len(got) == HELLO  # no verdict: it was cut
    assert 1.0 <= elapsed < 10, elapsed


@pytest.mark.timeout(120)
def test_a_slow_handshake_is_cut_at_the_peer_deadline_not_the_op_timeout():
    """A client sending a byte every 0.2 s (it needs 15 s for its answer) is cut after
    HANDSHAKE_DEADLINE_S (5 s), although the network's timeout is 300 s."""
    with PeerNetwork(0, 2, DictStore(), SECRET, timeout=300) as net:
        elapsed, _ = _trickle(peer_port(net), 60)
    assert _accept.HANDSHAKE_DEADLINE_S <= elapsed < _accept.HANDSHAKE_DEADLINE_S + 10, elapsed


@pytest.mark.timeout(180)
def test_finished_connection_threads_are_removed():
    """200 connections one after the other (wrong secret, garbage, a real client): the thread
    count and the acceptors' tables are back where they were."""
    with StoreServer(HOST, 0, SECRET) as srv, PeerNetwork(0, 2, DictStore(), SECRET, timeout=30) as net:
        base = threads()
        ports = (srv.port, peer_port(net))
        for i in range(200):
            port = ports[i % 2]
            if i % 4 < 2:
                with pytest.raises(AuthenticationError):
                    authenticated(port, b"wrong secret")
            elif i % 4 == 2:
                with socket.create_connection((HOST, port), timeout=30) as sock:
                    sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
                    read_to_eof(sock)
            else:
                with authenticated(port) as sock:
                    sock.sendall(b"\x00" * 64)
                    read_to_eof(sock)
        assert settle(base) <= base
        assert srv._acceptor.counts() == (0, 0) and net._acceptor.counts() == (0, 0)
        assert len(net._threads) == 0  # no sender thread was ever started; none was kept for connections


def _refusal_counts(records: list[logging.LogRecord]) -> int:
    """How many refused connections the log lines account for."""
    total = 0
    for record in records:
        text = record.getMessage()
        more = re.search(r"refused (\d+) more connection", text)
        since = re.search(r"\((\d+) more refused since", text)
        total += int(more.group(1)) if more else 1 + (int(since.group(1)) if since else 0)
    return total


@pytest.mark.timeout(180)
@pytest.mark.parametrize("server", ["store", "peers"])
def test_failed_authentications_are_logged_at_a_bounded_rate(caplog, server):
    """40 wrong secrets: a warning line per REFUSAL_LOG_INTERVAL_S and one at close, whose counts
    add up to the 40 failures."""
    n = 40
    caplog.set_level(logging.INFO)
    t0 = time.monotonic()
    if server == "store":
        with StoreServer(HOST, 0, SECRET) as srv:
            for _ in range(n):
                with pytest.raises(AuthenticationError):
                    StoreClient(HOST, srv.port, b"wrong secret", timeout=10)
        name = "simdist.backends.socket._store"
    else:
        with PeerNetwork(0, 2, DictStore(), SECRET, timeout=30) as net:
            for _ in range(n):
                with pytest.raises(AuthenticationError):
                    authenticated(peer_port(net), b"wrong secret")
        name = "simdist.backends.socket._peers"
    elapsed = time.monotonic() - t0
    lines = [r for r in caplog.records if r.name == name and r.levelno == logging.WARNING]
    assert all("refused" in r.getMessage() for r in lines)
    assert 2 <= len(lines) <= 2 + elapsed / _accept.REFUSAL_LOG_INTERVAL_S, [r.getMessage() for r in lines]
    assert _refusal_counts(lines) == n, [r.getMessage() for r in lines]
    assert "wrong secret" in lines[0].getMessage()


# ---------------------------------------------------------------------------------------
# after authentication


@pytest.mark.timeout(120)
def test_a_large_announced_request_allocates_only_what_arrives():
    """A request announcing the largest frame (65 MiB), then 1 MiB and the end: the server's
    memory peak stays a few MiB (it once allocated the announced 65 MiB at once)."""
    with StoreServer(HOST, 0, SECRET) as srv:
        base = threads()
        sock = authenticated(srv.port)
        tracemalloc.start()
        try:
            sock.sendall((DEFAULT_MAX_VALUE_BYTES + HEADER_SLACK).to_bytes(4, "big") + bytes(1 << 20))
            sock.shutdown(socket.SHUT_WR)
            assert read_to_eof(sock) == b""  # closed: the frame ended early
            sock.close()
            assert settle(base) <= base  # the server thread has read all it will
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 8 << 20, peak


@pytest.mark.timeout(120)
def test_a_stalled_request_is_cut_at_its_frame_deadline():
    with StoreServer(HOST, 0, SECRET, frame_timeout=1.0) as srv:
        sock = authenticated(srv.port)
        t0 = time.monotonic()
        sock.sendall((100).to_bytes(4, "big") + b"x" * 10)  # 90 bytes never come
        assert read_to_eof(sock) == b""
        elapsed = time.monotonic() - t0
        sock.close()
    assert 1.0 <= elapsed < 10, elapsed


@pytest.mark.timeout(120)
def test_a_stalled_peer_frame_fails_at_its_deadline():
    """An authenticated peer that sends 10 of 100 announced bytes and stalls: the receive fails
    with DistTimeoutError after the network's timeout (1 s), not never."""
    with PeerNetwork(0, 2, DictStore(), SECRET, timeout=1.0) as net:
        h = net.irecv(np.zeros(100, dtype=np.uint8), 1, 0, 0)
        sock = raw_peer(net, 1, 2)
        t0 = time.monotonic()
        sock.sendall(F.encode_header(F.DATA, 0, 0, 100, 1) + bytes(10))
        with pytest.raises(DistTimeoutError, match="10 of 100 bytes"):
            net.wait([h], timeout=30)
        elapsed = time.monotonic() - t0
        sock.close()
    assert 1.0 <= elapsed < 10, elapsed


@pytest.mark.timeout(120)
@pytest.mark.parametrize("op", [Op.GET, Op.WAIT], ids=["GET", "WAIT"])
@pytest.mark.parametrize("unread", [b"", encode_request(Request(Op.NUM_KEYS))], ids=["", "with-a-request-unread"])
def test_a_wait_whose_client_left_frees_its_thread(op, unread):
    """A GET/WAIT of a missing key with a 1000 s timeout; the client closes (perhaps after
    sending another request): the server's thread ends within a second or two (it once stayed
    until the timeout)."""
    with SignallingServer(HOST, 0, SECRET) as srv:
        sock = authenticated(srv.port)
        sock.sendall(encode_request(Request(op, ("never",), number=1_000_000)))
        assert srv.waiting.wait(30)
        sock.sendall(unread)
        assert threads(f"simdist-store:{srv.port}") == 1
        t0 = time.monotonic()
        sock.close()
        assert settle(0, name=f"simdist-store:{srv.port}") == 0
        elapsed = time.monotonic() - t0
        with StoreClient(HOST, srv.port, SECRET, timeout=10) as client:  # the server serves on
            client.set("never", b"now")
    assert elapsed < 10, elapsed
