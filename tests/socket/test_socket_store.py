"""The socket backend's rendezvous store and its HMAC handshake, over real loopback sockets."""

from __future__ import annotations

import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from simdist.backends.socket import _auth
from simdist.backends.socket._store import REPLY_MARGIN_S, StoreClient, StoreServer, main
from simdist.backends.socket._store_wire import (
    DEFAULT_MAX_VALUE_BYTES,
    HEADER_SLACK,
    Kind,
    Op,
    Request,
    Response,
    encode_request,
    encode_response,
    parse_request,
    parse_response,
)

from simdist import AuthenticationError, DistError, DistTimeoutError, ProtocolError

SECRET = b"correct horse battery staple"
HOST = "127.0.0.1"


class SignallingServer(StoreServer):
    """The real :class:`StoreServer`, plus ``waiting``: an event set once a request starts
    waiting for a missing key, so a test acts on a wait it knows is pending on the server
    (instead of sleeping and assuming the request got there)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.waiting = threading.Event()

    def _wait_for(self, keys, timeout_ms, conn=None):
        keys = list(keys)
        if any(k not in self._data for k in keys):
            self.waiting.set()  # the caller holds the condition until it waits on it
        return super()._wait_for(keys, timeout_ms, conn)


@pytest.fixture
def server():
    with SignallingServer(HOST, 0, SECRET) as srv:
        yield srv


@pytest.fixture
def client(server):
    with StoreClient(HOST, server.port, SECRET, timeout=10) as c:
        yield c


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _authenticated(port: int) -> socket.socket:
    sock = socket.create_connection((HOST, port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    _auth.client_handshake(sock, SECRET, 30)
    return sock


def _read_to_eof(sock: socket.socket, timeout: float = 30.0) -> bytes:
    """Everything the peer sends until it closes (a reset counts as closing)."""
    sock.settimeout(timeout)
    got = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, ConnectionAbortedError):
            return got
        if not chunk:
            return got
        got += chunk


def _later(when: float | threading.Event, fn, *args) -> threading.Thread:
    """Call ``fn(*args)`` in a thread after ``when`` seconds, or once the event ``when`` is set."""

    def run():
        if isinstance(when, threading.Event):
            assert when.wait(60), "the event never came"
        else:
            time.sleep(when)
        fn(*args)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


# ---------------------------------------------------------------------------------------
# every method


@pytest.mark.timeout(10)
def test_set_get_overwrite_and_value_kinds(client):
    client.set("a", b"1")
    assert client.get("a") == b"1"
    client.set("a", b"22")
    assert client.get("a") == b"22"
    client.set("empty", b"")
    assert client.get("empty") == b""
    client.set("text", "héllo")  # str values are UTF-8 encoded, as torch does
    assert client.get("text") == "héllo".encode()
    big = bytes(range(256)) * 4096  # 1 MiB
    client.set("big", bytearray(big))
    assert client.get("big") == big
    client.set("ключ/ü", b"unicode key")
    assert client.get("ключ/ü") == b"unicode key"


@pytest.mark.timeout(90)
def test_get_waits_until_another_thread_sets_the_key(server, client):
    with StoreClient(HOST, server.port, SECRET, timeout=10) as other:
        setter = _later(server.waiting, other.set, "late", b"here")  # set only while the get waits
        assert client.get("late", timeout=60) == b"here"
        setter.join()  # its own answer may still be on the way


@pytest.mark.timeout(90)
def test_wait_returns_once_all_keys_exist(server, client):
    with StoreClient(HOST, server.port, SECRET, timeout=10) as other:

        def set_all():
            for i in range(3):
                time.sleep(0.1)
                other.set(f"k{i}", b"x")

        t = _later(server.waiting, set_all)
        client.wait(["k0", "k1", "k2"], timeout=60)
        assert client.check(["k0", "k1", "k2"])
        t.join()
    client.wait([])  # nothing to wait for


@pytest.mark.timeout(20)
@pytest.mark.parametrize("shared", [True, False], ids=["one-client", "client-per-thread"])
def test_concurrent_add_from_8_threads_gives_the_exact_total(server, client, shared):
    per_thread = 100
    results: list[int] = []
    lock = threading.Lock()

    def work(i):
        c = client if shared else StoreClient(HOST, server.port, SECRET, timeout=10)
        try:
            for _ in range(per_thread):
                value = c.add("counter", i + 1)
                with lock:
                    results.append(value)
        finally:
            if not shared:
                c.close()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = per_thread * sum(range(1, 9))
    assert client.add("counter", 0) == total
    assert client.get("counter") == str(total).encode()
    assert len(set(results)) == len(results) == 800  # every add saw a distinct total
    assert max(results) == total


@pytest.mark.timeout(10)
def test_add_counts_in_decimal_ascii(client):
    assert client.add("n", 5) == 5  # a missing counter starts at 0
    assert client.add("n", -7) == -2
    assert client.get("n") == b"-2"
    client.set("m", b"40")
    assert client.add("m", 2) == 42
    client.set("word", b"forty")
    with pytest.raises(ValueError, match="not a decimal integer"):
        client.add("word", 1)
    client.set("huge", str(2**63 - 1).encode())
    with pytest.raises(ValueError, match="i64"):
        client.add("huge", 1)
    assert client.get("huge") == str(2**63 - 1).encode()  # unchanged
    with pytest.raises(TypeError, match="amount"):
        client.add("n", 1.5)
    with pytest.raises(ValueError, match="amount"):
        client.add("n", 2**63)
    client.set("digits", b"7" * 5000)  # too long for an int: refused, never a crash
    with pytest.raises(ValueError, match="not a decimal integer"):
        client.add("digits", 1)
    assert client.add("n", 0) == -2  # the connection is still fine
    assert client.get("n", timeout=1e12) == b"-2"  # a timeout past time_t works too


@pytest.mark.timeout(10)
def test_compare_set_follows_torch(client):
    # missing key, expected b"": set it
    assert client.compare_set("c", b"", b"first") == b"first"
    assert client.get("c") == b"first"
    # holds expected: swap
    assert client.compare_set("c", b"first", b"second") == b"second"
    # holds something else: unchanged, the current value comes back
    assert client.compare_set("c", b"first", b"third") == b"second"
    assert client.get("c") == b"second"
    # existing key, expected b"" but it holds a value: unchanged
    assert client.compare_set("c", b"", b"x") == b"second"
    # missing key, non-empty expected: torch answers `expected` and sets nothing
    assert client.compare_set("absent", b"exp", b"des") == b"exp"
    assert not client.check(["absent"])


@pytest.mark.timeout(90)
def test_compare_set_wakes_a_waiter(server, client):
    with StoreClient(HOST, server.port, SECRET, timeout=10) as other:
        setter = _later(server.waiting, other.compare_set, "cas", b"", b"v")
        assert client.get("cas", timeout=60) == b"v"
        setter.join()


@pytest.mark.timeout(10)
def test_delete_check_num_keys(client):
    assert client.num_keys() == 0
    assert client.check([])
    client.set("a", b"1")
    client.set("b", b"2")
    assert client.num_keys() == 2
    assert client.check(["a", "b"]) and client.check(["a"])
    assert not client.check(["a", "zzz"])
    assert client.delete("a") is True
    assert client.delete("a") is False
    assert not client.check(["a"])
    assert client.num_keys() == 1
    client.add("n", 1)
    assert client.num_keys() == 2


@pytest.mark.timeout(10)
def test_bad_arguments_name_the_argument(client):
    with pytest.raises(TypeError, match="key must be a str"):
        client.set(1, b"x")
    with pytest.raises(TypeError, match="value must be bytes"):
        client.set("k", 5)
    with pytest.raises(TypeError, match="keys must be a list"):
        client.wait("abc")
    with pytest.raises(TypeError, match="every key in keys"):
        client.check(["a", 2])
    with pytest.raises(ValueError, match="timeout"):
        client.get("k", timeout=-1)
    with pytest.raises(ValueError, match="timeout"):
        client.get("k", timeout=float("nan"))
    with pytest.raises(ValueError, match="key"):
        client.set("\ud800", b"x")
    assert client.num_keys() == 0


@pytest.mark.timeout(10)
def test_values_over_the_limit_are_refused_before_sending():
    with StoreServer(HOST, 0, SECRET, max_value_bytes=1000) as srv:
        with StoreClient(HOST, srv.port, SECRET, timeout=5, max_value_bytes=1000) as c:
            c.set("ok", b"x" * 1000)
            with pytest.raises(ValueError, match="max_value_bytes"):
                c.set("big", b"x" * 1001)
            assert c.get("ok") == b"x" * 1000
        # a client with a larger limit gets its connection closed, and the server stays up
        with StoreClient(HOST, srv.port, SECRET, timeout=5) as loose:
            with pytest.raises(DistError, match="oversized request"):
                loose.set("big", b"x" * (1000 + HEADER_SLACK + 1))
            with pytest.raises(DistError, match="unusable after an earlier failure"):
                loose.num_keys()
        with StoreClient(HOST, srv.port, SECRET, timeout=5, max_value_bytes=1000) as c:
            assert c.num_keys() == 1


# ---------------------------------------------------------------------------------------
# timeouts


@pytest.mark.timeout(10)
def test_get_that_times_out_names_the_key_and_the_timeout(client):
    t0 = time.monotonic()
    # the server's answer (the client's own deadline, REPLY_MARGIN_S later, words it otherwise)
    with pytest.raises(DistTimeoutError, match=r"get\('never'\) timed out after 0.3 s.*'never'"):
        client.get("never", timeout=0.3)
    assert time.monotonic() - t0 > 0.25  # not before its timeout
    client.set("present", b"1")
    with pytest.raises(DistTimeoutError, match=r"\['gone'\] \(of \['present', 'gone'\]\)") as err:
        client.wait(["present", "gone"], timeout=0.2)
    assert isinstance(err.value, TimeoutError)
    assert client.get("present") == b"1"  # the server answered, so the connection is fine


@pytest.mark.timeout(90)
def test_default_timeout_is_the_clients(server):
    with StoreClient(HOST, server.port, SECRET, timeout=60) as c:  # the handshake may take a while here
        c.timeout = 0.2
        with pytest.raises(DistTimeoutError, match="0.2 s"):
            c.get("never")
        import datetime

        with pytest.raises(DistTimeoutError, match="0.1 s"):
            c.wait(["never"], timeout=datetime.timedelta(milliseconds=100))


@pytest.mark.timeout(90)
def test_closing_the_server_ends_a_pending_wait():
    srv = SignallingServer(HOST, 0, SECRET)
    c = StoreClient(HOST, srv.port, SECRET, timeout=60)
    errors: list[BaseException] = []

    def waiter():
        try:
            c.get("never")
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            errors.append(exc)

    t = threading.Thread(target=waiter)
    t.start()
    assert srv.waiting.wait(30)
    srv.close()
    t.join(30)
    assert not t.is_alive()  # ended by the close, long before the wait's 60 s
    assert isinstance(errors[0], DistError) and "closed the connection" in str(errors[0])
    c.close()
    with pytest.raises(DistError, match="closed"):
        c.num_keys()


@pytest.mark.timeout(90)
def test_closing_the_client_ends_its_own_pending_wait(server, client):
    errors: list[BaseException] = []

    def waiter():
        try:
            client.get("never", timeout=60)
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            errors.append(exc)

    t = threading.Thread(target=waiter)
    t.start()
    assert server.waiting.wait(30)
    client.close()
    t.join(30)
    assert not t.is_alive()  # ended by the close, long before the wait's 60 s
    assert isinstance(errors[0], DistError) and "was closed" in str(errors[0])


@pytest.mark.timeout(60)
def test_silent_server_during_the_handshake_times_out():
    with socket.create_server((HOST, 0)) as lst:
        accepted: list[socket.socket] = []
        t = threading.Thread(target=lambda: accepted.append(lst.accept()[0]), daemon=True)
        t.start()
        t0 = time.monotonic()
        with pytest.raises(DistTimeoutError, match="timed out after 0.5 s"):
            StoreClient(HOST, lst.getsockname()[1], SECRET, timeout=0.5)
        assert time.monotonic() - t0 < 20  # the handshake's 0.5 s timeout ended it, not a hang
        t.join(10)
        for conn in accepted:
            conn.close()


@pytest.mark.timeout(120)
def test_silent_server_after_the_handshake_times_out_every_kind_of_request():
    with socket.create_server((HOST, 0)) as lst:
        held: list[socket.socket] = []

        def serve_silently():
            for _ in range(2):
                conn = lst.accept()[0]
                _auth.server_handshake(conn, SECRET, 30)
                held.append(conn)  # reads nothing, answers nothing

        t = threading.Thread(target=serve_silently, daemon=True)
        t.start()
        port = lst.getsockname()[1]
        for call in (lambda c: c.set("k", b"v", timeout=0.3), lambda c: c.get("k", timeout=0.3)):
            c = StoreClient(HOST, port, SECRET, timeout=60)
            t0 = time.monotonic()
            with pytest.raises(DistTimeoutError, match="did not answer within 0.3 s"):
                call(c)
            assert time.monotonic() - t0 < 0.3 + REPLY_MARGIN_S + 15  # the request's timeout, not the client's 60 s
            with pytest.raises(DistError, match="unusable after an earlier failure"):
                c.num_keys()
            c.close()
        t.join(10)
        for conn in held:
            conn.close()


@pytest.mark.timeout(10)
def test_a_malformed_answer_is_a_protocol_error_and_retires_the_connection():
    with socket.create_server((HOST, 0)) as lst:

        def serve_garbage():
            conn = lst.accept()[0]
            _auth.server_handshake(conn, SECRET, 5)
            conn.recv(1024)
            conn.sendall(struct.pack(">I", 3) + b"\x09zz")  # unknown kind
            time.sleep(1)
            conn.close()

        t = threading.Thread(target=serve_garbage, daemon=True)
        t.start()
        with StoreClient(HOST, lst.getsockname()[1], SECRET, timeout=5) as c:
            with pytest.raises(ProtocolError, match="malformed answer: unknown response kind 9"):
                c.num_keys()
            with pytest.raises(DistError, match="unusable after an earlier failure"):
                c.num_keys()
        t.join(3)


# ---------------------------------------------------------------------------------------
# connecting


@pytest.mark.timeout(10)
def test_port_in_use_names_host_and_port(server):
    with pytest.raises(DistError, match=rf"127\.0\.0\.1:{server.port}"):
        StoreServer(HOST, server.port, SECRET)
    with socket.create_server((HOST, 0)) as plain:
        port = plain.getsockname()[1]
        with pytest.raises(DistError, match=rf"cannot listen on 127\.0\.0\.1:{port}.*in use"):
            StoreServer(HOST, port, SECRET)


@pytest.mark.timeout(90)
def test_client_retries_until_the_server_is_up():
    port = _free_port()
    started: list[StoreServer] = []
    t0 = time.monotonic()
    starter = _later(0.5, lambda: started.append(StoreServer(HOST, port, SECRET)))
    try:
        with StoreClient(HOST, port, SECRET, timeout=30, connect_timeout=60) as c:
            assert time.monotonic() - t0 >= 0.45  # connected to the server that came up 0.5 s later
            c.set("k", b"v")
            assert c.get("k") == b"v"
    finally:
        starter.join()
        for srv in started:
            srv.close()


@pytest.mark.timeout(120)
def test_no_server_gives_a_timeout_after_connect_timeout():
    port = _free_port()
    t0 = time.monotonic()
    with pytest.raises(DistTimeoutError, match=rf"could not connect to the store at 127\.0\.0\.1:{port} within 0.5 s"):
        StoreClient(HOST, port, SECRET, timeout=60, connect_timeout=0.5)
    assert 0.45 < time.monotonic() - t0 < 20  # retried for connect_timeout, not for timeout (60 s)


@pytest.mark.timeout(10)
def test_server_binds_loopback_by_default_and_reports_its_address():
    with StoreServer(secret=SECRET) as srv:
        assert srv.address == ("127.0.0.1", srv.port) and srv.port > 0
        assert srv._listener.getsockname()[0] == "127.0.0.1"


# ---------------------------------------------------------------------------------------
# authentication


@pytest.mark.timeout(10)
def test_wrong_secret_is_refused_and_the_server_keeps_serving(server, client):
    client.set("k", b"v")
    with pytest.raises(AuthenticationError, match="SIMDIST_SECRET") as err:
        StoreClient(HOST, server.port, b"wrong secret", timeout=5)
    assert "wrong secret" in str(err.value) and SECRET.decode() not in str(err.value)
    assert client.get("k") == b"v"
    with StoreClient(HOST, server.port, SECRET, timeout=5) as again:
        assert again.get("k") == b"v"


def _handshake_pair(server_secret, client_secret, client_side=None):
    """Run both handshakes over a socketpair; returns (server outcome, client outcome)."""
    a, b = socket.socketpair()
    outcome: dict[str, object] = {}

    def run_server():
        try:
            _auth.server_handshake(a, server_secret, 30)
            outcome["server"] = "ok"
        except Exception as exc:  # noqa: BLE001 - recorded for the assertion
            outcome["server"] = exc

    t = threading.Thread(target=run_server)
    t.start()
    try:
        if client_side is None:
            _auth.client_handshake(b, client_secret, 30)
        else:
            client_side(b)
        outcome["client"] = "ok"
    except Exception as exc:  # noqa: BLE001
        outcome["client"] = exc
    finally:
        b.close()
    t.join(40)
    a.close()
    return outcome["server"], outcome["client"]


@pytest.mark.timeout(90)
def test_handshake_succeeds_with_the_same_secret_and_fails_on_both_sides_otherwise():
    assert _handshake_pair(b"s3cret", b"s3cret") == ("ok", "ok")
    srv, cli = _handshake_pair(b"s3cret", b"other")
    for side in (srv, cli):
        assert isinstance(side, AuthenticationError), side
        assert "SIMDIST_SECRET" in str(side) and "s3cret" not in str(side) and "other" not in str(side)


@pytest.mark.timeout(10)
def test_handshake_rejects_an_impostor_server_on_both_sides():
    # a "server" that answers the challenge without the secret: the client refuses it
    def impostor_client(sock):
        _auth.client_handshake(sock, b"s3cret", 30)

    a, b = socket.socketpair()
    errors: list[BaseException] = []

    def impostor_server():
        a.sendall(_auth.MAGIC + b"H" + os.urandom(32))
        a.recv(73)
        a.sendall(_auth.MAGIC + b"V" + b"\x01" + os.urandom(32))
        errors.append(a.recv(10))

    t = threading.Thread(target=impostor_server)
    t.start()
    with pytest.raises(AuthenticationError, match="SIMDIST_SECRET"):
        impostor_client(b)
    t.join(30)
    assert errors == [_auth.MAGIC + b"K" + b"\x00"]  # the client told it so
    a.close()
    b.close()


@pytest.mark.timeout(120)
def test_handshake_rejects_other_protocols_at_once_and_times_out_on_silence():
    def http(sock):
        sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
        time.sleep(0.5)

    srv, _ = _handshake_pair(SECRET, None, http)
    # at once: had it waited for more bytes, the client's hanging up would be the error
    assert isinstance(srv, ProtocolError) and "does not speak the simdist protocol" in str(srv)

    srv, _ = _handshake_pair(SECRET, None, lambda sock: sock.recv(41))  # reads the hello, then hangs up
    assert isinstance(srv, ProtocolError) and "closed the connection" in str(srv)

    a, b = socket.socketpair()
    t0 = time.monotonic()
    with pytest.raises(DistTimeoutError, match="timed out after 0.3 s"):
        _auth.server_handshake(a, SECRET, 0.3)
    assert time.monotonic() - t0 < 20  # its 0.3 s timeout ended it, not a hang
    a.close()
    b.close()

    a, b = socket.socketpair()  # a client that reached, say, an SSH server
    a.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
    t0 = time.monotonic()
    with pytest.raises(ProtocolError, match="the server does not speak the simdist protocol"):
        _auth.client_handshake(b, SECRET, 60)
    assert time.monotonic() - t0 < 20  # on the first bytes, not at the 60 s timeout
    a.close()
    b.close()


@pytest.mark.timeout(10)
def test_secret_helpers(monkeypatch):
    monkeypatch.delenv(_auth.SECRET_ENV, raising=False)
    assert _auth.secret_from_env() is None
    monkeypatch.setenv(_auth.SECRET_ENV, "")
    assert _auth.secret_from_env() is None
    monkeypatch.setenv(_auth.SECRET_ENV, "pässword")
    assert _auth.secret_from_env() == "pässword".encode()
    s1, s2 = _auth.new_secret(), _auth.new_secret()
    assert re.fullmatch("[0-9a-f]{64}", s1) and s1 != s2
    with StoreServer(HOST, 0) as srv, StoreClient(HOST, srv.port, timeout=5) as c:  # both read the env
        c.set("k", b"v")
    monkeypatch.delenv(_auth.SECRET_ENV)
    with pytest.raises(ValueError, match="SIMDIST_SECRET"):
        StoreServer(HOST, 0)


@pytest.mark.timeout(90)
def test_http_client_is_rejected_and_the_server_stays_up(server, client):
    with socket.create_connection((HOST, server.port), timeout=30) as raw:
        raw.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        t0 = time.monotonic()
        reply = _read_to_eof(raw)
        assert time.monotonic() - t0 < 20  # closed on the first bytes, not at the 30 s handshake timeout
    assert reply == b"" or (reply.startswith(_auth.MAGIC + b"H") and len(reply) == 41)  # at most our hello
    with socket.create_connection((HOST, server.port), timeout=30) as raw:
        raw.sendall(os.urandom(64))
        _read_to_eof(raw)
    client.set("still", b"up")
    assert client.get("still") == b"up"


# ---------------------------------------------------------------------------------------
# standalone server


@pytest.mark.timeout(180)
def test_standalone_server_in_a_subprocess():
    env = dict(os.environ, SIMDIST_SECRET="standalone-secret")
    proc = subprocess.Popen(
        [sys.executable, "-m", "simdist.backends.socket._store", "--host", HOST, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        match = re.fullmatch(r"simdist store listening on 127\.0\.0\.1:(\d+)", line.strip())
        assert match, (line, proc.stderr.read() if proc.poll() is not None else "")
        with StoreClient(HOST, int(match.group(1)), b"standalone-secret", timeout=10) as c:
            c.set("k", b"v")
            assert c.get("k") == b"v" and c.add("n", 3) == 3
        proc.terminate()
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        proc.stdout.close()
        proc.stderr.close()


@pytest.mark.timeout(10)
def test_standalone_server_requires_the_secret(monkeypatch, capsys):
    monkeypatch.delenv("SIMDIST_SECRET", raising=False)
    with pytest.raises(SystemExit) as exc:
        main(["--port", "0"])
    assert exc.value.code == 2
    assert "SIMDIST_SECRET must be set" in capsys.readouterr().err


@pytest.mark.timeout(10)
def test_standalone_server_reports_a_port_in_use(monkeypatch, capsys, server):
    monkeypatch.setenv("SIMDIST_SECRET", "x")
    assert main(["--host", HOST, "--port", str(server.port)]) == 1
    assert f"127.0.0.1:{server.port}" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------
# the wire format


keys = st.text(max_size=12)
values = st.binary(max_size=40)
ints = st.integers(-(2**63), 2**63 - 1)
timeouts = st.integers(0, 2**63 - 1)
requests = st.one_of(
    st.builds(lambda k, v: Request(Op.SET, (k,), (v,)), keys, values),
    st.builds(lambda t, k: Request(Op.GET, (k,), number=t), timeouts, keys),
    st.builds(lambda k, a: Request(Op.ADD, (k,), number=a), keys, ints),
    st.builds(lambda k, e, d: Request(Op.COMPARE_SET, (k,), (e, d)), keys, values, values),
    st.builds(lambda t, ks: Request(Op.WAIT, tuple(ks), number=t), timeouts, st.lists(keys, max_size=4)),
    st.builds(lambda ks: Request(Op.CHECK, tuple(ks)), st.lists(keys, max_size=4)),
    st.builds(lambda k: Request(Op.DELETE, (k,)), keys),
    st.just(Request(Op.NUM_KEYS)),
)
responses = st.one_of(
    st.just(Response(Kind.NONE)),
    st.builds(lambda v: Response(Kind.BYTES, values=(v,)), values),
    st.builds(lambda n: Response(Kind.INT, number=n), ints),
    st.builds(lambda ks: Response(Kind.TIMEOUT, keys=tuple(ks)), st.lists(keys, max_size=4)),
    st.builds(lambda m: Response(Kind.ERROR, values=(m.encode(),)), st.text(max_size=30)),
)


def _parses_or_protocol_error(data: bytes):
    """Both parsers on ``data``: each returns its type or raises ProtocolError, nothing else."""
    outcomes = []
    for parse, kind in ((parse_request, Request), (parse_response, Response)):
        try:
            result = parse(data)
        except ProtocolError:
            outcomes.append(None)
        else:
            assert isinstance(result, kind)
            outcomes.append(result)
    return outcomes


@pytest.mark.timeout(10)
@settings(max_examples=300, deadline=None)
@given(requests, responses)
def test_frames_round_trip(req, resp):
    assert parse_request(encode_request(req)) == req
    assert parse_response(encode_response(resp)) == resp


@pytest.mark.timeout(30)
@settings(max_examples=2000, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=64), st.binary(min_size=4, max_size=64).map(lambda b: struct.pack(">I", len(b) - 4) + b[4:])
    )
)
def test_parsers_fuzz_random_bytes(data):
    # half of the inputs carry a consistent length prefix, so the fuzz reaches the fields
    _parses_or_protocol_error(data)


def _mutations(frames):
    @st.composite
    def mutate(draw):
        frame = bytearray(draw(frames))
        how = draw(st.sampled_from(["truncate", "flip", "flip-and-truncate", "append"]))
        if how in ("flip", "flip-and-truncate"):
            for _ in range(draw(st.integers(1, 3))):
                i = draw(st.integers(0, len(frame) - 1))
                frame[i] ^= 1 << draw(st.integers(0, 7))
        if how in ("truncate", "flip-and-truncate"):
            frame = frame[: draw(st.integers(0, len(frame) - 1))]
        if how == "append":
            frame += draw(st.binary(min_size=1, max_size=8))
        return how, bytes(frame)

    return mutate()


@pytest.mark.timeout(30)
@settings(max_examples=500, deadline=None)  # 1,000 mutated frames: a request and a response each
@given(_mutations(requests.map(encode_request)), _mutations(responses.map(encode_response)))
def test_parsers_fuzz_mutated_valid_frames(req_case, resp_case):
    for how, data in (req_case, resp_case):
        outcomes = _parses_or_protocol_error(data)
        if how in ("truncate", "append"):  # a strict prefix or an extension is never a valid frame
            assert outcomes == [None, None]


@pytest.mark.timeout(10)
def test_each_kind_of_malformation_is_a_protocol_error():
    def frame(payload):
        return struct.pack(">I", len(payload)) + payload

    u32, i64 = struct.Struct(">I").pack, struct.Struct(">q").pack
    cases = {
        "unknown op": frame(b"\x63"),
        "empty payload": frame(b""),
        "short prefix": b"\x00\x00",
        "prefix past the end": struct.pack(">I", 10) + b"\x08",
        "trailing bytes": frame(b"\x08") + b"\x00",
        "trailing field": frame(b"\x08" + u32(0)),
        "field length past the end": frame(b"\x07" + u32(100) + b"abc"),
        "field over the limit": frame(b"\x07" + u32(DEFAULT_MAX_VALUE_BYTES + 1)),
        "frame over the limit": u32(DEFAULT_MAX_VALUE_BYTES + HEADER_SLACK + 1) + b"\x08",
        "non-UTF-8 key": frame(b"\x07" + u32(2) + b"\xff\xfe"),
        "negative key count": frame(b"\x06" + i64(-1)),
        "key count past the end": frame(b"\x06" + i64(2**62)),
        "negative timeout": frame(b"\x02" + i64(-5) + u32(1) + b"k"),
        "missing int": frame(b"\x03" + u32(1) + b"k" + b"\x00\x00"),
    }
    for name, data in cases.items():
        with pytest.raises(ProtocolError):
            parse_request(data)
        with pytest.raises(ProtocolError):
            parse_response(data.replace(b"\x63", b"\x09", 1) if name == "unknown op" else data)
    with pytest.raises(ProtocolError, match="unknown response kind"):
        parse_response(frame(b"\x09"))
    with pytest.raises(ProtocolError, match="not valid UTF-8"):
        parse_response(frame(b"\x04" + u32(1) + b"\x80"))
    # the limit is the caller's
    with pytest.raises(ProtocolError, match="exceeds the limit of 3 bytes"):
        parse_request(encode_request(Request(Op.SET, ("k",), (b"abcd",))), max_value_bytes=3)


@pytest.mark.timeout(10)
def test_length_fields_never_cause_large_allocations():
    import tracemalloc

    u32 = struct.Struct(">I").pack
    frames = [
        u32(2**32 - 1) + b"\x01",  # frame length over the limit
        u32(DEFAULT_MAX_VALUE_BYTES) + b"\x01" + u32(2**32 - 1),  # field length over the limit, frame cut short
        u32(9) + b"\x01" + u32(DEFAULT_MAX_VALUE_BYTES) + b"abcd",  # field length past the end
        u32(9) + b"\x06" + struct.pack(">q", 2**62),  # key count past the end
    ]
    tracemalloc.start()
    try:
        for data in frames:
            with pytest.raises(ProtocolError):
                parse_request(data)
            with pytest.raises(ProtocolError):
                parse_response(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


@pytest.mark.timeout(90)
def test_server_refuses_an_oversized_frame_header_without_waiting_for_the_body():
    with StoreServer(HOST, 0, SECRET, max_value_bytes=1000) as srv, _authenticated(srv.port) as sock:
        sock.sendall(struct.pack(">I", 1000 + HEADER_SLACK + 1))  # and no body
        assert _read_to_eof(sock) == b""  # closed at once: waiting for the body would never end
        with StoreClient(HOST, srv.port, SECRET, timeout=5) as c:
            assert c.num_keys() == 0


@st.composite
def _live_garbage(draw):
    limit = DEFAULT_MAX_VALUE_BYTES + HEADER_SLACK
    kind = draw(st.sampled_from(["random", "random-payload", "mutated", "huge-length"]))
    if kind == "random":
        data = draw(st.binary(max_size=80))
    elif kind == "random-payload":
        payload = draw(st.binary(min_size=1, max_size=80))
        data = struct.pack(">I", len(payload)) + payload
    elif kind == "mutated":
        data = draw(_mutations(requests.map(encode_request)))[1]
    else:
        data = struct.pack(">I", draw(st.integers(limit + 1, 2**32 - 1))) + draw(st.binary(max_size=16))
    # the server reads the first frame off the stream; keep only inputs whose first frame is bad
    if len(data) >= 4:
        (n,) = struct.unpack(">I", data[:4])
        if n <= limit and len(data) >= 4 + n:
            try:
                parse_request(data[: 4 + n])
            except ProtocolError:
                pass
            else:
                assume(False)
    return data


@pytest.mark.timeout(180)
def test_live_server_closes_connections_that_send_garbage_and_keeps_serving():
    limit = DEFAULT_MAX_VALUE_BYTES + HEADER_SLACK
    with StoreServer(HOST, 0, SECRET) as srv, StoreClient(HOST, srv.port, SECRET, timeout=10) as good:
        good.set("alive", b"yes")
        sent = []

        @settings(
            max_examples=200, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow]
        )
        @given(_live_garbage())
        def check(data):
            with _authenticated(srv.port) as sock:
                complete = len(data) >= 4 and (
                    struct.unpack(">I", data[:4])[0] > limit or len(data) >= 4 + struct.unpack(">I", data[:4])[0]
                )
                try:
                    sock.sendall(data)
                    if not complete:  # the server needs EOF to see the frame is cut short
                        sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass  # already closed by the server
                assert _read_to_eof(sock) == b""  # closed without an answer
            sent.append(data)
            assert good.get("alive") == b"yes"

        check()
        assert len(sent) >= 200
        with StoreClient(HOST, srv.port, SECRET, timeout=5) as fresh:
            assert fresh.get("alive") == b"yes"


def test_a_heartbeat_that_has_not_run_is_not_taken_for_the_stores_silence() -> None:
    """A rank whose process was stopped or starved of CPU finds its heartbeat's latest read old: it reads the
    store itself and learns of a failure there, where it used to report the store unreachable."""
    from simdist.backends.socket._failures import _FAILED, _FIRST, POLL_S, Heartbeat, JobStore

    with StoreServer(HOST, 0, SECRET) as srv, JobStore(HOST, srv.port, SECRET, rank=0, world_size=2) as store:
        beat = store.heartbeat = Heartbeat(HOST, srv.port, SECRET, 0, 2)
        try:
            beat._stopped.set()  # its thread ends: it stands for a heartbeat thread that is not scheduled
            beat._thread.join(10)
            beat._stopped.clear()  # still running to the rank
            assert store.failures([1]) == {}
            store.set(_FAILED.format(rank=1), b'{"error": "ValueError: boom", "how": "exception"}')
            store.set(_FIRST, b'{"rank": 1, "error": "ValueError: boom", "how": "exception"}')
            beat.answered_at -= 10 * POLL_S
            assert beat.check() is None
            assert list(store.failures([1])) == [1]
            beat.store_error = DistError("the store did not answer within 2 s")
            with pytest.raises(DistError, match="is unreachable"):
                store.failures([1])
        finally:
            beat.stop()
