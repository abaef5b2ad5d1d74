"""The socket backend's PeerNetwork between real processes on 127.0.0.1.

Most tests share one job of four worker processes (spawned once per module): each
worker holds a ``PeerNetwork`` and runs the module-level task functions the test sends
it, returning results or a description of the exception. The store is the real
``StoreServer`` served by the test process. Smaller tests run networks in threads of
this process, where only one process is needed (an attacker on a raw socket, closing).
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import signal
import socket
import threading
import time
import traceback

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from simdist.backends.socket._peers import PeerNetwork
from simdist.backends.socket._store import StoreServer

from simdist.core import _arrays as A
from simdist import algorithms as alg
from simdist.core._errors import AuthenticationError, DistError, DistTimeoutError, PeerLostError, ProtocolError
from simdist.core._reduce_op import ReduceOp

SPAWN = mp.get_context("spawn")
SECRET = b"peers-test-secret"
R = ReduceOp
JOB_TIMEOUT = 60.0  # seconds a worker's network waits by default: what a test checks happens long before
LINGER = 60.0  # seconds a worker's close() may wait for a peer to take its goodbye: far from the 20 s it is given
# a test that finds the job broken first spawns another (four processes importing torch: about a
# minute on a busy machine), within its own time limit
ON_JOB = pytest.mark.timeout(300)


# -- worker processes -----------------------------------------------------------------


def _describe(exc: BaseException) -> dict:
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "rank": getattr(exc, "rank", None),
        "traceback": traceback.format_exc(),
    }


def _worker(rank: int, size: int, port: int, secret: bytes, timeout: float, conn) -> None:
    from simdist.backends.socket import _links
    from simdist.backends.socket._store import StoreClient

    _links.LINGER = LINGER  # a close() that waited for its linger would take a minute, not a moment
    store = StoreClient("127.0.0.1", port, SECRET, timeout=timeout)
    net = PeerNetwork(rank, size, store, secret, timeout=timeout)
    conn.send(("ok", os.getpid()))
    while True:
        task = conn.recv()
        if task is None:
            break
        fn, args = task
        try:
            conn.send(("ok", fn(net, *args)))
        except BaseException as exc:  # noqa: BLE001 - the test process judges it
            conn.send(("err", _describe(exc)))
    start = time.monotonic()
    net.close()
    conn.send(("closed", time.monotonic() - start))
    store.close()


def _signal(port: int, key: str) -> None:
    """Tell the test process, through the job's store, that this worker got to ``key``."""
    from simdist.backends.socket._store import StoreClient

    with StoreClient("127.0.0.1", port, SECRET, timeout=JOB_TIMEOUT) as store:
        store.set(key, b"")


class Job:
    """``size`` worker processes with a PeerNetwork each, and the store they meet at."""

    def __init__(self, size: int, *, timeout: float = JOB_TIMEOUT, secrets: dict | None = None):
        self.size = size
        self.timeout = timeout
        self.broken = False  # a test killed a worker
        self.closed = False
        self.server = StoreServer("127.0.0.1", 0, SECRET)
        self.conns, self.procs = [], []
        for r in range(size):
            mine, theirs = SPAWN.Pipe()
            secret = (secrets or {}).get(r, SECRET)
            p = SPAWN.Process(target=_worker, args=(r, size, self.server.port, secret, timeout, theirs), daemon=True)
            p.start()
            theirs.close()
            self.conns.append(mine)
            self.procs.append(p)
        self.pids = [self.reply(r, 120)[1] for r in range(size)]

    def reply(self, r: int, timeout: float) -> tuple:
        if not self.conns[r].poll(timeout):
            raise AssertionError(f"rank {r} did not answer within {timeout} s")
        return self.conns[r].recv()

    def reached(self, keys: list[str]) -> None:
        """Wait until the workers signalled every one of ``keys`` (see ``_signal``)."""
        from simdist.backends.socket._store import StoreClient

        with StoreClient("127.0.0.1", self.server.port, SECRET, timeout=120) as store:
            store.wait(keys)

    def start(self, fn, *args, ranks=None) -> list[int]:
        ranks = range(self.size) if ranks is None else ranks
        for r in ranks:
            self.conns[r].send((fn, args))
        return list(ranks)

    def results(self, ranks, timeout: float = 60) -> list:
        """Each rank's ``("ok", value)`` or ``("err", description)``."""
        return [self.reply(r, timeout) for r in ranks]

    def run(self, fn, *args, ranks=None, timeout: float = 60) -> list:
        """Run ``fn(net, *args)`` on every rank (or ``ranks``); their return values, or raise."""
        out = self.results(self.start(fn, *args, ranks=ranks), timeout)
        errors = [f"rank {r}: {v['traceback']}" for r, (s, v) in zip(ranks or range(self.size), out) if s != "ok"]
        assert not errors, "\n".join(errors)
        return [v for _, v in out]

    def close(self) -> list:
        """Close every live worker's network; the seconds each close took (once)."""
        if self.closed:
            return []
        self.closed = True
        took = []
        for r, p in enumerate(self.procs):
            if p.is_alive():
                try:
                    self.conns[r].send(None)
                    took.append(self.reply(r, LINGER + 30)[1])
                except (OSError, EOFError, AssertionError):
                    pass
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
        self.server.close()
        return took


