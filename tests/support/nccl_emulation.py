"""simdist's NCCL layer on CPU, over a stand-in for NCCL that moves bytes through the socket store.

Run as a script (``python tests/support/nccl_emulation.py [WORLD ...]``), never imported by the test
process: it replaces ``cupy.cuda.nccl`` and torch's CUDA streams and events in its own
process, then runs the collectives suite's batches (every op, every dtype with every
reduce op, subgroups, non-contiguous layouts, async works) and point-to-point on
``backend="nccl"`` at each world size, compared with the numpy reference, and three DDP
steps compared with the simulator's.

What this checks is simdist's side only: ``NcclGroup`` and ``NcclWorld`` (unique ids
through the store, staging, grouped send/recv for gather, scatter, all_to_all and p2p,
local reductions for what NCCL lacks). The stand-in follows NCCL's contract (a collective
needs every rank; point-to-point inside a group, in order per pair of ranks; the root alone
gets a reduce's result) with plain byte copies; CUDA streams and events are no-ops on CPU.
It says nothing about NCCL or CUDA themselves: tests/gpu runs the real ones.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))  # test_api_collectives: the cases it runs

import simdist as dist  # noqa: E402

CUPY_MAJOR = int(os.environ.get("SIMDIST_EMULATED_CUPY", "14"))
"""The cupy release whose signatures the stand-in mirrors: 14 and newer take NCCL's unique id as
``bytes``, 13 and older as a tuple of 128 signed chars (each raises ``TypeError`` on the other)."""

_TYPES = {
    100 + i: (name, dt)
    for i, (name, dt) in enumerate(
        [
            ("NCCL_UINT8", torch.uint8),
            ("NCCL_INT8", torch.int8),
            ("NCCL_INT32", torch.int32),
            ("NCCL_INT64", torch.int64),
            ("NCCL_FLOAT16", torch.float16),
            ("NCCL_BFLOAT16", torch.bfloat16),
            ("NCCL_FLOAT32", torch.float32),
            ("NCCL_FLOAT64", torch.float64),
        ]
    )
}
_OPS = {
    0: ("NCCL_SUM", torch.add),
    1: ("NCCL_PROD", torch.mul),
    2: ("NCCL_MAX", torch.maximum),
    3: ("NCCL_MIN", torch.minimum),
    4: ("NCCL_AVG", None),
}
_state: dict = {"store": None, "pending": None, "one_gpu": False}


def _read(ptr: int, count: int, dtype: int) -> bytes:
    return ctypes.string_at(ptr, count * torch.empty(0, dtype=_TYPES[dtype][1]).element_size())


def _write(ptr: int, data: bytes) -> None:
    if data:
        ctypes.memmove(ptr, data, len(data))


def _bytes(t: torch.Tensor) -> bytes:
    return bytes(t.contiguous().view(torch.uint8).numpy())


class Communicator:
    """One rank's stand-in communicator: a collective posts this rank's bytes under a key and
    reads every rank's; a send posts under (pair, sequence number) and the receive reads it."""

    def __init__(self, nranks: int, unique_id: bytes | tuple, rank: int):
        expected = bytes if CUPY_MAJOR >= 14 else tuple  # as the real one's Cython signature checks it
        if not isinstance(unique_id, expected):
            raise TypeError(
                f"Argument 'commId' has incorrect type (expected {expected.__name__}, got {type(unique_id).__name__})"
            )
        self.n, self.rank = nranks, rank
        self.id = bytes(b & 0xFF for b in unique_id).hex()[:16]
        self.store, self.seq, self.sent, self.received = _state["store"], 0, {}, {}

    def _everyone(self, data: bytes) -> list[bytes]:
        self.seq += 1
        self.store.set(f"nccl-emulation/{self.id}/{self.seq}/{self.rank}", data)
        return [self.store.get(f"nccl-emulation/{self.id}/{self.seq}/{r}") for r in range(self.n)]

    def _reduce(self, datas: list[bytes], dtype: int, op: int) -> torch.Tensor:
        dt = _TYPES[dtype][1]
        ts = [torch.frombuffer(bytearray(d), dtype=dt) if d else torch.empty(0, dtype=dt) for d in datas]
        if _OPS[op][1] is None:  # average
            return (functools.reduce(torch.add, ts) / self.n).to(dt)
        return functools.reduce(_OPS[op][1], ts)

    def allReduce(self, send, recv, count, dtype, op, stream):  # noqa: N802 - cupy's names
        _write(recv, _bytes(self._reduce(self._everyone(_read(send, count, dtype)), dtype, op)))

    def broadcast(self, send, recv, count, dtype, root, stream):
        _write(recv, self._everyone(_read(send, count, dtype) if self.rank == root else b"")[root])

    def reduce(self, send, recv, count, dtype, op, root, stream):
        result = self._reduce(self._everyone(_read(send, count, dtype)), dtype, op)
        if self.rank == root:
            _write(recv, _bytes(result))

    def allGather(self, send, recv, count, dtype, stream):  # noqa: N802
        _write(recv, b"".join(self._everyone(_read(send, count, dtype))))

    def reduceScatter(self, send, recv, count, dtype, op, stream):  # noqa: N802
        result = self._reduce(self._everyone(_read(send, count * self.n, dtype)), dtype, op)
        _write(recv, _bytes(result[self.rank * count : (self.rank + 1) * count]))

    def send(self, buf, count, dtype, peer, stream):
        assert _state["pending"] is not None, "simdist calls NCCL's send outside a group"
        _state["pending"].append((0, lambda: self._send(buf, count, dtype, peer)))

    def recv(self, buf, count, dtype, peer, stream):
        assert _state["pending"] is not None, "simdist calls NCCL's recv outside a group"
        _state["pending"].append((1, lambda: self._recv(buf, count, dtype, peer)))

    def _send(self, buf, count, dtype, peer):
        k = self.sent[peer] = self.sent.get(peer, 0) + 1
        self.store.set(f"nccl-emulation/{self.id}/p2p/{self.rank}-{peer}/{k}", _read(buf, count, dtype))

    def _recv(self, buf, count, dtype, peer):
        k = self.received[peer] = self.received.get(peer, 0) + 1
        data = self.store.get(f"nccl-emulation/{self.id}/p2p/{peer}-{self.rank}/{k}")
        want = len(_read(buf, count, dtype))
        assert len(data) == want, f"message {k} from rank {peer}: {len(data)} bytes sent, {want} received"
        _write(buf, data)

    def abort(self) -> None:
        pass

    def destroy(self) -> None:
        pass


