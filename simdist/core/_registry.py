"""Backends by name (a registry that imports nothing heavy until a backend is used), and the environment
simdist's launchers give a rank process: its backend, the job's store, a free port for one."""

from __future__ import annotations

import importlib
import importlib.util
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._world import World

__all__ = [
    "BACKEND_ENV", "SERVED_ENV", "STORE_ENV", "TORCH_NAMES", "BackendSpec", "backend_names", "backend_spec",
    "free_port", "register_backend",
]  # fmt: skip

BACKEND_ENV = "SIMDIST_BACKEND"
"""Set by simdist's launchers: ``init_process_group`` binds to this backend whatever name the code gives."""

STORE_ENV = "SIMDIST_STORE"
"""``HOST:PORT`` of the job's store for ``env://``, set by simdist's launchers. ``MASTER_ADDR`` and
``MASTER_PORT`` then stay what torchrun makes them: the address where a torch program's own
``TCPStore`` listens, so a torch program and simdist's store never compete for a port. Unset,
``env://`` means ``MASTER_ADDR:MASTER_PORT``, as for torch."""

SERVED_ENV = "SIMDIST_STORE_SERVED"
"""Set by a launcher that serves the job's store itself (``simdist run``): ``HOST:PORT``. Rank 0
then serves none at that address, and the store outlives every rank, so the launcher reads the
job's failures after the ranks are gone."""

TORCH_NAMES = ("gloo", "nccl", "mpi", "ucc", "cpu:gloo,cuda:nccl")
"""Backend names of torch.distributed. Inside a simulation they all bind to the simulator."""


def free_port() -> int:
    """A TCP port on loopback that was free a moment ago (for a job's store or ``MASTER_PORT``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class BackendSpec:
    """One registered backend.

    Attributes:
        name: the name users pass (``'sim'``).
        target: ``'module:attribute'`` of its factory, imported on first use.
        requires: modules that must be importable for the backend to be available.
        description: one line for error messages and docs.
    """

    name: str
    target: str
    requires: tuple[str, ...] = ()
    description: str = ""

    def available(self) -> bool:
        """Whether every required module can be imported (checked without importing it)."""
        return all(importlib.util.find_spec(m) is not None for m in self.requires)

    def load(self) -> type[World]:
        """The backend's ``World`` subclass, imported now; ``ValueError`` if the target is not one."""
        from ._world import World

        module, _, attr = self.target.partition(":")
        target = getattr(importlib.import_module(module), attr)
        if not (isinstance(target, type) and issubclass(target, World)):
            raise ValueError(
                f"backend {self.name!r} is registered as {self.target!r}, which is {target!r}, "
                "not a simdist World subclass"
            )
        return target


_REGISTRY: dict[str, BackendSpec] = {}


def register_backend(spec: BackendSpec, *, replace: bool = False) -> None:
    """Add a backend; ``ValueError`` for a duplicate name unless ``replace``."""
    if not isinstance(spec, BackendSpec):
        raise TypeError(f"spec must be a BackendSpec, got {type(spec).__name__}")
    if spec.name in _REGISTRY and not replace:
        raise ValueError(f"backend {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec


def backend_spec(name: str) -> BackendSpec:
    """The backend registered as ``name``; ``ValueError`` listing the names otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"backend={name!r} is not a known backend; expected one of {backend_names()}") from None


def backend_names() -> list[str]:
    return sorted(_REGISTRY)


register_backend(BackendSpec("sim", "simdist.backends.sim:SimWorld", (), "the deterministic in-process simulator"))
register_backend(BackendSpec("socket", "simdist.backends.socket:SocketWorld", (), "real processes over TCP"))
register_backend(BackendSpec("nccl", "simdist.backends.nccl:NcclWorld", ("cupy",), "NCCL on GPUs, through cupy"))
register_backend(BackendSpec("gloo", "simdist.backends.torchdist:GlooWorld", (), "torch.distributed's gloo"))
register_backend(
    BackendSpec(
        "torch-nccl",
        "simdist.backends.torchdist:TorchNcclWorld",
        (),
        "torch.distributed's NCCL for CUDA tensors (gloo for CPU tensors)",
    )
)
register_backend(BackendSpec("mpi", "simdist.backends.torchdist:MpiWorld", (), "torch.distributed's MPI"))