class _Jobs:
    """The module's job of four workers, spawned again only after a test broke it."""

    def __init__(self):
        self.current: Job | None = None

    def get(self) -> Job:
        if self.current is not None and self.current.broken:
            self.current.close()
            self.current = None
        if self.current is None:
            self.current = Job(4)
        return self.current


@pytest.fixture(scope="module")
def jobs():
    holder = _Jobs()
    yield holder
    if holder.current is not None:
        took = holder.current.close()
        assert all(t < 20 for t in took), took  # no close waited for its linger (60 s)


@pytest.fixture
def job(jobs) -> Job:
    return jobs.get()


# -- point to point -------------------------------------------------------------------


def _p2p_kinds(net):
    """Rank 0 sends a torch float32, a numpy int16, a torch bool and a bfloat16 tensor."""
    if net.rank == 0:
        hs = [
            net.isend(torch.arange(10, dtype=torch.float32), 1, 1, 0),
            net.isend(np.arange(-5, 5, dtype=np.int16), 2, 1, 0),
            net.isend(torch.tensor([True, False, True]), 3, 1, 0),
            net.isend(torch.tensor([1.5, -2.0], dtype=torch.bfloat16), 3, 1, 1),
        ]
        net.wait(hs)
        return None
    if net.rank == 1:
        buf = torch.zeros(10, dtype=torch.float32)
        net.wait([net.irecv(buf, 0, 1, 0)])
        return buf.tolist()
    if net.rank == 2:
        buf = np.zeros(10, dtype=np.int16)
        net.wait([net.irecv(buf, 0, 1, 0)])
        return buf.tolist()
    flags, halves = torch.zeros(3, dtype=torch.bool), torch.zeros(2, dtype=torch.bfloat16)
    net.wait([net.irecv(halves, 0, 1, 1), net.irecv(flags, 0, 1, 0)])
    return flags.tolist(), halves.float().tolist()


@ON_JOB
def test_send_recv_torch_and_numpy(job) -> None:
    out = job.run(_p2p_kinds)
    assert out[1] == list(range(10))
    assert out[2] == list(range(-5, 5))
    assert out[3] == ([True, False, True], [1.5, -2.0])


def _fifo_and_tags(net):
    """Rank 1 interleaves 20 messages on each of two tags and two contexts to rank 0."""
    n = 20
    if net.rank == 1:
        hs = []
        for i in range(n):
            hs.append(net.isend(np.full(3, i, dtype=np.int64), 0, 2, 5))
            hs.append(net.isend(np.full(3, 100 + i, dtype=np.int64), 0, 2, 6))
            hs.append(net.isend(np.full(3, 200 + i, dtype=np.int64), 0, 3, 5))
        net.wait(hs)
        return None
    if net.rank != 0:
        return None
    bufs = {key: [np.zeros(3, dtype=np.int64) for _ in range(n)] for key in [(2, 6), (3, 5), (2, 5)]}
    hs = []
    for i in range(n):  # tag 6 first, then the other context, then tag 5: each keeps its own order
        for (ctx, tag), b in bufs.items():
            hs.append(net.irecv(b[i], 1, ctx, tag))
        if i == n // 2:
            time.sleep(0.05)  # let the rest arrive before being posted
    net.wait(hs)
    return {f"{ctx}/{tag}": [int(b[0]) for b in bs] for (ctx, tag), bs in bufs.items()}


@ON_JOB
def test_fifo_per_peer_ctx_and_tag(job) -> None:
    got = job.run(_fifo_and_tags)[0]
    assert got == {"2/5": list(range(20)), "2/6": [100 + i for i in range(20)], "3/5": [200 + i for i in range(20)]}


def _pattern(i: int, n: int) -> np.ndarray:
    return ((np.arange(n, dtype=np.int64) * 7 + i) % 251).astype(np.uint8)