def _group_start() -> None:
    assert _state["pending"] is None, "nested NCCL groups"
    _state["pending"] = []


def _group_end() -> None:
    pending, _state["pending"] = _state["pending"], None
    for _, run in sorted(pending, key=lambda p: p[0]):  # a group's sends are posted before its receives wait
        run()


class _Event:
    def record(self, stream=None) -> None:
        self.recorded = True

    def query(self) -> bool:
        return True


class _Stream:
    cuda_stream = 0

    def wait_event(self, event: _Event) -> None:
        assert event.recorded


def install() -> None:
    """Replace cupy's NCCL module and torch's CUDA streams and events in this process."""
    nccl = types.ModuleType("cupy.cuda.nccl")
    for code, (name, _) in {**_TYPES, **_OPS}.items():
        setattr(nccl, name, code)
    if CUPY_MAJOR >= 14:
        nccl.get_unique_id = lambda: os.urandom(128)
    else:
        nccl.get_unique_id = lambda: tuple(b - 128 for b in os.urandom(128))
    nccl.groupStart, nccl.groupEnd, nccl.NcclCommunicator = _group_start, _group_end, Communicator
    cuda = types.ModuleType("cupy.cuda")
    cuda.nccl = nccl
    cupy = types.ModuleType("cupy")
    cupy.cuda, cupy.__version__ = cuda, f"{CUPY_MAJOR}.0.0"
    sys.modules.update({"cupy": cupy, "cupy.cuda": cuda, "cupy.cuda.nccl": nccl})
    torch.cuda.Event = _Event
    torch.cuda.current_stream = lambda device=None: _Stream()
    torch.cuda.current_device = lambda: 0
    torch.cuda.is_available = lambda: True
    torch.cuda.device = lambda device: contextlib.nullcontext()

    from simdist.backends.nccl import _world

    make_group = _world.NcclWorld._group

    def group_on_the_host(self, ranks, group_id, timeout=None):
        self.device = torch.device("cpu")  # the "device" is the host: staging copies cost nothing
        _state["store"] = self.store
        return make_group(self, ranks, group_id, timeout)

    _world.NcclWorld._group = group_on_the_host
    # Each process its own GPU (as one rank per GPU), or, with _state["one_gpu"], every rank on the same one.
    _world.NcclWorld._gpu_identity = lambda self: (
        ("emulated/0", "cuda:0") if _state["one_gpu"] else (f"emulated/{os.getpid()}", f"cuda:{os.getpid()}")
    )


