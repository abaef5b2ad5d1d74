"""Fuzzing the socket servers while a real job runs on them.

The job: three ranks (threads of this process, each with its own StoreClient and
PeerNetwork, as a socket rank has) doing ring all-reduce rounds and store set/get, every
result checked. Its peer networks are sized for more ranks than run: the ranks above 2
are played by the fuzzer. Hypothesis then sends random bytes, mutated and truncated
valid messages, before and after authentication, to the job's own store server and rank
0's peer listener: ``CASES`` examples in all, derandomized, so every run tries the same.

Each fuzz test asserts that fuzzing clients see only the protocol (a hello, a refusing
verdict, well-formed responses, then the end of the connection) or the project's errors,
that the servers close every fuzzed connection (none hangs), that the thread count
(``threading.active_count()``) never rises more than a few threads above the job's own,
that the process's peak RSS stays within a few MiB, and that the job is still right.
The last test stops the job and checks all of it.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import re
import socket
import sys
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from simdist.backends.socket import _auth
from simdist.backends.socket import _frames as F
from simdist.backends.socket import _links as L
from simdist.backends.socket import _store as S
from simdist.backends.socket import _store_wire as W
from simdist.backends.socket._accept import REFUSAL_LOG_INTERVAL_S
from simdist.backends.socket._peers import PeerNetwork
from simdist.backends.socket._store_wire import Kind, Op, Request, Response
from test_socket_bounds import settle
from test_socket_store import _read_to_eof as read_to_eof

from simdist import algorithms as alg
from simdist.core._errors import AuthenticationError, PeerLostError, ProtocolError
from simdist.core._reduce_op import ReduceOp

SECRET = b"fuzzing secret"
HOST = "127.0.0.1"
RANKS = 3  # the ranks that run the job
FUZZ_RANKS = 4096  # ranks the fuzzer plays, one per example that says hello
WORLD = RANKS + FUZZ_RANKS
CASES = {"store_before_auth": 700, "store_after_auth": 900, "peer_before_auth": 600, "peer_after_auth": 800}
THREAD_SLACK = 6  # threads above the job's own: a fuzzed connection's, one just ending, the sampler
RSS_SLACK = 48 << 20  # bytes of peak RSS above the start (a store frame announces up to 65 MiB)
EOF_WITHIN = 20.0  # seconds a server has to close a fuzzed connection: a bound for a hang, not a timing
HELLO = _auth.MAGIC + b"H"
REFUSAL = _auth.MAGIC + b"V" + bytes(33)  # a verdict that refuses the client
FUZZ = settings(deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads RSS from /proc/self/status")


def _status(field: str) -> int:
    """A size (bytes) from /proc/self/status, e.g. VmRSS or VmHWM."""
    with open("/proc/self/status") as f:
        return 1024 * int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.MULTILINE).group(1))


class Job:
    """The job under fuzzing; see the module's docstring."""

    N = 4096  # float64 elements all-reduced per round

    def __init__(self):
        self.server = S.StoreServer(HOST, 0, SECRET)
        self.stop = threading.Event()
        self.rounds = [0] * RANKS
        self.errors: list[str] = []
        self.nets: list[PeerNetwork | None] = [None] * RANKS
        self.ready = threading.Barrier(RANKS + 1)
        self.threads = [threading.Thread(target=self._rank, args=(r,), name=f"job-rank-{r}") for r in range(RANKS)]
        for t in self.threads:
            t.start()
        self.ready.wait(120)

    def _rank(self, r: int) -> None:
        try:
            with S.StoreClient(HOST, self.server.port, SECRET, timeout=120) as store:
                net = self.nets[r] = PeerNetwork(r, WORLD, store, SECRET, timeout=120)
                try:
                    self._rounds(r, store, net)
                finally:
                    net.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the last test
            self.errors.append(f"rank {r}: {type(exc).__name__}: {exc}")
            self.ready.abort()

    def _rounds(self, r: int, store: S.StoreClient, net: PeerNetwork) -> None:
        for i in itertools.count():
            if i == 2:
                self.ready.wait(120)  # every pair of the ring is connected
            if r == 0:  # rank 0 says whether there is a round i, through the store
                store.set(f"job/go/{i}", b"0" if self.stop.is_set() else b"1")
            if store.get(f"job/go/{i}") == b"0":
                return
            buf = np.arange(self.N, dtype=np.float64) * (r + 1) + i
            t = net.transport(range(RANKS), r, ctx=i)
            alg.run_blocking(alg.get("all_reduce", "ring")(t, buf, ReduceOp.SUM), t)
            expected = np.arange(self.N, dtype=np.float64) * 6 + RANKS * i
            if not np.array_equal(buf, expected):
                raise AssertionError(f"round {i}: wrong all-reduce result {buf[:4]}...")
            self.rounds[r] = i + 1
            time.sleep(0.005)

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(120)
        self.server.close()


