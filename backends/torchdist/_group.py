"""``TorchGroup``: a simdist ProcessGroup whose primitives are torch.distributed calls on one torch group."""

from __future__ import annotations

import datetime
from typing import Any, Callable, Sequence

import torch
import torch.distributed as td

from simdist.core import arrays as A
from simdist.core import Handle, LibraryGroup
from simdist.core import ReduceOp

__all__ = ["TorchGroup", "TorchHandle"]

# torch 2.13 renamed the *_tensor collectives to *_single; older versions have only the old names.
_all_gather = getattr(td, "all_gather_single", None) or td.all_gather_into_tensor
_reduce_scatter = getattr(td, "reduce_scatter_single", None) or td.reduce_scatter_tensor

_TORCH_OPS = {op: getattr(td.ReduceOp, "PRODUCT" if op is ReduceOp.PRODUCT else op.name) for op in ReduceOp}

_GLOO_DTYPES = {
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
    torch.bool,
}
_NCCL_DTYPES = _GLOO_DTYPES  # the same dtypes in torch's two backends
_MPI_DTYPES = {torch.float32, torch.float64, torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64}
_ARITHMETIC = {ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX}
_COMPLEX = {torch.complex64, torch.complex128}


def gloo_reduces(dtype: torch.dtype, op: ReduceOp) -> bool:
    """What torch's gloo reduces itself (measured on torch 2.13: no int16; complex only sums and averages)."""
    if dtype in _COMPLEX:
        return op in (ReduceOp.SUM, ReduceOp.AVG)
    return dtype in _GLOO_DTYPES


def nccl_reduces(dtype: torch.dtype, op: ReduceOp) -> bool:
    """NCCL's own reductions: sum, average, product, min and max on its numeric types; no bitwise ops."""
    if dtype in _COMPLEX:
        return op in (ReduceOp.SUM, ReduceOp.AVG)
    return dtype in _NCCL_DTYPES and op in _ARITHMETIC


def mpi_reduces(dtype: torch.dtype, op: ReduceOp) -> bool:
    """torch's MPI backend: MPI's predefined types and reductions, which have no average."""
    return dtype in _MPI_DTYPES and op is not ReduceOp.AVG


class TorchHandle:
    """A torch ``Work`` seen as a :class:`~simdist.core._library.Handle`."""

    def __init__(self, work: Any):
        self.work = work

    def wait(self, timeout: float | None = None) -> None:
        if timeout is None:
            self.work.wait()
        else:
            self.work.wait(datetime.timedelta(seconds=timeout))

    def is_completed(self) -> bool:
        return self.work.is_completed()


class TorchGroup(LibraryGroup):
    """One rank's handle on a torch.distributed group ``pg`` whose members are global ``ranks``.

    ``backend`` is simdist's name (``'gloo'``, ``'torch-nccl'``, ``'mpi'``). torch takes global
    ranks for roots and peers; simdist passes group ranks, translated here.
    """

    def __init__(self, backend: str, pg: Any, rank: int, ranks: Sequence[int], group_id: int):
        super().__init__(rank, ranks, group_id)
        self.backend = backend
        self.pg = pg

    def library_buffer(self, flat: Any, written: bool) -> tuple[Any, Callable[[], None] | None]:
        return A.as_tensor(flat), None

    def library_reduces(self, buf: Any, op: ReduceOp) -> bool:
        if self.backend == "mpi":
            return mpi_reduces(buf.dtype, op)
        if buf.device.type == "cuda":
            return nccl_reduces(buf.dtype, op)
        return gloo_reduces(buf.dtype, op)

    def _blocks(self, buf: Any) -> list:
        n = buf.numel() // self.size
        return [buf[i * n : (i + 1) * n] for i in range(self.size)]

    def _lib_all_reduce(self, buf: Any, op: ReduceOp) -> Handle:
        return TorchHandle(td.all_reduce(buf, _TORCH_OPS[op], group=self.pg, async_op=True))

    def _lib_broadcast(self, buf: Any, root: int) -> Handle:
        return TorchHandle(td.broadcast(buf, self.ranks[root], group=self.pg, async_op=True))

    def _lib_reduce(self, buf: Any, op: ReduceOp, root: int) -> Handle:
        target = buf if self.rank == root else buf.clone()  # gloo writes into the other ranks' tensors
        return TorchHandle(td.reduce(target, self.ranks[root], _TORCH_OPS[op], group=self.pg, async_op=True))

    def _lib_all_gather(self, out: Any, inp: Any) -> Handle:
        return TorchHandle(_all_gather(out, inp, group=self.pg, async_op=True))

    def _lib_reduce_scatter(self, out: Any, inp: Any, op: ReduceOp) -> Handle:
        return TorchHandle(_reduce_scatter(out, inp, _TORCH_OPS[op], group=self.pg, async_op=True))

    def _lib_gather(self, out: Any | None, inp: Any, root: int) -> Handle:
        blocks = self._blocks(out) if out is not None else None
        return TorchHandle(td.gather(inp, blocks, self.ranks[root], group=self.pg, async_op=True))

    def _lib_scatter(self, out: Any, inp: Any | None, root: int) -> Handle:
        blocks = self._blocks(inp) if inp is not None else None
        return TorchHandle(td.scatter(out, blocks, self.ranks[root], group=self.pg, async_op=True))

    def _lib_all_to_all(self, out: Any, recv: list[int], inp: Any, send: list[int]) -> Handle:
        if len(set(recv)) == 1 and len(set(send)) == 1:  # equal blocks: torch's faster path without splits
            recv = send = None
        return TorchHandle(td.all_to_all_single(out, inp, recv, send, group=self.pg, async_op=True))

    def _lib_send(self, buf: Any, peer: int, tag: int) -> Handle:
        return TorchHandle(td.isend(buf, self.ranks[peer], group=self.pg, tag=tag))

    def _lib_recv(self, buf: Any, peer: int | None, tag: int) -> tuple[Handle, Callable[[], int]]:
        work = td.irecv(buf, None if peer is None else self.ranks[peer], group=self.pg, tag=tag)
        return TorchHandle(work), (lambda: work._source_rank()) if peer is None else (lambda: peer)

    def _lib_batch(self, ops: list[tuple[str, Any, int, int]]) -> list[Handle]:
        p2p = [
            td.P2POp(td.isend if kind == "send" else td.irecv, buf, self.ranks[peer], self.pg, tag)
            for kind, buf, peer, tag in ops
        ]
        return [TorchHandle(w) for w in td.batch_isend_irecv(p2p)]

    def _lib_barrier(self) -> Handle:
        return TorchHandle(td.barrier(group=self.pg, async_op=True))

    def destroy(self) -> None:
        if self.group_id != 0 and self.pg is not None:
            td.destroy_process_group(self.pg)
            self.pg = None