def _point_to_point(rank: int) -> list:
    dist.init_process_group("nccl")
    peer = 1 - rank
    out = torch.zeros(4)
    works = dist.batch_isend_irecv(
        [dist.P2POp(dist.isend, torch.full((4,), float(rank)), peer), dist.P2POp(dist.irecv, out, peer)]
    )
    for w in works:
        w.wait()
    got = torch.zeros(2)
    src = dist.recv(got, 0) if rank == 1 else dist.send(torch.ones(2), 1)
    objects = [None, None]
    dist.all_gather_object(objects, {"rank": rank})
    try:
        dist.irecv(torch.zeros(1))
        any_source = "accepted"
    except ValueError as exc:
        any_source = str(exc)
    dist.destroy_process_group()
    return [out.tolist(), works[1].source_rank(), got.tolist(), src, objects, any_source]


def ddp_steps(rank: int, device: str = "cpu") -> list:
    """Three DDP steps with small buckets (async all-reduces, futures) on ``"nccl"``; the
    parameters, on the CPU. tests/gpu runs the same steps on a GPU."""
    dist.init_process_group("nccl")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(device)
    ddp = dist.DistributedDataParallel(model, bucket_cap_mb=0.001)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(3):
        x, y = torch.randn(5, 8, generator=g).to(device), torch.randn(5, 4, generator=g).to(device)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    out = [p.detach().cpu().clone() for p in model.parameters()]
    dist.destroy_process_group()
    return out


def main(worlds: list[int]) -> None:
    install()
    import test_api_collectives as suite
    from reference import ARRAY_TYPES

    suite.run = lambda fn, n, backend, args=(): dist.spawn(fn, args, n, start_method="fork", backend="nccl", timeout=60)
    for world in worlds:
        batch = [c for op, _ in suite._own_algorithms("gloo") for c in suite._algorithm_batch(op, None, world)]
        batch += [c for kind, dtype in ARRAY_TYPES for c in suite._dtype_batch(kind, dtype, world)]
        batch += suite._subgroup_batch(world)
        for layout in ("transposed", "strided"):
            batch += [
                suite.Case(op=op, world=world, layout=layout, rop=dist.ReduceOp.SUM if op in suite.REDUCING else None)
                for op in suite.OPS
            ]
        batch += [suite.replace(c, async_op=True) for c in batch[:30]]
        suite.check(batch, world, "messages", backend="nccl")
        print(f"world {world}: {len(batch)} cases: ok", flush=True)
    got = dist.spawn(_point_to_point, nprocs=2, start_method="fork", backend="nccl", timeout=60)
    assert got[0][:5] == [[1.0] * 4, 1, [0.0, 0.0], None, [{"rank": 0}, {"rank": 1}]], got[0]
    assert got[1][:5] == [[0.0] * 4, 0, [1.0, 1.0], 0, [{"rank": 0}, {"rank": 1}]], got[1]
    assert "no receive from any source" in got[0][5], got[0][5]
    print("point-to-point: ok", flush=True)
    _state["one_gpu"] = True
    try:
        dist.spawn(_point_to_point, nprocs=2, start_method="fork", backend="nccl", timeout=60)
    except dist.RankError as exc:
        assert "ranks 0 and 1 are on one GPU" in str(exc.__cause__) and "Duplicate GPU" in str(exc.__cause__), exc
    else:
        raise AssertionError("two ranks on one GPU were not refused")
    _state["one_gpu"] = False
    print("one GPU for two ranks: refused", flush=True)
    # The processes are forked before this process multiplies matrices on several threads
    # (the simulated ranks): a child forked after that could hang in MKL's allocator.
    got = dist.spawn(ddp_steps, nprocs=3, start_method="fork", backend="nccl", timeout=60)
    want = dist.simulate(ddp_steps, 3).values
    for rank in range(3):
        for a, b in zip(got[rank], want[rank]):
            torch.testing.assert_close(a, b)
    print("DDP: ok", flush=True)


if __name__ == "__main__":
    main([int(w) for w in sys.argv[1:]] or [1, 3])