class Watch:
    """Samples the thread count while fuzz cases run; records the peak RSS since it started."""

    def __init__(self):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        self.rss = _status("VmRSS")
        self.base = threading.active_count()
        self.peak = self.base
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self.done.wait(0.002):
            self.peak = max(self.peak, threading.active_count())

    def stop(self) -> tuple[int, int]:
        """``(most threads seen above the base, peak RSS above the start in bytes)``."""
        self.done.set()
        self.thread.join()
        return self.peak - self.base, _status("VmHWM") - self.rss


@pytest.fixture(scope="module")
def job():
    seen: list[str] = []
    hook = threading.excepthook
    threading.excepthook = lambda args: seen.append(f"{args.thread.name}: {args.exc_type.__name__}: {args.exc_value}")
    counter = _LogCounter()
    loggers = [logging.getLogger(name) for name in ("simdist.backends.socket._store", "simdist.backends.socket._peers")]
    for lg in loggers:
        lg.addHandler(counter)
    threads_before = threading.active_count()
    running = Job()
    running.threads_before = threads_before
    running.uncaught = seen
    running.log_lines = counter
    running.cases = {}
    running.started = time.monotonic()
    running.next_rank = itertools.count(RANKS)
    try:
        yield running
    finally:
        running.finish()
        for lg in loggers:
            lg.removeHandler(counter)
        threading.excepthook = hook


class _LogCounter(logging.Handler):
    """Counts the servers' log lines at WARNING and above."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def _run(job: Job, name: str, case) -> None:
    """Run the Hypothesis test ``case`` (it counts its examples in ``job.cases[name]``) under a
    Watch, then check the bounds and the job."""
    job.cases[name] = 0
    watch = Watch()
    try:
        case()
    finally:
        threads, rss = watch.stop()
    job.cases[f"{name} threads"], job.cases[f"{name} rss"] = threads, rss
    print(
        f"{name}: {job.cases[name]} cases; threads {watch.base} with the job, at most {watch.base + threads} "
        f"while fuzzing, {threading.active_count()} after; peak RSS +{rss >> 10} KiB"
    )
    assert job.cases[name] >= CASES[name]
    assert threads <= THREAD_SLACK, threads
    assert rss <= RSS_SLACK, rss
    assert not job.uncaught, job.uncaught
    assert not job.errors, job.errors


# ---------------------------------------------------------------------------------------
# bytes


def _edit(data: bytes, edits: list[tuple[str, int, int]]) -> bytes:
    out = bytearray(data)
    for kind, at, value in edits:
        i = at % (len(out) + 1)
        if kind == "flip" and out:
            out[i % len(out)] ^= value or 1
        elif kind == "insert":
            out[i:i] = bytes([value])
        elif kind == "delete":
            del out[i : i + 1 + value % 8]
        elif kind == "truncate":
            del out[i:]
    return bytes(out)


def mutated(base: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """``base`` with up to four edits: flipped, inserted or deleted bytes, or a truncation."""
    edit = st.tuples(
        st.sampled_from(["flip", "insert", "delete", "truncate"]), st.integers(0, 1 << 16), st.integers(0, 255)
    )
    return st.tuples(base, st.lists(edit, max_size=4)).map(lambda t: _edit(*t))


ANSWER = st.binary(min_size=64, max_size=64).map(lambda body: _auth.MAGIC + b"A" + body)  # a wrong MAC
NOISE = st.binary(max_size=300)


def _exchange(port: int, data: bytes, secret: bytes | None = None) -> bytes:
    """Connect (and authenticate when ``secret`` is given), send ``data``, close the sending
    side; everything the server sent until it closed the connection."""
    sock = socket.create_connection((HOST, port), timeout=EOF_WITHIN)
    with sock:
        if secret is not None:
            _auth.client_handshake(sock, secret, EOF_WITHIN)
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # the server may close at the first bad byte
            pass
        return read_to_eof(sock, EOF_WITHIN)  # a server that never closes fails the test here


def _check_refused_before_auth(reply: bytes) -> None:
    """A fuzzed handshake sees the server's hello, perhaps a refusing verdict, then the end."""
    assert reply[: len(HELLO)] == HELLO[: len(reply)] and len(reply) in (0, 41, 41 + len(REFUSAL)), reply
    assert reply[41:] in (b"", REFUSAL), reply