def _mixed_sizes(net, seed: int):
    """Rank 0 posts 160 sends of mixed sizes to rank 1 on one ctx and tag, waiting now and
    then: sends of up to 1 MiB to an idle peer are written inline, larger ones (and what
    follows them while they are pending) are queued. Rank 1 posts receives of the expected
    sizes in order, some after their messages arrived."""
    rng = np.random.default_rng(seed)
    kinds = rng.choice(5, size=160, p=[0.3, 0.3, 0.2, 0.12, 0.08])
    lows, highs = [0, 100, 60 << 10, 1 << 20, 2 << 20], [100, 8 << 10, 70 << 10, (1 << 20) + 1, 3 << 20]
    sizes = [int(rng.integers(lows[k], highs[k])) for k in kinds]
    if net.rank == 0:
        hs, done_at_return, pending_at_return = [], 0, 0
        for i, n in enumerate(sizes):
            h = net.isend(_pattern(i, n), 1, 40, 0)
            done_at_return += h.done
            pending_at_return += not h.done
            hs.append(h)
            if rng.random() < 0.2:
                net.wait(hs)
                hs = []
        net.wait(hs)
        return done_at_return, pending_at_return
    if net.rank != 1:
        return None
    bufs = [np.empty(n, dtype=np.uint8) for n in sizes]
    hs = []
    for i, b in enumerate(bufs):
        hs.append(net.irecv(b, 0, 40, 0))
        if i % 40 == 20:
            time.sleep(0.05)  # let later messages arrive before their receives are posted
    net.wait(hs)
    return [i for i, b in enumerate(bufs) if not np.array_equal(b, _pattern(i, len(b)))]


@ON_JOB
def test_inline_and_queued_sends_keep_posting_order(job) -> None:
    """Sends written inline by the caller never overtake queued ones: all 160 arrive in posting
    order (a swap would be a size mismatch) with the right bytes."""
    (inline, queued), wrong = job.run(_mixed_sizes, 5, ranks=[0, 1])
    assert wrong == []
    assert inline > 40 and queued > 5, (inline, queued)


def _unexpected_first(net):
    """Rank 2 sends data (1 MiB and 0 bytes) then a signal; rank 3 posts the data receive after
    the signal arrived, so the data is already there (an unexpected message)."""
    data = torch.arange(1 << 18, dtype=torch.float32)
    if net.rank == 2:
        net.wait([net.isend(data, 3, 4, 1), net.isend(np.zeros(0), 3, 4, 3), net.isend(np.ones(1), 3, 4, 2)])
        return None
    if net.rank != 3:
        return None
    net.wait([net.irecv(np.zeros(1), 2, 4, 2)])
    buf = torch.zeros_like(data)
    h = net.irecv(buf, 2, 4, 1)
    done_at_post = h.done
    empty = net.irecv(torch.zeros(0), 2, 4, 3)
    net.wait([h, empty])
    return done_at_post, empty.done, bool(torch.equal(buf, data))


@ON_JOB
def test_unexpected_message_is_copied_when_posted(job) -> None:
    assert job.run(_unexpected_first)[3] == (True, True, True)


def _zero_bytes(net):
    if net.rank in (0, 1):
        other = 1 - net.rank
        hs = [net.isend(torch.zeros(0), other, 5, 0), net.isend(np.zeros(0, dtype=np.int8), other, 5, 1)]
        rs = [net.irecv(torch.zeros(0), other, 5, 0), net.irecv(np.zeros(0, dtype=np.int8), other, 5, 1)]
        net.wait(hs + rs)
        return [h.done and h.error is None for h in hs + rs]
    return None


@ON_JOB
def test_zero_byte_messages(job) -> None:
    out = job.run(_zero_bytes)
    assert out[0] == out[1] == [True] * 4


def _any_source(net):
    if net.rank != 0:
        net.wait([net.isend(np.full(2, net.rank, dtype=np.int32), 0, 6, 0)])
        return None
    bufs = [np.zeros(2, dtype=np.int32) for _ in range(3)]
    hs = [net.irecv(b, None, 6, 0) for b in bufs]
    net.wait(hs)
    return sorted((h.source, int(b[0])) for h, b in zip(hs, bufs))


@ON_JOB
def test_receive_from_any_source(job) -> None:
    assert job.run(_any_source)[0] == [(1, 1), (2, 2), (3, 3)]


def _size_mismatch(net):
    """Rank 1 sends 8 bytes where rank 0 posted 16, posted first and then unexpected; the
    next message on the connection still arrives intact."""
    if net.rank == 1:
        net.wait([net.irecv(np.zeros(1), 0, 7, 9)])  # rank 0 has posted
        net.wait([net.isend(np.ones(2, dtype=np.float32), 0, 7, 0), net.isend(np.arange(4.0), 0, 7, 1)])
        net.wait([net.isend(np.ones(2, dtype=np.float32), 0, 8, 0), net.isend(np.ones(1), 0, 8, 9)])
        return None
    if net.rank != 0:
        return None
    errors = []
    h = net.irecv(np.zeros(2), 1, 7, 0)
    net.wait([net.isend(np.zeros(1), 1, 7, 9)])
    for handle in (h, None):
        if handle is None:
            net.wait([net.irecv(np.zeros(1), 1, 8, 9)])  # the 8 bytes have arrived: unexpected
            handle = net.irecv(np.zeros(2), 1, 8, 0)
        try:
            net.wait([handle])
        except ProtocolError as exc:
            errors.append(str(exc))
    after = np.zeros(4)
    net.wait([net.irecv(after, 1, 7, 1)])
    return errors, after.tolist()


