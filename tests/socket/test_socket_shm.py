"""Shared memory between same-host ranks of the socket backend (``backends/socket/_shm.py``).

What is checked against independent truth: the bytes received equal the bytes sent
(also for messages that wrap the ring several times, and messages that arrive before
their receive); the ring really is shared memory (this process's ``/proc/self/maps``
shows the ``memfd:simdist-shm`` mappings while networks are open, and none once they are
closed, on an orderly close, a failing close, and after a peer was killed with SIGKILL in
the middle of a transfer); and nothing is ever left in ``/dev/shm``.
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import threading
import time

import numpy as np
import pytest
from simdist.backends.socket import _shm
from test_socket_peers import Job, _pair, _signal

from simdist.core._errors import DistError, ProtocolError

SIZES = [_shm.MIN_BYTES - 1, _shm.MIN_BYTES, (1 << 20) + 3, _shm.SLOT_BYTES * _shm.SLOTS * 2 + 5]


def shm_mappings() -> int:
    """How many shared rings (ours or a peer's) this process maps now, read from /proc/self/maps."""
    with open("/proc/self/maps") as f:
        return sum("memfd:simdist-shm" in line for line in f)


def dev_shm() -> set[str]:
    """Named shared memory on this machine, less what other programs on a busy machine create and remove while a
    test runs: semaphores (``sem.*``: any Python process's multiprocessing) and Chromium's (the browser tests on
    pytest-xdist's other workers)."""
    if not os.path.isdir("/dev/shm"):
        return set()
    return {name for name in os.listdir("/dev/shm") if not name.startswith(("sem.", ".org.chromium."))}


def _payload(nbytes: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


@pytest.mark.timeout(120)
def test_messages_of_every_size_arrive_intact_through_shared_memory() -> None:
    """Rank 1 sends every size to rank 0, each once received into a posted buffer and once
    arrived before its receive; every byte matches; the rings are mapped (one each way)."""
    before = shm_mappings()
    a, b = _pair()
    try:
        for i, n in enumerate(SIZES):
            data = _payload(n, i)
            got = np.zeros(n, np.uint8)
            h = a.irecv(got, 1, 1, i)  # posted first
            b.wait([b.isend(data, 0, 1, i)], timeout=60)
            a.wait([h], timeout=60)
            assert np.array_equal(got, data), n
            late = np.zeros(n, np.uint8)
            b.wait([b.isend(data[::-1].copy(), 0, 2, i)], timeout=60)  # unexpected: before its receive
            a.wait([a.irecv(late, 1, 2, i)], timeout=60)
            assert np.array_equal(late, data[::-1]), n
        both = [np.zeros(1 << 20, np.uint8), np.zeros(1 << 20, np.uint8)]
        hs = [
            a.irecv(both[0], 1, 3, 0),
            b.irecv(both[1], 0, 3, 0),
            a.isend(_payload(1 << 20, 7), 1, 3, 0),
            b.isend(_payload(1 << 20, 8), 0, 3, 0),
        ]
        a.wait(hs[::2], timeout=60)
        b.wait(hs[1::2], timeout=60)
        assert np.array_equal(both[0], _payload(1 << 20, 8)) and np.array_equal(both[1], _payload(1 << 20, 7))
        assert shm_mappings() - before == 4  # each network maps its own ring and the peer's
    finally:
        a.close()
        b.close()
    assert shm_mappings() == before


@pytest.mark.timeout(120)
def test_size_mismatch_through_shared_memory_is_a_protocol_error_and_the_stream_goes_on() -> None:
    before = shm_mappings()
    a, b = _pair()
    try:
        b.wait([b.isend(_payload(1 << 20, 1), 0, 1, 0)], timeout=60)
        with pytest.raises(ProtocolError, match="size mismatch"):
            a.wait([a.irecv(np.zeros(1 << 19, np.uint8), 1, 1, 0)], timeout=60)
        got = np.zeros(3 << 20, np.uint8)
        b.wait([b.isend(_payload(3 << 20, 2), 0, 1, 1)], timeout=60)
        a.wait([a.irecv(got, 1, 1, 1)], timeout=60)
        assert np.array_equal(got, _payload(3 << 20, 2))
    finally:
        a.close(failed=True)  # the exit path of a failing rank: its goodbye says so
        b.close()
    assert shm_mappings() == before


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["SIMDIST_SHM=0", "no rings left"])
def test_shm_off_keeps_every_payload_on_tcp(monkeypatch, how: str) -> None:
    if how == "SIMDIST_SHM=0":
        monkeypatch.setenv(_shm.ENV, "0")
    else:
        monkeypatch.setattr(_shm, "MAX_RINGS", 0)  # a rank offers rings to its first MAX_RINGS peers only
    before = shm_mappings()
    a, b = _pair()
    try:
        data = _payload(5 << 20, 3)
        got = np.zeros_like(data)
        h = a.irecv(got, 1, 1, 0)
        b.wait([b.isend(data, 0, 1, 0)], timeout=60)
        a.wait([h], timeout=60)
        assert np.array_equal(got, data)
        assert shm_mappings() == before
    finally:
        a.close()
        b.close()


@pytest.mark.timeout(30)
def test_a_bad_credit_is_a_protocol_error() -> None:
    from simdist.backends.socket._frames import CREDIT, decode_header, encode_header

    ring = _shm.Ring(slot_size=4096, slots=2)
    try:
        with pytest.raises(ProtocolError, match="owes"):  # nothing written yet
            ring.credit(decode_header(encode_header(CREDIT, 0, 0, 0, 1)), 1)
        ring.put(memoryview(b"x" * 10), 0)
        with pytest.raises(ProtocolError, match="returned slot 1"):
            ring.credit(decode_header(encode_header(CREDIT, 1, 0, 0, 1)), 1)
        ring.credit(decode_header(encode_header(CREDIT, 0, 0, 0, 1)), 1)
        assert not ring.full()
    finally:
        ring.close()


# -- a rank killed in the middle of a transfer (real processes) -----------------------------


def _stream(net, sender: int, port: int):
    """``sender`` streams 4 MiB messages to the other rank of two, which receives them, until the
    peer is lost; then: the error, the rings mapped before and after closing, and how many passed."""
    buf = np.ones(4 << 20, dtype=np.uint8)
    peer = 1 - net.rank
    for i in itertools.count():
        try:
            if net.rank == sender:
                net.wait([net.isend(buf, peer, 5, i)])
            else:
                net.wait([net.irecv(buf, peer, 5, i)])
        except DistError as exc:
            mapped = shm_mappings()
            net.close(failed=True)
            return type(exc).__name__, getattr(exc, "rank", None), mapped, shm_mappings(), i
        if i == 2:
            _signal(port, f"streaming/{net.rank}")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("doomed", ["sender", "receiver"])
def test_a_rank_killed_mid_transfer_leaves_no_shared_memory(doomed: str) -> None:
    """SIGKILL one of two ranks streaming 4 MiB messages through the ring: the other fails with
    PeerLostError naming it, maps the rings until it closes and none after; /dev/shm never changes."""
    shm_before = dev_shm()
    job = Job(2)
    try:
        sender = 0
        victim = sender if doomed == "sender" else 1 - sender
        job.start(_stream, sender, job.server.port)
        job.reached(["streaming/0", "streaming/1"])
        os.kill(job.pids[victim], signal.SIGKILL)
        [(status, value)] = job.results([1 - victim], timeout=job.timeout + 30)
        assert status == "ok", value
        kind, rank, mapped, after, passed = value
        assert (kind, rank) == ("PeerLostError", victim), value
        assert passed >= 3 and mapped >= 1 and after == 0, value
    finally:
        job.broken = True
        job.close()  # joins the workers
    assert dev_shm() == shm_before


def _offer_with(ring: _shm.Ring, *, host: bytes | None = None, nonce: bytes | None = None) -> bytes:
    """``ring``'s SHM_OPEN frame, with its host digest or nonce replaced."""
    from simdist.backends.socket._frames import HEADER_SIZE

    frame = ring.offer(0)
    pid, fd, slot, slots, n, h = _shm._OFFER.unpack(frame[HEADER_SIZE:])
    return frame[:HEADER_SIZE] + _shm._OFFER.pack(pid, fd, slot, slots, nonce or n, host or h)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("change", ["none", "host", "nonce", "not allowed"])
def test_an_offer_is_mapped_only_from_this_host_and_with_its_nonce(change: str) -> None:
    """Another host (its digest differs), a file that is not the ring offered (nonce), or shared
    memory turned off here: the answer is SHM_ACK with tag 0 and the payloads stay on TCP."""
    from simdist.backends.socket._frames import HEADER_SIZE, SHM_ACK, decode_header

    ring = _shm.Ring(slot_size=4096, slots=2)
    left, right = socket.socketpair()
    try:
        frame = _offer_with(
            ring, host=b"h" * 16 if change == "host" else None, nonce=b"n" * 16 if change == "nonce" else None
        )
        left.sendall(frame)
        h = decode_header(right.recv(HEADER_SIZE, socket.MSG_WAITALL))
        reader = _shm.RingReader.accept(
            right, h, 1, 0, threading.Lock(), time.monotonic() + 20, change != "not allowed"
        )
        answer = decode_header(left.recv(HEADER_SIZE, socket.MSG_WAITALL))
        assert answer.kind == SHM_ACK and answer.tag == int(change == "none")
        assert (reader is not None) == (change == "none")
        if reader is not None:
            ring.put(memoryview(b"abc"), 0)
            assert bytes(reader.view[_shm._HEAD : _shm._HEAD + 3]) == b"abc"  # the same memory
            reader.close()
    finally:
        ring.close()
        left.close()
        right.close()


# -- collectives through the rings, checked against formulas ---------------------------------

N = (3 << 20) // 8 + 5  # float64 elements per rank: 3 MiB and a bit, an odd count (uneven segments)


def _big_collectives(rank: int, world: int) -> dict:
    """Each large collective once on exact integers in float64; what rank ``rank`` got, as checksums."""
    import torch

    import simdist as dist

    dist.init_process_group("socket")
    try:
        base = torch.arange(N, dtype=torch.float64)
        out = {"mapped": 0}
        a = base + rank
        dist.all_reduce(a)
        out["all_reduce"] = bool(torch.equal(a, base * world + world * (world - 1) / 2))
        b = base * (rank + 1)
        dist.broadcast(b, src=world - 1)
        out["broadcast"] = bool(torch.equal(b, base * world))
        g = torch.empty(N * world, dtype=torch.float64)
        dist.all_gather_into_tensor(g, base + 1000 * rank)
        out["all_gather"] = bool(torch.equal(g, torch.cat([base + 1000 * r for r in range(world)])))
        rs = torch.empty(N, dtype=torch.float64)
        dist.reduce_scatter_tensor(rs, torch.arange(N * world, dtype=torch.float64) * (rank + 1))
        whole = torch.arange(N * world, dtype=torch.float64) * (world * (world + 1) / 2)
        out["reduce_scatter"] = bool(torch.equal(rs, whole[rank * N : (rank + 1) * N]))
        a2a = torch.empty(N * world, dtype=torch.float64)
        dist.all_to_all_single(a2a, torch.arange(N * world, dtype=torch.float64) + 1e7 * rank)
        out["all_to_all"] = bool(
            torch.equal(
                a2a,
                torch.cat(
                    [torch.arange(rank * N, (rank + 1) * N, dtype=torch.float64) + 1e7 * r for r in range(world)]
                ),
            )
        )
        out["mapped"] = shm_mappings()
        return out
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("shm", ["1", "0"])
def test_large_collectives_at_world_3_equal_their_formulas(monkeypatch, shm: str) -> None:
    """all_reduce, broadcast, all_gather, reduce_scatter and all_to_all of 3 MiB per rank at world 3
    (not a power of two), through the rings and over TCP: every result equals its formula."""
    import simdist

    monkeypatch.setenv(_shm.ENV, shm)
    before = dev_shm()
    results = simdist.spawn(_big_collectives, args=(3,), nprocs=3, backend="socket")
    for rank, out in enumerate(results):
        assert all(v for k, v in out.items() if k != "mapped"), (rank, out)
        assert (out["mapped"] > 0) == (shm == "1"), (rank, out)  # the rings carried them, or TCP did
    assert dev_shm() == before


def _send_once_then_wait(net, port: int):
    """Rank 0 sends rank 1 one message through the ring (its credit comes back and stays unread), then
    waits for a message rank 1 never sends; rank 1 receives it and signals. Rank 0: the error and when."""
    buf = np.ones(1 << 20, dtype=np.uint8)
    if net.rank == 1:
        net.wait([net.irecv(buf, 0, 6, 0)])
        _signal(port, "received")
        return None
    net.wait([net.isend(buf, 1, 6, 0)])
    try:
        net.wait([net.irecv(buf, 1, 6, 1)], timeout=50)
    except DistError as exc:
        return type(exc).__name__, getattr(exc, "rank", None), time.monotonic()
    return None


@pytest.mark.timeout(300)
def test_a_killed_receiver_is_found_although_credits_wait_unread() -> None:
    """Rank 1 only ever received from rank 0 (no connection from it to rank 0), and its last
    credit waits unread on rank 0's connection when it is killed: rank 0's wait still raises
    PeerLostError naming it, through the connection's hang-up, long before its 50 s timeout."""
    job = Job(2)
    try:
        job.start(_send_once_then_wait, job.server.port, ranks=[0, 1])
        job.reached(["received"])
        assert job.results([1])[0] == ("ok", None)
        time.sleep(0.5)  # the credit reaches rank 0's socket
        killed = time.monotonic()
        os.kill(job.pids[1], signal.SIGKILL)
        [(status, value)] = job.results([0], timeout=job.timeout + 30)
        assert status == "ok" and value is not None, value
        kind, rank, when = value
        assert (kind, rank) == ("PeerLostError", 1), value
        assert when - killed < 20, when - killed
    finally:
        job.broken = True
        job.close()