# ---------------------------------------------------------------------------------------
# the store


@pytest.mark.timeout(300)
def test_store_before_authentication(job):
    """Random bytes, mutated answers, and real clients holding wrong secrets."""

    @settings(FUZZ, max_examples=CASES["store_before_auth"])
    @given(data=st.one_of(NOISE, mutated(ANSWER), ANSWER), wrong=st.none() | st.binary(min_size=1, max_size=32))
    def case(data, wrong):
        job.cases["store_before_auth"] += 1
        if wrong is not None and wrong != SECRET:
            with pytest.raises(AuthenticationError, match="wrong secret"):
                S.StoreClient(HOST, job.server.port, wrong, timeout=EOF_WITHIN)
            return
        _check_refused_before_auth(_exchange(job.server.port, data))

    _run(job, "store_before_auth", case)


_KEYS = st.sampled_from(["a", "b", "c"])
_VALUES = st.binary(max_size=24) | st.sampled_from([b"7", b"-3", b"x" * 33])
_WAIT_MS = st.sampled_from([0, 10**9])  # answered at once, or waiting until the client leaves
REQUESTS = st.one_of(
    st.builds(lambda k, v: Request(Op.SET, (k,), (v,)), _KEYS, _VALUES),
    st.builds(lambda k, t: Request(Op.GET, (k,), number=t), _KEYS, _WAIT_MS),
    st.builds(lambda k, n: Request(Op.ADD, (k,), number=n), _KEYS, st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda k, e, d: Request(Op.COMPARE_SET, (k,), (e, d)), _KEYS, _VALUES, _VALUES),
    st.builds(lambda ks, t: Request(Op.WAIT, tuple(ks), number=t), st.lists(_KEYS, max_size=3), _WAIT_MS),
    st.builds(lambda ks: Request(Op.CHECK, tuple(ks)), st.lists(_KEYS, max_size=3)),
    st.builds(lambda k: Request(Op.DELETE, (k,)), _KEYS),
    st.just(Request(Op.NUM_KEYS)),
)
_BIG = st.integers(W.DEFAULT_MAX_VALUE_BYTES, W.DEFAULT_MAX_VALUE_BYTES + W.HEADER_SLACK + 2)


def _model(requests: list[Request]) -> list[Response | None]:
    """The answers a store holding none of the keys gives, in order, up to a wait that waits
    (its client leaves, so it ends unanswered); NUM_KEYS counts other clients' keys too (None)."""
    data: dict[str, bytes] = {}
    out: list[Response | None] = []
    for req in requests:
        k = req.keys[0] if req.keys else ""
        if req.op is Op.SET:
            data[k] = req.values[0]
            out.append(Response(Kind.NONE))
        elif req.op in (Op.GET, Op.WAIT):
            missing = tuple(key for key in req.keys if key not in data)
            if missing and req.number:
                break
            if missing:
                out.append(Response(Kind.TIMEOUT, keys=missing))
            else:
                out.append(Response(Kind.BYTES, values=(data[k],)) if req.op is Op.GET else Response(Kind.NONE))
        elif req.op is Op.ADD:
            current = data.get(k, b"0")
            total = int(current) + req.number if len(current) <= 32 and re.fullmatch(rb"[+-]?[0-9]+", current) else None
            if total is None or not -(2**63) <= total < 2**63:
                out.append(Response(Kind.ERROR))
            else:
                data[k] = str(total).encode()
                out.append(Response(Kind.INT, number=total))
        elif req.op is Op.COMPARE_SET:
            expected, desired = req.values
            if data.get(k, b"" if expected == b"" else None) == expected:
                data[k] = desired
            out.append(Response(Kind.BYTES, values=(data.get(k, expected),)))
        elif req.op is Op.CHECK:
            out.append(Response(Kind.INT, number=int(all(key in data for key in req.keys))))
        elif req.op is Op.DELETE:
            out.append(Response(Kind.INT, number=int(data.pop(k, None) is not None)))
        else:
            out.append(None)
    return out


