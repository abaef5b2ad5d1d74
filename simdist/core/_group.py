"""The ``ProcessGroup`` interface that every backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, NamedTuple, Sequence

from ._reduce_op import ReduceOp
from ._work import Work

__all__ = ["ProcessGroup", "Options", "GroupMember", "group"]


class Options(NamedTuple):
    """Per-call options of one operation, built fresh for every call.

    Attributes:
        op: the reduction, for reducing collectives.
        root: the *group* rank of ``src``/``dst`` for rooted collectives.
        algorithm: the algorithm to use (``None``: the group's default, else automatic).
        async_op: whether the caller asked for an asynchronous work (checked across ranks).
        call_site: the user's ``file:line``, for reports and traces.
        tag: the user's tag, for point-to-point operations.
    """

    op: ReduceOp | None = None
    root: int | None = None
    algorithm: str | None = None
    async_op: bool | None = None
    call_site: str | None = None
    tag: int | None = None

    @property
    def root_rank(self) -> int:
        """``root``, for a rooted collective (the public functions always set it there)."""
        if self.root is None:
            raise ValueError("a rooted collective needs its root in Options.root")
        return self.root


class ProcessGroup(ABC):
    """A set of ranks that communicate; one object per rank.

    ``rank`` is this rank's position in the group, ``size`` the number of members and
    ``ranks`` their global ranks (``ranks[rank]`` is this rank's global rank). Ranks
    passed to the methods are *group* ranks; the public functions translate the global
    ranks users write. Every method returns a :class:`~simdist.Work`.
    """

    backend: str = "?"
    group_desc: str | None = None
    """The name the program gave the group (``new_group(..., group_desc="a")``, as in torch);
    reports call the group by it, else by its number."""
    destroyed: bool = False
    """Set by ``destroy_process_group``: later calls with the group raise a clear error."""

    def __init__(self, rank: int, ranks: Sequence[int], group_id: int = 0):
        self.rank = rank
        self.ranks = tuple(ranks)
        self.size = len(self.ranks)
        self.group_id = group_id
        self.default_algorithms: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.group_id} rank {self.rank} of ranks {list(self.ranks)}>"

    def global_rank(self, group_rank: int) -> int:
        return self.ranks[group_rank]

    def group_rank(self, global_rank: int) -> int | None:
        try:
            return self.ranks.index(global_rank)
        except ValueError:
            return None

    def set_default_algorithm(self, op: str, algorithm: str | None) -> None:
        """Use ``algorithm`` for every ``op`` on this group that does not name one (``None``: automatic).

        A group that runs simdist's algorithms checks the name first (``AlgorithmicGroup``); a library's group
        keeps it and warns at the call that the library picks its own."""
        if algorithm is None:
            self.default_algorithms.pop(op, None)
        else:
            self.default_algorithms[op] = algorithm

    # point to point
    @abstractmethod
    def send(self, tensor: Any, dst: int, opts: Options) -> Work: ...

    @abstractmethod
    def recv(self, tensor: Any, src: int | None, opts: Options) -> Work: ...

    # collectives
    @abstractmethod
    def broadcast(self, tensor: Any, opts: Options) -> Work: ...

    @abstractmethod
    def all_reduce(self, tensor: Any, opts: Options) -> Work: ...

    @abstractmethod
    def reduce(self, tensor: Any, opts: Options) -> Work: ...

    @abstractmethod
    def all_gather(self, output_list: list, tensor: Any, opts: Options) -> Work: ...

    @abstractmethod
    def all_gather_into_tensor(self, output: Any, input: Any, opts: Options) -> Work: ...

    @abstractmethod
    def gather(self, tensor: Any, gather_list: list | None, opts: Options) -> Work: ...

    @abstractmethod
    def scatter(self, tensor: Any, scatter_list: list | None, opts: Options) -> Work: ...

    @abstractmethod
    def reduce_scatter(self, output: Any, input_list: list, opts: Options) -> Work: ...

    @abstractmethod
    def reduce_scatter_tensor(self, output: Any, input: Any, opts: Options) -> Work: ...

    @abstractmethod
    def all_to_all(self, output_list: list, input_list: list, opts: Options) -> Work: ...

    @abstractmethod
    def all_to_all_single(
        self,
        output: Any,
        input: Any,
        output_split_sizes: Sequence[int] | None,
        input_split_sizes: Sequence[int] | None,
        opts: Options,
    ) -> Work: ...

    @abstractmethod
    def barrier(self, opts: Options) -> Work: ...

    def batch_p2p(self, ops: Sequence[tuple[str, Any, int, Options]]) -> list[Work]:
        """Start ``(kind, tensor, peer, opts)`` sends and receives together (``kind``: ``'send'``/``'recv'``).

        Here: one after the other, which is together for backends whose operations never block.
        """
        return [self.send(t, peer, opts) if kind == "send" else self.recv(t, peer, opts) for kind, t, peer, opts in ops]

    def destroy(self) -> None:
        """Release what the group holds (connections, buffers)."""


class GroupMember:
    """Sentinels, as ``torch.distributed.GroupMember``.

    ``NON_GROUP_MEMBER`` is what :func:`~simdist.new_group` returns on ranks outside the
    new group; passing it to an operation makes that operation a no-op returning ``None``.
    ``WORLD`` stands for the default group (as ``group=None``).
    """

    WORLD: Any = None
    NON_GROUP_MEMBER: Any = object()


class group:  # noqa: N801 - torch's name
    """``simdist.group.WORLD``: the default group, as ``torch.distributed.group.WORLD``."""

    WORLD: Any = None
