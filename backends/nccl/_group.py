"""``NcclGroup``: simdist's primitives as NCCL calls on the caller's current CUDA stream.

Every op is enqueued on ``torch.cuda.current_stream()`` and records a CUDA event there;
``Work.wait()`` makes the then-current stream wait on that event (the host does not block),
as torch's NCCL backend does. Arrays in host memory (CPU tensors, numpy arrays) are copied
to this rank's device and back, so code that mixes them still runs; the copy back blocks
the host until the op is done, for at most the group's timeout (then the communicator is
aborted and ``DistTimeoutError`` raised). NCCL has no tags and no any-source receive: p2p
between two ranks is in order, and ``recv`` needs ``src``.
"""

from __future__ import annotations

import contextlib
import functools
import time
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from simdist.core import arrays as A
from simdist.core import DistTimeoutError
from simdist.core import Handle, LibraryGroup
from simdist.core import ReduceOp

__all__ = ["NcclGroup", "NcclHandle"]


@functools.cache
def _nccl() -> Any:
    from cupy.cuda import nccl

    return nccl


_DTYPES = {  # torch dtype -> name of cupy.cuda.nccl's constant
    torch.uint8: "NCCL_UINT8",
    torch.int8: "NCCL_INT8",
    torch.int32: "NCCL_INT32",
    torch.int64: "NCCL_INT64",
    torch.float16: "NCCL_FLOAT16",
    torch.bfloat16: "NCCL_BFLOAT16",
    torch.float32: "NCCL_FLOAT32",
    torch.float64: "NCCL_FLOAT64",
}
_OPS = {
    ReduceOp.SUM: "NCCL_SUM",
    ReduceOp.PRODUCT: "NCCL_PROD",
    ReduceOp.MIN: "NCCL_MIN",
    ReduceOp.MAX: "NCCL_MAX",
    ReduceOp.AVG: "NCCL_AVG",
}


class NcclHandle:
    """A CUDA event recorded after an NCCL call on the caller's stream."""

    def __init__(self, group: "NcclGroup", stream: Any, host_sync: bool = False):
        self.group = group
        self.event = torch.cuda.Event()
        self.event.record(stream)
        self.host_sync = host_sync

    def wait(self, timeout: float | None = None) -> None:
        torch.cuda.current_stream(self.group.device).wait_event(self.event)
        if self.host_sync:
            self.group.sync_host(timeout)

    def is_completed(self) -> bool:
        return self.event.query()