@ON_JOB
def test_size_mismatch_is_a_protocol_error_at_wait(job) -> None:
    errors, after = job.run(_size_mismatch)[0]
    assert len(errors) == 2
    for ctx, msg in zip((7, 8), errors):
        for words in ("8 bytes", "16 bytes", "rank 1", f"ctx {ctx}", "tag 0"):
            assert words in msg, (words, msg)
    assert after == [0.0, 1.0, 2.0, 3.0]


def _timeout(net):
    if net.rank != 0:
        return None
    sent = net.isend(np.zeros(0), 3, 11, 4)
    net.wait([sent])  # connected and written (however long that takes here), before the timed wait
    start = time.monotonic()
    try:
        net.wait([net.irecv(np.zeros(3), 2, 11, 3), sent], timeout=0.3)
    except DistTimeoutError as exc:
        return str(exc), time.monotonic() - start
    return None


@ON_JOB
def test_timeout_names_what_is_pending(job) -> None:
    msg, took = job.run(_timeout)[0]
    assert 0.25 < took < 20  # the wait's 0.3 s, not the network's 60 s
    assert "recv from rank 2 (ctx 11, tag 3, 24 bytes" in msg
    assert "send to rank 3" not in msg  # that one completed


def _big(net, nbytes, reps):
    """Rank 0 sends ``nbytes`` to rank 1 ``reps`` times (then both ways at once); rank 1 times
    each transfer from its 'ready' message to the end of the receive."""
    n = nbytes // 8
    if net.rank == 0:
        data = torch.arange(n, dtype=torch.int64)
        for i in range(reps):
            net.wait([net.irecv(np.zeros(1), 1, 12, 1000 + i)])
            net.wait([net.isend(data, 1, 12, i)])
        back = torch.zeros(n, dtype=torch.int64)
        net.wait([net.isend(data, 1, 13, 0), net.irecv(back, 1, 13, 0)])
        return bool(torch.equal(back, data.flip(0)))
    if net.rank != 1:
        return None
    expect = np.arange(n, dtype=np.int64)
    buf = np.zeros(n, dtype=np.int64)
    times, intact = [], []
    for i in range(reps):
        buf[:] = 0
        h = net.irecv(buf, 0, 12, i)
        start = time.perf_counter()
        net.wait([net.isend(np.zeros(1), 0, 12, 1000 + i), h])
        times.append(time.perf_counter() - start)
        intact.append(bool(np.array_equal(buf, expect)))
    mine = np.ascontiguousarray(expect[::-1])
    net.wait([net.isend(mine, 0, 13, 0), net.irecv(buf, 0, 13, 0)])
    intact.append(bool(np.array_equal(buf, expect)))
    return times, intact


@ON_JOB
def test_large_message_arrives_intact(job, record_property) -> None:
    nbytes = 64 << 20
    out = job.run(_big, nbytes, 3, ranks=[0, 1])
    times, intact = out[1]
    assert out[0] is True and all(intact)
    gbps = nbytes / min(times) / 1e9
    record_property("loopback_64MiB_GBps", round(gbps, 2))
    print(f"\n64 MiB rank 0 -> rank 1: best {min(times) * 1e3:.1f} ms = {gbps:.2f} GB/s")


# -- every collective algorithm over real processes -------------------------------------

PAIRS = [(op, name) for op, table in alg.ALGORITHMS.items() for name in table]
GROUPS = [(1, 3), (2, 0, 3), (0, 1, 2, 3)]


def _case_data(index: int, op: str, n: int, size: int, grank: int, dtype: str):
    """Deterministic inputs of one case on one group rank (numpy, canonical values)."""
    rng = np.random.default_rng([index, grank])
    return rng.integers(-50, 50, n * size if op in ("reduce_scatter", "all_to_all") else n).astype(dtype)


def _counts(index: int, n: int, size: int, even: bool) -> list[int]:
    if even:
        return [n] * size
    rng = np.random.default_rng([index, 999])
    cuts = np.sort(rng.integers(0, n * size + 1, size - 1))
    return [int(c) for c in np.diff(np.concatenate([[0], cuts, [n * size]]))]


def _matrix(index: int, n: int, size: int, even: bool) -> np.ndarray:
    return np.array([_counts(index * 31 + i, n, size, even) for i in range(size)]).reshape(size, size)


