"""The process world of the NCCL backend: the socket backend's store, NCCL communicators."""

from __future__ import annotations

import socket
from typing import Any, Sequence

from simdist.core import set_process_world
from simdist.backends.socket import SocketWorld

from ._group import NcclGroup

__all__ = ["NcclWorld", "nccl_unavailable", "encode_unique_id", "decode_unique_id"]


def nccl_unavailable() -> str | None:
    """Why ``backend="nccl"`` cannot run here (``None`` if it can): no cupy or NCCL, no CUDA torch, no GPU."""
    try:
        from cupy.cuda import nccl  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - ImportError, or cupy failing to load NCCL's library
        return f"cupy's NCCL bindings are not importable ({type(exc).__name__}: {exc}); pip install 'simdist[nccl]' (CUDA 12) or 'simdist[nccl-cu13]' (CUDA 13)"
    import torch

    if not torch.cuda.is_available():
        return "torch sees no CUDA device (torch.cuda.is_available() is False)"
    return None


def encode_unique_id(uid: Sequence[int] | bytes) -> bytes:
    """NCCL's unique id as bytes for the store, from either form cupy gives: ``bytes`` (cupy 14 and
    newer) or a tuple of 128 signed chars (cupy 13 and older)."""
    return bytes(b & 0xFF for b in uid)


def decode_unique_id(data: bytes, cupy_major: int | None = None) -> bytes | tuple[int, ...]:
    """The unique id in the form ``NcclCommunicator`` of the installed cupy takes (``cupy_major``, default the
    installed one's): ``bytes`` from cupy 14 on, a tuple of signed chars before (``TypeError`` otherwise)."""
    if cupy_major is None:
        import cupy

        cupy_major = int(str(cupy.__version__).split(".")[0])
    if cupy_major >= 14:
        return bytes(data)
    return tuple(b - 256 if b > 127 else b for b in data)


class NcclWorld(SocketWorld):
    """This process's place in an NCCL job: the socket backend's store for rendezvous and
    unique ids, and one NCCL communicator per group on this process's current CUDA device."""

    def init(self, backend, *, init_method, timeout, world_size, rank, store) -> None:
        import torch

        reason = nccl_unavailable()
        if reason is not None:
            raise RuntimeError(
                f"backend='nccl' cannot run here: {reason}. Without a GPU, the same code runs "
                "on backend='sim' (simulated) or on real processes with 'socket' or 'gloo'"
            )
        self.timeout = self.timeout_of(timeout)
        _, _, rank, world_size, _ = self.connect_store(init_method, rank, world_size)
        self.rank, self.size, self.backend = rank, world_size, backend or "nccl"
        self.device = torch.device("cuda", torch.cuda.current_device())
        self._refuse_a_shared_gpu()
        self.default_group = self._group(list(range(world_size)), 0)
        self.groups = [self.default_group]
        set_process_world(self)

    def _group(self, ranks: list[int], group_id: int, timeout: float | None = None) -> NcclGroup:
        """A communicator of ``ranks``: the first member makes the unique id, the others read it; its host
        waits end after ``timeout`` seconds (``None``: the world's)."""
        from cupy.cuda import nccl

        key = f"simdist/nccl/{group_id}"
        if self.rank == ranks[0]:
            self.store.set(key, encode_unique_id(nccl.get_unique_id()))
        uid = decode_unique_id(self.store.get(key))
        with self._cuda_device():
            comm = nccl.NcclCommunicator(len(ranks), uid, ranks.index(self.rank))
        limit = self.timeout if timeout is None else timeout
        return NcclGroup(comm, self.device, ranks.index(self.rank), ranks, group_id, limit)

    def _refuse_a_shared_gpu(self) -> None:
        """Raise ``RuntimeError`` naming the ranks and the GPU when two ranks of the job are on one GPU.

        NCCL refuses that at its communicator's start with ``ncclInvalidUsage`` and says why only in
        its log ("Duplicate GPU detected"); the ranks publish their GPUs through the store first, so
        every rank gets the reason and the way forward.
        """
        self.store.set(f"simdist/nccl/gpu/{self.rank}", "\n".join(self._gpu_identity()).encode())
        keys = [f"simdist/nccl/gpu/{r}" for r in range(self.size)]
        self.store.wait(keys, timeout=self.timeout)
        gpus = self.store.multi_get(keys)
        first: dict[str, tuple[int, str]] = {}
        for r in range(self.size):
            gpu, name = gpus[keys[r]].decode().split("\n")
            if gpu in first:
                other, other_name = first[gpu]
                raise RuntimeError(
                    f"backend='nccl': ranks {other} and {r} are on one GPU ({other_name} of rank {other}, {name} of "
                    f"rank {r}); NCCL refuses two ranks of one communicator on one GPU (ncclInvalidUsage, "
                    "'Duplicate GPU detected'). Give each rank a GPU of its own (torch.cuda.set_device(local_rank) "
                    "before init_process_group), or run more ranks than GPUs on backend='sim'"
                )
            first[gpu] = (r, name)

    def _gpu_identity(self) -> tuple[str, str]:
        """This rank's GPU as NCCL tells GPUs apart (the host and the device's UUID), and its name for people."""
        import torch

        host = socket.gethostname()
        uuid = getattr(torch.cuda.get_device_properties(self.device), "uuid", None) or self.device.index
        return f"{host}/{uuid}", f"cuda:{self.device.index} of host {host}"

    def _cuda_device(self) -> Any:
        import torch

        return torch.cuda.device(self.device)

    def _close_network(self, failed: bool = False) -> None:
        """Nothing beyond the groups: NCCL's communicators are destroyed with them."""
