"""Groups made several at a time: ``new_subgroups`` (equal blocks of ranks) and ``split_group``."""

from __future__ import annotations

from typing import Any

import torch

from ._setup import get_process_group_ranks, get_world_size, new_group
from ..core._checks import check_int, resolve
from ..core._entry import library_call
from ..core._group import ProcessGroup

__all__ = ["new_subgroups", "split_group"]


@library_call
def new_subgroups(
    group_size: int | None = None,
    group: Any = None,
    timeout: Any = None,
    backend: str | None = None,
    pg_options: Any = None,
    group_desc: str | None = None,
) -> tuple[Any, list[Any]]:
    """Split ``group``'s ranks into consecutive blocks of ``group_size``: a group per block, as torch does.

    Every rank of the world calls it (each block is made by ``new_group``). Block ``i`` holds
    the ranks ``i * group_size`` to ``(i + 1) * group_size - 1`` of ``group``, in its order.

    Args:
        group_size: the ranks per block; it must divide ``group``'s size. ``None`` is the
            number of (simulated) GPUs, ``torch.cuda.device_count()``, where CUDA is available.
        group: the group to split, from ``new_group``; ``None`` is the default group.
        timeout: the process backend's timeout; ignored by the simulator.
        backend: each block's backend, for process worlds that mix backends.
        pg_options: accepted for torch's signature.
        group_desc: a name for the blocks in reports and traces.

    Returns:
        ``(this rank's block, every block)``: the block is a ``ProcessGroup``, and in the list
        the blocks this rank is not in are ``GroupMember.NON_GROUP_MEMBER``.

    Raises:
        NotInitializedError: before ``init_process_group``.
        ValueError: ``group_size`` is ``None`` without CUDA, not positive, larger than the
            group or does not divide its size (torch's messages).

    Example:
        >>> import simdist, torch
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     mine, blocks = simdist.new_subgroups(group_size=2)
        ...     t = torch.tensor([rank])
        ...     simdist.all_reduce(t, group=mine)
        ...     return int(t), len(blocks)
        >>> simdist.simulate(fn, 4).values
        [(1, 2), (1, 2), (5, 2), (5, 2)]
    """
    if group_size is None:
        if not torch.cuda.is_available():
            raise ValueError(
                "Default group size only takes effect when CUDA is available."
                "If your subgroup using a backend that does not depend on CUDA,"
                "please pass in 'group_size' correctly."
            )
        group_size = torch.cuda.device_count()
    group_size = check_int(group_size, "group_size")
    if group_size <= 0:
        raise ValueError(f"The arg 'group_size' ({group_size}) must be positive")
    world_size = get_world_size(group=group)
    if world_size < group_size:
        raise ValueError(f"The arg 'group_size' ({group_size}) must not exceed the world size ({world_size})")
    if world_size % group_size != 0:
        raise ValueError(f"The world size ({world_size}) must be divisible by '{group_size=}'")
    ranks = get_process_group_ranks(group)
    blocks = [ranks[i : i + group_size] for i in range(0, len(ranks), group_size)]
    subgroups = [
        new_group(block, timeout=timeout, backend=backend, pg_options=pg_options, group_desc=group_desc)
        for block in blocks
    ]
    mine = next((g for g in subgroups if isinstance(g, ProcessGroup)), None)
    return mine, subgroups


@library_call
def split_group(
    parent_pg: Any = None,
    split_ranks: list | None = None,
    timeout: Any = None,
    pg_options: Any = None,
    group_desc: str | None = None,
    backend: str | None = None,
) -> ProcessGroup | None:
    """This rank's group of ``split_ranks`` (lists of the default group's ranks, one per new group); ``None`` if in none.

    Every rank of the world calls it with the same ``split_ranks``; the groups must not overlap,
    and a rank in no list gets ``None``, as in torch. Each list's ranks are numbered in sorted
    order. Unlike torch, whose ``split_group`` needs a device-bound NCCL group, it works on
    every backend (each group is made by ``new_group``); a parent other than the default group
    is not supported (a ``NotImplementedError``), since simdist's groups are made by every rank.

    Args:
        parent_pg: ``None`` (or the default group): the group to split.
        split_ranks: a list of lists of ranks, one per new group.
        timeout: the process backend's timeout; ignored by the simulator.
        pg_options: accepted for torch's signature.
        group_desc: a name for the new groups in reports and traces.
        backend: the new groups' backend, for process worlds that mix backends.

    Returns:
        The ``ProcessGroup`` of the list holding this rank, or ``None``.

    Raises:
        NotInitializedError: before ``init_process_group``.
        NotImplementedError: ``parent_pg`` is a group other than the default group.
        ValueError: ``split_ranks`` is ``None`` or empty, or a list is empty, too long, names a
            rank twice or a rank another list names.

    Example:
        >>> import simdist, torch
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     pair = simdist.split_group(split_ranks=[[0, 1], [2, 3]])
        ...     t = torch.tensor([rank])
        ...     simdist.all_reduce(t, group=pair)
        ...     return int(t)
        >>> simdist.simulate(fn, 4).values
        [1, 1, 5, 5]
    """
    if split_ranks is None or len(split_ranks) == 0:
        raise ValueError("split_ranks cannot be None or empty")
    world, parent = resolve("split_group", parent_pg)
    if parent is not world.default_group:
        raise NotImplementedError(
            "split_group of a group other than the default group: simdist makes every group on every rank of the "
            "world; call split_group(split_ranks=...) with the default group's ranks, or new_group per group"
        )
    seen: dict[int, list] = {}
    for ranks in split_ranks:
        if len(ranks) == 0:
            raise ValueError("the split group cannot be empty")
        if len(ranks) > world.size:
            raise ValueError(
                "the split group's size should be less or equal to the world_size set by init_process_group"
            )
        if len(ranks) != len(set(ranks)):
            raise ValueError("the split group cannot have duplicate ranks")
        for r in ranks:
            if r in seen:
                raise ValueError(f"rank {r} is in two split groups, {seen[r]} and {list(ranks)}")
            seen[r] = list(ranks)
    groups = [
        new_group(sorted(ranks), timeout=timeout, backend=backend, pg_options=pg_options, group_desc=group_desc)
        for ranks in split_ranks
    ]
    return next((g for g in groups if isinstance(g, ProcessGroup)), None)