class NcclGroup(LibraryGroup):
    """One rank's NCCL communicator ``comm`` for the global ``ranks``, on CUDA ``device``."""

    backend = "nccl"

    def __init__(self, comm: Any, device: torch.device, rank: int, ranks: Sequence[int], group_id: int, timeout: float):
        super().__init__(rank, ranks, group_id)
        self.comm = comm
        self.device = device
        self.timeout = timeout
        nccl = _nccl()  # NCCL's constants, looked up once: an op's host time is what small messages cost
        self.nccl_dtypes = {dtype: getattr(nccl, name) for dtype, name in _DTYPES.items()}
        self.nccl_ops = {op: getattr(nccl, name) for op, name in _OPS.items()}

    # --- translation ---------------------------------------------------------------------

    def library_buffer(self, flat: Any, written: bool) -> tuple[Any, Callable[[], None] | None]:
        t = A.as_tensor(flat)  # a cupy or numpy array: a tensor on the same memory
        if t.device.type == "cuda":
            if t.device != self.device:
                raise ValueError(
                    f"an array on {t.device} was given to an NCCL group on {self.device}; "
                    "use torch.cuda.set_device() before init_process_group, or move the array"
                )
            return t, None
        host = t
        dev = host.to(self.device)
        if not written:
            return dev, None
        return dev, lambda: (self.sync_host(None), host.copy_(dev))

    def library_reduces(self, buf: Any, op: ReduceOp) -> bool:
        return buf.dtype in _DTYPES and op in _OPS

    def sync_host(self, timeout: float | None) -> None:
        """Block the host until this device's current stream has run what was enqueued so far.

        After ``timeout`` (default: the group's) the communicator is aborted and
        ``DistTimeoutError`` raised: a missing peer cannot hang the rank.
        """
        limit = self.timeout if timeout is None else timeout
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(self.device))
        deadline = time.monotonic() + limit
        while not done.query():
            if time.monotonic() > deadline:
                self.comm.abort()
                raise DistTimeoutError(
                    f"rank {self.ranks[self.rank]}: an NCCL operation of group {self.group_id} did not complete "
                    f"within timeout={limit} s; its communicator was aborted (is a rank missing, or are the "
                    "ranks' calls in different orders?)"
                )
            time.sleep(1e-4)

    def _args(self, buf: Any) -> tuple[int, int, int]:
        """(pointer, count, NCCL datatype) of a flat device buffer."""
        return buf.data_ptr(), buf.numel(), self.nccl_dtypes[buf.dtype]

    def _stream(self) -> Any:
        """The caller's current stream on this group's device (a ``torch.cuda.Stream``)."""
        return torch.cuda.current_stream(self.device)

    @contextlib.contextmanager
    def _grouped(self) -> Iterator[None]:
        nccl = _nccl()
        nccl.groupStart()
        try:
            yield
        finally:
            nccl.groupEnd()

    def _handle(self, stream: Any, host_sync: bool = False) -> Handle:
        return NcclHandle(self, stream, host_sync)

    # --- primitives ----------------------------------------------------------------------

    def _launch(self, call: Callable, *args: Any) -> Handle:
        """``call(*args, stream)`` on the caller's current stream, and the handle on it."""
        stream = self._stream()
        call(*args, stream.cuda_stream)
        return self._handle(stream)

    def _lib_all_reduce(self, buf: Any, op: ReduceOp) -> Handle:
        ptr, n, dt = self._args(buf)
        return self._launch(self.comm.allReduce, ptr, ptr, n, dt, self.nccl_ops[op])

    def _lib_broadcast(self, buf: Any, root: int) -> Handle:
        ptr, n, dt = self._args(buf)
        return self._launch(self.comm.broadcast, ptr, ptr, n, dt, root)

    def _lib_reduce(self, buf: Any, op: ReduceOp, root: int) -> Handle:
        ptr, n, dt = self._args(buf)
        # NCCL writes the receive buffer on the root only: the others keep their values.
        return self._launch(self.comm.reduce, ptr, ptr, n, dt, self.nccl_ops[op], root)

    def _lib_all_gather(self, out: Any, inp: Any) -> Handle:
        ptr, n, dt = self._args(inp)
        return self._launch(self.comm.allGather, ptr, out.data_ptr(), n, dt)

    def _lib_reduce_scatter(self, out: Any, inp: Any, op: ReduceOp) -> Handle:
        ptr, n, dt = self._args(out)
        return self._launch(self.comm.reduceScatter, inp.data_ptr(), ptr, n, dt, self.nccl_ops[op])

    def _exchange(self, sends: list[tuple[int, Any]], recvs: list[tuple[int, Any]]) -> Handle:
        """Grouped point-to-point: ``(peer, buffer)`` pairs; a rank's own block is copied locally."""
        stream = self._stream()
        handle = stream.cuda_stream
        mine = {peer: buf for peer, buf in sends if peer == self.rank}
        with self._grouped():
            for peer, buf in sends:
                if peer != self.rank and buf.numel():
                    self.comm.send(*self._args(buf), peer, handle)
            for peer, buf in recvs:
                if peer == self.rank:
                    buf.copy_(mine[peer])
                elif buf.numel():
                    self.comm.recv(*self._args(buf), peer, handle)
        return self._handle(stream)

    def _blocks(self, buf: Any) -> list:
        n = buf.numel() // self.size
        return [buf[i * n : (i + 1) * n] for i in range(self.size)]

    def _lib_gather(self, out: Any | None, inp: Any, root: int) -> Handle:
        if out is None:
            return self._exchange([(root, inp)], [])
        return self._exchange([(root, inp)], list(enumerate(self._blocks(out))))

    def _lib_scatter(self, out: Any, inp: Any | None, root: int) -> Handle:
        sends = list(enumerate(self._blocks(inp))) if inp is not None else []
        return self._exchange(sends, [(root, out)])

    def _lib_all_to_all(self, out: Any, recv: list[int], inp: Any, send: list[int]) -> Handle:
        def pieces(buf: Any, counts: list[int]) -> list[tuple[int, Any]]:
            starts = np.concatenate([[0], np.cumsum(counts)]).astype(int)
            return [(i, buf[starts[i] : starts[i + 1]]) for i in range(self.size)]

        return self._exchange(pieces(inp, send), pieces(out, recv))

    def _lib_send(self, buf: Any, peer: int, tag: int) -> Handle:
        return self._exchange([(peer, buf)], [])

    def _lib_recv(self, buf: Any, peer: int | None, tag: int) -> tuple[Handle, Callable[[], int]]:
        if peer is None:
            raise ValueError("recv(src=None): NCCL has no receive from any source; name src")
        return self._exchange([], [(peer, buf)]), lambda: peer

    def _lib_batch(self, ops: list[tuple[str, Any, int, int]]) -> list[Handle]:
        """Point-to-point operations in one NCCL group: they progress together, so pairs of
        ranks that send to each other first do not wait on each other."""
        sends = [(peer, buf) for kind, buf, peer, _ in ops if kind == "send"]
        recvs = [(peer, buf) for kind, buf, peer, _ in ops if kind == "recv"]
        return [self._exchange(sends, recvs)] * len(ops)

    def _lib_barrier(self) -> Handle:
        one = torch.zeros(1, device=self.device)
        self._lib_all_reduce(one, ReduceOp.SUM)
        return self._handle(self._stream(), host_sync=True)

    def destroy(self) -> None:
        if self.comm is not None:
            self.comm.destroy()
            self.comm = None