def _cases(size: int) -> list[tuple]:
    cases = []
    for op, name in PAIRS:
        for j, n in enumerate((1, 37, 1000)):
            i = len(cases)
            kind = "torch" if i % 2 else "numpy"
            dtype = ["int64", "float32", "int32"][i % 3]
            even = name == "bruck" or j != 1
            cases.append((i, op, name, n, kind, dtype, (i // 3) % size, even))
    return cases


def _collectives(net, group: tuple, gindex: int):
    """Run every case on this rank (if it is in ``group``); return the output arrays."""
    if net.rank not in group:
        return None
    size, grank = len(group), group.index(net.rank)
    out = []
    for i, op, name, n, kind, dtype, root, even in _cases(size):

        def arr(x, kind=kind):
            return torch.from_numpy(np.ascontiguousarray(x)) if kind == "torch" else np.ascontiguousarray(x)

        t = net.transport(group, grank, (gindex + 1) << 20 | i)
        fn = alg.get(op, name)
        mine = _case_data(i, op, n, size, grank, dtype)
        if op in ("all_reduce", "broadcast", "reduce"):
            buf = arr(mine)
            extra = {"all_reduce": (R.SUM,), "broadcast": (root,), "reduce": (R.SUM, root)}[op]
            alg.run_blocking(fn(t, buf, *extra), t)
            res = buf
        elif op == "all_gather":
            res = arr(np.zeros(n * size, dtype=dtype))
            alg.run_blocking(fn(t, arr(mine), res), t)
        elif op == "reduce_scatter":
            counts = _counts(i, n, size, even)
            res = arr(np.zeros(counts[grank], dtype=dtype))
            alg.run_blocking(fn(t, arr(mine), res, counts, R.MAX if i % 2 else R.SUM), t)
        elif op == "all_to_all":
            m = _matrix(i, n, size, even)
            inp = arr(mine[: int(m[grank].sum())])
            res = arr(np.zeros(int(m[:, grank].sum()), dtype=dtype))
            alg.run_blocking(fn(t, inp, res, list(m[grank]), list(m[:, grank])), t)
        elif op == "gather":
            res = arr(np.zeros(n * size, dtype=dtype)) if grank == root else None
            alg.run_blocking(fn(t, arr(mine), res, root), t)
        elif op == "scatter":
            src = _case_data(i, op, n * size, 1, 0, dtype) if grank == root else None
            res = arr(np.zeros(n, dtype=dtype))
            alg.run_blocking(fn(t, None if src is None else arr(src), res, root), t)
        else:  # barrier
            alg.run_blocking(fn(t, arr(np.zeros(1, dtype=dtype))), t)
            res = None
        out.append(None if res is None else A.to_numpy(res))
    return out


def _expected(case: tuple, size: int, grank: int):
    i, op, _name, n, _kind, dtype, root, even = case
    data = [_case_data(i, op, n, size, g, dtype) for g in range(size)]
    if op == "all_reduce":
        return np.sum(data, axis=0, dtype=dtype)
    if op == "broadcast":
        return data[root]
    if op == "reduce":
        return np.sum(data, axis=0, dtype=dtype) if grank == root else data[grank]
    if op == "all_gather":
        return np.concatenate(data)
    if op == "reduce_scatter":
        counts = _counts(i, n, size, even)
        full = (np.max if i % 2 else np.sum)(data, axis=0).astype(dtype)
        offs = np.cumsum([0, *counts])
        return full[offs[grank] : offs[grank + 1]]
    if op == "all_to_all":
        m = _matrix(i, n, size, even)
        blocks = [np.split(data[s][: int(m[s].sum())], np.cumsum(m[s])[:-1]) for s in range(size)]
        return np.concatenate([blocks[s][grank] for s in range(size)])
    if op == "gather":
        return np.concatenate(data) if grank == root else None
    if op == "scatter":
        src = _case_data(i, op, n * size, 1, 0, dtype)
        return src[grank * n : (grank + 1) * n]
    return None


@ON_JOB
@pytest.mark.parametrize("group", GROUPS, ids=[f"world{len(g)}" for g in GROUPS])
def test_every_collective_algorithm(job, group) -> None:
    """Each algorithm of simdist.algorithms, run_blocking over the transport of a group of
    2, 3 and 4 processes (group ranks mapped to other global ranks), against numpy."""
    out = job.run(_collectives, group, GROUPS.index(group))
    cases = _cases(len(group))
    for grank, r in enumerate(group):
        for case, got in zip(cases, out[r]):
            want = _expected(case, len(group), grank)
            if want is None:
                assert got is None, case
            else:
                assert got.dtype == np.dtype(case[5]) and np.array_equal(got, want), (case, grank, got, want)


# -- faults ------------------------------------------------------------------------------


def _collective_loop(net, doomed: int, port: int):
    """A barrier, then ring all_reduce over and over until a rank dies (signalling the first
    one done); then one more send to and receive from the dead rank, which must fail at once."""
    world = tuple(range(net.world_size))
    t = net.transport(world, net.rank, 1)
    alg.run_blocking(alg.get("barrier", "dissemination")(t, np.zeros(1)), t)
    buf = torch.ones(1 << 18)
    try:
        for i in range(100_000):
            t = net.transport(world, net.rank, 2 + i)
            alg.run_blocking(alg.get("all_reduce", "ring")(t, buf, R.SUM), t)
            buf.fill_(1)
            if i == 0:
                _signal(port, f"looping/{net.rank}")
    except DistError as exc:
        first = (type(exc).__name__, getattr(exc, "rank", None), time.monotonic(), i)
    later = []
    for post in (lambda: net.isend(buf, doomed, 1, 1), lambda: net.irecv(buf, doomed, 1, 1)):
        h = post()
        start = time.monotonic()
        try:
            net.wait([h])
        except PeerLostError as exc:
            later.append((exc.rank, round(time.monotonic() - start, 2)))
    return first, later


@ON_JOB
def test_killed_peer_fails_the_others_promptly(job) -> None:
    """SIGKILL one rank in the middle of a stream of all_reduce calls: every other rank raises
    PeerLostError naming it well before the timeout (also the ranks that do not receive from
    it); later operations with it fail at once; closing the others does not hang. (This
    breaks the module's job: the next test spawns another.) Times are CLOCK_MONOTONIC, one
    clock for every process of the machine."""
    doomed = 2
    job.broken = True
    job.start(_collective_loop, doomed, job.server.port)
    job.reached([f"looping/{r}" for r in range(job.size)])
    killed = time.monotonic()
    os.kill(job.pids[doomed], signal.SIGKILL)
    survivors = [0, 1, 3]
    out = job.results(survivors, timeout=job.timeout + 30)
    took = job.close()
    assert all(t < 20 for t in took), took  # no close waited for its linger (60 s)
    for r, (status, value) in zip(survivors, out):
        assert status == "ok", value
        (kind, rank, when, calls), later = value
        assert calls > 0, "the kill came before the first all_reduce finished"
        assert (kind, rank) == ("PeerLostError", doomed), (r, value)
        assert when - killed < 20, (r, when - killed)  # through the lost connection, not the 60 s timeout
        assert len(later) == 2 and all(q == doomed and t < 20 for q, t in later), (r, later)  # at once, too


def _stream_until_lost(net, doomed: int, port: int):
    """Rank ``doomed`` receives 256 KiB messages until it is killed (signalling the first one).
    The others send them to it, one isend and wait at a time (so each is written inline), until
    a send fails; then one more."""
    buf = np.ones(256 << 10, dtype=np.uint8)
    if net.rank == doomed:
        for i in itertools.count():
            net.wait([net.irecv(buf, 0, 41, i)])
            if i == 0:
                _signal(port, "receiving")
    for sent in itertools.count():
        h = net.isend(buf, doomed, 41, sent)
        done_at_return = h.done
        try:
            net.wait([h])
        except DistError as exc:
            failed_at = time.monotonic()
            later = net.isend(buf, doomed, 41, 0)
            return (
                type(exc).__name__,
                getattr(exc, "rank", None),
                done_at_return,
                sent,
                failed_at,
                later.done and isinstance(later.error, PeerLostError),
            )


@ON_JOB
def test_peer_killed_during_an_inline_send(job) -> None:
    """Stop the receiving rank so that the kernel's buffers fill: rank 0's inline write takes what
    they take and leaves the rest to the sender thread, so isend returns (not done) and the wait
    blocks, never the isend; then kill the rank: that send fails with PeerLostError naming it,
    soon, not at the timeout; a later send fails at once. (This breaks the module's job, and closes it.)"""
    doomed = 1
    job.broken = True
    job.start(_stream_until_lost, doomed, job.server.port, ranks=[0, doomed])
    job.reached(["receiving"])  # connected, and the stream flows
    os.kill(job.pids[doomed], signal.SIGSTOP)
    time.sleep(0.5)  # rank 0 fills the kernel's buffers and waits on a send; were it not yet, its next send fails alike
    killed = time.monotonic()
    os.kill(job.pids[doomed], signal.SIGKILL)
    [(status, value)] = job.results([0], timeout=job.timeout + 30)
    assert status == "ok", value
    kind, rank, done_at_return, sent, failed_at, later_failed = value
    assert (kind, rank) == ("PeerLostError", doomed), value
    assert not done_at_return and sent > 0, value  # isend returned with the rest of its frame unwritten
    assert failed_at - killed < 20, value  # through the lost connection, not the 60 s timeout
    assert later_failed, value
    took = job.close()  # here, not in a later test's time
    assert all(t < 20 for t in took), took  # no close waited for its linger (60 s)


# -- in this process: an attacker on a raw socket, orderly goodbyes -----------------------


class DictStore:
    """An in-memory store for networks running in threads of this process."""

    def __init__(self):
        self.data: dict[str, bytes] = {}
        self.cond = threading.Condition()

    def set(self, key: str, value: bytes) -> None:
        with self.cond:
            self.data[key] = value
            self.cond.notify_all()

    def get(self, key: str) -> bytes:
        with self.cond:
            if not self.cond.wait_for(lambda: key in self.data, 60):
                raise DistTimeoutError(f"no key {key!r}")
            return self.data[key]


def _raw_peer(net: PeerNetwork, rank: int, world: int) -> socket.socket:
    """A raw connection to ``net`` that passed the handshake and said hello as ``rank``."""
    from simdist.backends.socket._auth import client_handshake
    from simdist.backends.socket._links import HELLO, HELLO_MAGIC

    host, port = net.address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    client_handshake(sock, SECRET, 30)
    sock.sendall(HELLO.pack(HELLO_MAGIC, rank, world))
    return sock


def _timeout_naming(net: PeerNetwork, handle, words: list[str]) -> str:
    """The DistTimeoutError of a short wait for ``handle``, once its message names every one of
    ``words``: the network's own threads record a rejected connection soon, but at no fixed time."""
    deadline = time.monotonic() + 60
    while True:
        with pytest.raises(DistTimeoutError) as info:
            net.wait([handle], timeout=0.3)
        message = str(info.value)
        if all(w in message for w in words) or time.monotonic() > deadline:
            return message


@pytest.mark.timeout(60)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(garbage=st.binary(min_size=1, max_size=200), valid_first=st.booleans())
def test_garbage_from_an_authenticated_peer_fails_its_receives(garbage: bytes, valid_first: bool) -> None:
    """Random bytes after the hello: the pending receive fails with ProtocolError or
    PeerLostError (never a hang or another error), and the network still closes."""
    from simdist.backends.socket import _frames as F

    with PeerNetwork(0, 2, DictStore(), SECRET, timeout=30) as net:
        buf = np.zeros(2, dtype=np.int32)
        h = net.irecv(buf, 1, 0, 0)
        sock = _raw_peer(net, 1, 2)
        if valid_first:
            sock.sendall(F.encode_header(F.DATA, 0, 0, 8, 1) + np.arange(2, dtype=np.int32).tobytes())
            net.wait([h], timeout=30)
            assert buf.tolist() == [0, 1]
            h = net.irecv(buf, 1, 0, 0)
        try:  # the network may drop the connection at the first bad byte
            sock.sendall(garbage)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        with pytest.raises((ProtocolError, PeerLostError)):
            net.wait([h], timeout=30)
        sock.close()


@pytest.mark.timeout(120)
def test_a_bad_hello_is_rejected_and_reported() -> None:
    with PeerNetwork(0, 2, DictStore(), SECRET, timeout=30) as net:
        for rank, world in [(0, 2), (5, 2), (1, 3)]:
            _raw_peer(net, rank, world).close()
        message = _timeout_naming(net, net.irecv(np.zeros(1), 1, 0, 0), ["rank 5 of 2", "rank 1 of 3"])
        assert "rejected" in message and "rank 5 of 2" in message and "rank 1 of 3" in message, message


def _pair(secrets=(SECRET, SECRET)):
    """Two networks in threads of this process."""
    store = DictStore()
    nets = [None, None]

    def make(r):
        nets[r] = PeerNetwork(r, 2, store, secrets[r], timeout=30)

    threads = [threading.Thread(target=make, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return nets


@pytest.mark.timeout(120)
def test_close_flushes_sends_and_fails_only_pending_receives() -> None:
    a, b = _pair()
    try:
        big = torch.arange(1 << 20, dtype=torch.int32)
        hb = [b.isend(np.ones(1), 0, 0, 0), b.irecv(np.zeros(1), 0, 0, 1)]  # both connections exist
        a.wait([a.irecv(np.zeros(1), 1, 0, 0), a.isend(np.ones(1), 1, 0, 1)])
        b.wait(hb)
        pending = a.irecv(np.zeros(1), 1, 0, 99)  # never sent
        b.isend(big, 0, 1, 0)  # not waited for: close() must still deliver it
        b.close()
        with pytest.raises(PeerLostError, match="closed its peer network") as info:
            a.wait([pending], timeout=30)
        assert info.value.rank == 1
        got = torch.zeros_like(big)
        a.wait([a.irecv(got, 1, 1, 0)], timeout=30)  # arrived before the goodbye: still delivered
        assert torch.equal(got, big)
        with pytest.raises(PeerLostError, match="has closed its peer network"):
            a.wait([a.isend(np.ones(1), 1, 2, 0)], timeout=30)  # the goodbye came back the other way too
        with pytest.raises(PeerLostError):
            a.wait([a.irecv(np.zeros(1), 1, 2, 0)], timeout=30)
        later = a.irecv(np.zeros(1), None, 3, 0)
    finally:
        a.close()
        b.close()
    assert later.done and isinstance(later.error, DistError)
    with pytest.raises(DistError, match="closed"):
        a.isend(np.ones(1), 1, 0, 0)


@pytest.mark.timeout(120)
def test_bad_arguments() -> None:
    a, b = _pair()
    try:
        with pytest.raises(ValueError, match="itself"):
            a.isend(np.ones(1), 0, 0, 0)
        with pytest.raises(ValueError, match="peer"):
            a.irecv(np.ones(1), 2, 0, 0)
        with pytest.raises(ValueError, match="tag"):
            a.isend(np.ones(1), 1, 0, -1)
        with pytest.raises(ValueError, match="ctx"):
            a.isend(np.ones(1), 1, 1 << 64, 0)
        frozen = np.ones(2)
        frozen.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            a.irecv(frozen, 1, 0, 0)
        with pytest.raises(ValueError, match="contiguous"):
            a.isend(np.ones((4, 4))[:, 1], 1, 0, 0)
        with pytest.raises(ValueError, match="group rank"):
            a.transport((0, 1), 1, 0)
        t = a.transport((1, 0), 1, 5)
        assert (t.rank, t.size) == (1, 2)
        with pytest.raises(ValueError, match="group rank"):
            t.isend(np.ones(1), 2)
    finally:
        a.close()
        b.close()


@pytest.mark.timeout(120)
def test_wrong_secret_is_an_authentication_error() -> None:
    """Each rank's send fails the handshake with the other (AuthenticationError); its receive
    times out, and the timeout names the rejected incoming connection."""
    nets = _pair((SECRET, b"not the secret"))
    try:
        sends = [net.isend(np.ones(4), 1 - net.rank, 30, 0) for net in nets]
        recvs = [net.irecv(np.zeros(4), 1 - net.rank, 30, 0) for net in nets]
        for net, h, r in zip(nets, sends, recvs):
            with pytest.raises(AuthenticationError, match="wrong secret"):
                net.wait([h], timeout=30)
            message = _timeout_naming(net, r, ["rejected", "AuthenticationError"])
            assert "recv from rank" in message and "rejected" in message and "AuthenticationError" in message, message
    finally:
        for net in nets:
            net.close()


@pytest.mark.timeout(120)
def test_a_huge_claimed_size_allocates_only_what_arrives() -> None:
    """A header announcing 1 TiB, then 1 MiB and the end of the stream: memory follows the
    bytes received, and the peer's pending receive fails with PeerLostError."""
    import tracemalloc

    from simdist.backends.socket import _frames as F

    with PeerNetwork(0, 2, DictStore(), SECRET, timeout=30) as net:
        pending = net.irecv(np.zeros(1), 1, 0, 1)
        sock = _raw_peer(net, 1, 2)
        tracemalloc.start()
        try:
            sock.sendall(F.encode_header(F.DATA, 0, 0, F.MAX_FRAME_BYTES, 1) + bytes(1 << 20))
            sock.close()
            with pytest.raises(PeerLostError, match="ended without a goodbye") as info:
                net.wait([pending], timeout=30)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert info.value.rank == 1
        assert peak < 32 << 20, peak


@pytest.mark.timeout(120)
def test_a_receive_posted_while_its_message_arrives() -> None:
    """Part of a 24 MiB message arrives unexpected, then the receive is posted, then the rest."""
    from simdist.backends.socket import _frames as F

    data = np.random.default_rng(0).integers(0, 255, 24 << 20, dtype=np.uint8)
    with PeerNetwork(0, 2, DictStore(), SECRET, timeout=30) as net:
        sock = _raw_peer(net, 1, 2)
        sock.sendall(F.encode_header(F.DATA, 3, 4, data.nbytes, 1))
        sock.sendall(data[: 10 << 20])
        time.sleep(0.2)  # usually lets part arrive first; a receive posted before it arrives gets the same bytes
        out = torch.zeros(data.nbytes, dtype=torch.uint8)
        h = net.irecv(out, 1, 3, 4)
        sock.sendall(data[10 << 20 :])
        net.wait([h], timeout=30)
        assert np.array_equal(out.numpy(), data)
        sock.sendall(F.encode_header(F.CLOSE, 0, 0, 0, 1))
        sock.close()