def _responses(stream: bytes) -> list[Response]:
    """The response frames in ``stream``; a malformed or partial one fails the test."""
    out, pos = [], 0
    while pos < len(stream):
        end = pos + 4 + int.from_bytes(stream[pos : pos + 4], "big")
        out.append(W.parse_response(stream[pos:end]))  # ProtocolError: the server sent a bad frame
        pos = end
    return out


@pytest.mark.timeout(300)
def test_store_after_authentication(job):
    """Valid request sequences (answered exactly as a model store answers them), mutated and
    truncated ones, random bytes, and frames announcing up to the largest allowed size."""
    numbers = itertools.count()

    @settings(FUZZ, max_examples=CASES["store_after_auth"])
    @given(
        requests=st.lists(REQUESTS, min_size=1, max_size=4),
        how=st.sampled_from(["valid", "mutated", "noise", "big"]),
        noise=NOISE,
        edits=st.lists(
            st.tuples(
                st.sampled_from(["flip", "insert", "delete", "truncate"]), st.integers(0, 1 << 16), st.integers(0, 255)
            ),
            min_size=1,
            max_size=4,
        ),
        big=_BIG,
    )
    def case(requests, how, noise, edits, big):
        job.cases["store_after_auth"] += 1
        space = f"fuzz/{next(numbers)}/"  # every example starts from a store without its keys
        requests = [dataclasses.replace(r, keys=tuple(space + k for k in r.keys)) for r in requests]
        valid = b"".join(W.encode_request(r) for r in requests)
        data = {"valid": valid, "mutated": _edit(valid, edits), "noise": noise, "big": big.to_bytes(4, "big") + noise}[
            how
        ]
        answers = _responses(_exchange(job.server.port, data, SECRET))
        if how == "valid":
            expected = _model(requests)
            assert [a.kind for a in answers] == [e.kind if e else Kind.INT for e in expected]
            for got, want in zip(answers, expected):
                if want is not None and want.kind is not Kind.ERROR:
                    assert got == want, (got, want)

    _run(job, "store_after_auth", case)


# ---------------------------------------------------------------------------------------
# the peers


def _listener(job: Job) -> int:
    return int(job.nets[0].address.rpartition(":")[2])


def _hello(rank: int, world: int) -> bytes:
    return L.HELLO.pack(L.HELLO_MAGIC, rank, world)


def _claims_a_free_rank(stream: bytes) -> bool:
    """Whether ``stream`` starts with a hello rank 0 of the job might accept (a rank that is not
    rank 0 itself, nor rank 2, whose connection on the ring exists)."""
    if len(stream) < L.HELLO.size:
        return False
    magic, rank, world = L.HELLO.unpack(stream[: L.HELLO.size])
    return magic == L.HELLO_MAGIC and world == WORLD and rank not in (0, 2) and rank < world


