"""The process world of torch's backends: ``torch.distributed.init_process_group`` and its groups."""

from __future__ import annotations

import datetime
import inspect
from typing import Any, Callable, Sequence

import torch
import torch.distributed as td

from simdist.core import GroupMember
from simdist.core import ProcessWorld, set_process_world

from ._group import TorchGroup

__all__ = ["TorchWorld", "GlooWorld", "TorchNcclWorld", "MpiWorld"]


class TorchWorld(ProcessWorld):
    """This process's place in a job whose groups are torch.distributed groups.

    Subclasses name simdist's backend (``name``) and torch's (``torch_backend``).
    """

    name = "?"
    torch_backend = "?"

    @classmethod
    def spawn(cls, fn: Callable, args: tuple, nprocs: int, **options: Any) -> list:
        """The values of ``fn(rank, *args)`` on ``nprocs`` processes of this machine, each with torchrun's
        environment: the socket backend's launcher (:func:`simdist.backends.socket.spawn`) starts them."""
        from simdist.backends.socket import spawn

        return spawn(fn, args, nprocs, **options)

    def __init__(self) -> None:
        self.groups: list[TorchGroup] = []
        self.group_count = 0

    requires: tuple[str, Any] | None = None
    """``(library, torch's check)`` where the backend needs torch built with a library."""

    @classmethod
    def check_available(cls) -> None:
        """``RuntimeError`` saying so if this build of torch lacks the backend."""
        if cls.requires is not None and not cls.requires[1]():
            raise RuntimeError(
                f"backend={cls.name!r} needs a build of torch with {cls.requires[0]}; this torch "
                "has none: use backend='gloo', or 'sim' to simulate"
            )

    def init(self, backend, *, init_method, timeout, world_size, rank, store) -> None:
        self.check_available()
        self.timeout = self.timeout_of(timeout)
        td.init_process_group(
            self.torch_backend,
            init_method=init_method,
            timeout=self._wait(),
            world_size=world_size,
            rank=rank,
            store=store,
        )
        self.rank, self.size, self.backend = td.get_rank(), td.get_world_size(), backend or self.name
        self.default_group = TorchGroup(self.name, td.group.WORLD, self.rank, range(self.size), 0)
        self.groups = [self.default_group]
        set_process_world(self)

    def _wait(self) -> datetime.timedelta:
        """:attr:`timeout` as torch takes it."""
        return datetime.timedelta(seconds=self.timeout)

    def new_group(self, ranks: Sequence[int], *, backend, timeout) -> Any:
        self.group_count += 1
        ranks = list(ranks)  # in group-rank order already: sorted, unless sort_ranks=False
        if ranks == sorted(ranks):
            pg = td.new_group(ranks, timeout=self._wait())
        elif "sort_ranks" in inspect.signature(td.new_group).parameters:  # keeps the given order when asked
            pg = td.new_group(ranks, timeout=self._wait(), sort_ranks=False)
        else:
            raise ValueError(
                f"new_group(ranks={ranks}, sort_ranks=False) on backend {self.name!r} needs torch's "
                f"new_group(sort_ranks=False), which torch {torch.__version__} lacks (it sorts every group's ranks): "
                "give the ranks in increasing order, or use backend 'socket' or 'sim'"
            )
        if self.rank not in ranks:
            return GroupMember.NON_GROUP_MEMBER
        group = TorchGroup(self.name, pg, ranks.index(self.rank), ranks, self.group_count)
        self.groups.append(group)
        return group

    def destroy(self, group) -> None:
        if self.destroy_subgroup(group):
            return
        # Rank 0 serves torch's store: leaving before the others have finished would break
        # their connections to it (torch's destroy_process_group does not wait).
        td.barrier()
        td.destroy_process_group()
        self.groups, self.default_group, self.backend = [], None, None
        set_process_world(None)


class GlooWorld(TorchWorld):
    """``backend="gloo"``: torch's gloo (CPU tensors; CUDA tensors are staged by gloo itself)."""

    name = torch_backend = "gloo"


class TorchNcclWorld(TorchWorld):
    """``backend="torch-nccl"``: torch's ProcessGroupNCCL for CUDA tensors, gloo for CPU tensors and numpy arrays."""

    name = "torch-nccl"
    torch_backend = "cpu:gloo,cuda:nccl"
    requires = ("NCCL", td.is_nccl_available)


class MpiWorld(TorchWorld):
    """``backend="mpi"``: torch's MPI backend (a torch built with MPI, ranks started by ``mpirun``)."""

    name = torch_backend = "mpi"
    needs_rendezvous = False  # mpirun tells each process its peers
    requires = ("MPI", td.is_mpi_available)  # pip's builds of torch have none