@pytest.mark.timeout(300)
def test_peer_listener_before_authentication(job):
    """Random bytes and mutated answers, and authenticated clients whose hello is refused
    (a rank that is not in the job, this rank itself, a rank that is connected already)."""
    hellos = st.one_of(
        st.builds(_hello, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)),
        st.builds(_hello, st.sampled_from([0, 2]), st.just(WORLD)),  # itself; rank 2 sends on the ring already
        mutated(st.just(_hello(2, WORLD))),
    )
    refused = st.tuples(hellos, NOISE).map(b"".join).filter(lambda stream: not _claims_a_free_rank(stream))

    @settings(FUZZ, max_examples=CASES["peer_before_auth"])
    @given(data=st.one_of(NOISE, mutated(ANSWER), ANSWER), after_auth=st.none() | refused)
    def case(data, after_auth):
        job.cases["peer_before_auth"] += 1
        if after_auth is None:
            _check_refused_before_auth(_exchange(_listener(job), data))
        else:
            assert _exchange(_listener(job), after_auth, SECRET) == b""  # refused at the hello

    _run(job, "peer_before_auth", case)


@pytest.mark.timeout(300)
def test_peer_listener_after_authentication(job):
    """A fuzzer rank says hello, then sends valid, mutated or truncated frames, frames
    announcing huge payloads, or random bytes, and leaves. The receive rank 0 posted for it
    completes with the right bytes (when the first frame is intact) or fails with the
    project's ProtocolError or PeerLostError, never a timeout."""

    @settings(FUZZ, max_examples=CASES["peer_after_auth"])
    @given(data=st.data())
    def case(data):
        job.cases["peer_after_auth"] += 1
        rank = next(job.next_rank)
        assert rank < WORLD
        payload = data.draw(st.binary(min_size=8, max_size=8))
        first = F.encode_header(F.DATA, 1 << 60, 0, 8, rank) + payload
        ctx, tag = st.integers(0, 2**64 - 1), st.integers(0, 2**63 - 1)
        header = st.builds(F.encode_header, st.just(F.DATA), ctx, tag, st.integers(0, F.MAX_FRAME_BYTES), st.just(rank))
        header |= st.builds(F.encode_header, st.just(F.CLOSE), ctx, tag, st.just(0), st.just(rank))
        rest = st.one_of(NOISE, st.tuples(header, NOISE).map(b"".join))
        how = data.draw(st.sampled_from(["intact", "mutated", "noise"]))
        after = data.draw(st.lists(rest, max_size=3).map(b"".join))
        stream = {
            "intact": first + after,
            "mutated": data.draw(mutated(st.just(first + after))),
            "noise": data.draw(NOISE),
        }[how]
        buf = np.zeros(8, dtype=np.uint8)
        net = job.nets[0]
        h = net.irecv(buf, rank, 1 << 60, 0)
        try:
            _exchange(_listener(job), _hello(rank, WORLD) + stream, SECRET)
            net.wait([h], timeout=EOF_WITHIN)
        except (ProtocolError, PeerLostError):
            assert not stream.startswith(first)  # an intact first frame is received, whatever follows
            return
        if stream.startswith(first):
            assert buf.tobytes() == payload

    _run(job, "peer_after_auth", case)


# ---------------------------------------------------------------------------------------
# the job


@pytest.mark.timeout(300)
def test_the_job_under_fuzzing_completed_correctly(job):
    """Every round of the job was right, every fuzz test ran its cases, the servers logged a
    bounded number of warning lines, and once the job ends its threads are gone."""
    rounds_before = list(job.rounds)
    job.finish()
    elapsed = time.monotonic() - job.started
    print(
        f"job: {job.rounds} rounds per rank in {elapsed:.0f} s; cases {job.cases}; {job.log_lines.count} warning lines"
    )
    assert not job.errors, job.errors
    assert not job.uncaught, job.uncaught
    assert job.rounds[0] == job.rounds[1] == job.rounds[2] >= max(rounds_before) >= 3
    if set(CASES) <= set(job.cases):  # every fuzz test ran (not so under -k)
        assert sum(job.cases[name] for name in CASES) >= sum(CASES.values()) >= 3000, job.cases
    # each server: at most a line per level per REFUSAL_LOG_INTERVAL_S, and one per level at close
    assert job.log_lines.count <= 2 * 2 * (elapsed / REFUSAL_LOG_INTERVAL_S + 2), job.log_lines.count
    after = settle(job.threads_before)
    print(f"threads: {job.threads_before} before the job, {after} after it")
    assert after <= job.threads_before
