"""The torch.distributed-compatible set-up: the process group, groups, ranks, and virtual compute.

Every function resolves the world, then the group, checks its arguments, then calls the
group. Point-to-point operations are in :mod:`._p2p`, collectives in :mod:`._collectives`;
:mod:`simdist.api` (and ``simdist``) exports all three.
"""

from __future__ import annotations

import os

from typing import Any, Sequence

from ..core._callsite import user_call_site
from ..core._entry import library_call
from ..core._checks import check_int, resolve, to_group_rank
from ..core._group import GroupMember, ProcessGroup
from ..core._registry import BACKEND_ENV, backend_spec
from ..core._world import current_world, require_world

__all__ = [
    "init_process_group",
    "is_available",
    "is_initialized",
    "destroy_process_group",
    "get_rank",
    "get_world_size",
    "get_backend",
    "new_group",
    "get_process_group_ranks",
    "get_global_rank",
    "get_group_rank",
    "compute",
]


@library_call
def init_process_group(
    backend: str | None = None,
    init_method: str | None = None,
    timeout: Any = None,
    world_size: int = -1,
    rank: int = -1,
    store: Any = None,
    group_name: str = "",
    pg_options: Any = None,
    device_id: Any = None,
) -> None:
    """Create the default process group of all ranks; afterwards the calling rank may communicate.

    Inside a simulated rank (``simdist.spawn(..., backend="sim")`` or ``simdist.simulate``) the
    group always binds to the simulator, whatever backend it names, so code written for
    ``"gloo"`` or ``"nccl"`` runs unchanged; ``rank`` and ``world_size``, if given, must match
    the simulated rank.

    In a process, the launcher's backend (``SIMDIST_BACKEND``, set by ``simdist run`` and
    ``simdist.spawn``) wins, else ``backend`` names one: ``"socket"``, ``"nccl"`` (GPUs, through
    cupy), or torch's own ``"gloo"``, ``"torch-nccl"``, ``"mpi"``. Rendezvous is ``env://``
    (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE) or ``init_method="tcp://host:port"``.

    Args:
        backend: a backend name; on the simulator any known name (it is what ``get_backend``
            then answers).
        init_method: ``"env://"`` (default) or ``"tcp://host:port"``, for process backends.
        timeout: the process backend's timeout (a ``timedelta`` or seconds); the simulator
            ignores it (see ``simulate``'s ``timeout``).
        world_size: the number of ranks, or -1 to take it from the launcher.
        rank: this process's rank, or -1 to take it from the launcher.
        store: a rendezvous store, for process backends.
        group_name: accepted for torch's signature.
        pg_options: accepted for torch's signature.
        device_id: accepted for torch's signature.

    Raises:
        TypeError: ``backend`` is not a str, or ``rank``/``world_size`` not an int.
        ValueError: double initialization, a bad ``rank``/``world_size`` or an unknown backend.
        RuntimeError: a process that nothing launched (no MASTER_ADDR, no ``init_method``), or a
            backend this machine cannot run (``"nccl"`` without a GPU), with the reason.

    Example:
        >>> import simdist
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     return simdist.is_initialized(), simdist.get_rank(), simdist.get_world_size()
        >>> simdist.simulate(fn, 2).values
        [(True, 0, 2), (True, 1, 2)]
    """
    if backend is not None and not isinstance(backend, str):
        raise TypeError(
            f"backend must be a str such as 'gloo' or 'sim', got {type(backend).__name__} ({backend!r:.60})"
        )
    world_size = check_int(world_size, "world_size")
    rank = check_int(rank, "rank")
    if world_size != -1 and world_size < 1:
        raise ValueError(f"world_size={world_size} must be positive (or -1 to take it from the environment)")
    if rank != -1 and (rank < 0 or (world_size > 0 and rank >= world_size)):
        raise ValueError(f"rank={rank} is out of range for world_size={world_size}")
    world = current_world()
    if world is not None and world.initialized:
        raise ValueError("trying to initialize the default process group twice (call destroy_process_group first)")
    if world is None:
        world = _process_world(backend, init_method, store)
    world.init(backend, init_method=init_method, timeout=timeout, world_size=world_size, rank=rank, store=store)


def _process_world(backend: str | None, init_method: str | None, store: Any) -> Any:
    """A new world for this process: the launcher's backend (``SIMDIST_BACKEND``), else the one named."""
    name = os.environ.get(BACKEND_ENV) or backend
    launched = init_method not in (None, "env://") or store is not None or "MASTER_ADDR" in os.environ
    if name is not None:
        world_type = backend_spec(name).load()  # ValueError naming the known backends
        if (launched or not world_type.needs_rendezvous) and world_type.process_world:
            return world_type()
    raise RuntimeError(
        f"init_process_group(backend={backend!r}) was called outside a simulation, and nothing launched this "
        "process as a rank (no MASTER_ADDR in the environment, no init_method): run the function on simulated "
        "ranks with simdist.spawn(fn, args=(world_size,), nprocs=world_size, backend='sim') or "
        "simdist.simulate(fn, nprocs), or start real processes with `simdist run --backend socket script.py` "
        "(or 'gloo', 'nccl', ...), simdist.spawn(..., backend='socket') or torchrun"
    )


@library_call
def is_available() -> bool:
    """Always ``True``: simdist's collectives are available on every platform (as torch's check).

    Returns:
        ``True``.

    Example:
        >>> import simdist
        >>> simdist.is_available()
        True
    """
    return True


def is_initialized() -> bool:
    """Whether the calling rank's default process group has been initialized (and not destroyed).

    Each simulated rank answers for itself; outside a simulation it answers for the process.

    Returns:
        ``True`` between ``init_process_group`` and ``destroy_process_group``, else ``False``.

    Example:
        >>> import simdist
        >>> def fn(rank):
        ...     before = simdist.is_initialized()
        ...     simdist.init_process_group("gloo")
        ...     during = simdist.is_initialized()
        ...     simdist.destroy_process_group()
        ...     return before, during, simdist.is_initialized()
        >>> simdist.simulate(fn, 2).values
        [(False, True, False), (False, True, False)]
    """
    world = current_world()
    return world is not None and world.initialized


@library_call
def destroy_process_group(group: Any = None) -> None:
    """Destroy ``group``, or the default group and every group when ``group`` is ``None``.

    A destroyed group refuses later calls with a ``ValueError``; after destroying the default
    group, ``init_process_group`` may be called again. On a rank outside ``group``
    (``GroupMember.NON_GROUP_MEMBER``) it does nothing.

    Args:
        group: a group from ``new_group``, or ``None`` for the default group and all others.

    Raises:
        NotInitializedError: before ``init_process_group``.
        TypeError: ``group`` is not a group.
        ValueError: ``group`` was destroyed already.

    Example:
        >>> import simdist
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     pair = simdist.new_group([0, 1])
        ...     simdist.destroy_process_group(pair)
        ...     try:
        ...         simdist.barrier(group=pair)
        ...     except ValueError:
        ...         return "destroyed"
        >>> simdist.simulate(fn, 2).values
        ['destroyed', 'destroyed']
    """
    world = require_world("destroy_process_group")
    if group is GroupMember.NON_GROUP_MEMBER:
        return
    if group is None or group is world.default_group:
        doomed = [g for g in (world.default_group, *world.groups) if g is not None]
    else:
        doomed = [g for g in (resolve("destroy_process_group", group)[1],) if g is not None]
    world.destroy(group)
    for g in doomed:
        g.destroyed = True  # later calls on it raise a clear error (see _checks.resolve)


@library_call
def get_rank(group: Any = None) -> int:
    """This rank's rank in ``group`` (the default group if ``None``); -1 if it is not a member.

    Args:
        group: a group from ``new_group``, ``GroupMember.WORLD`` or ``None``.

    Returns:
        The group rank, from 0; -1 on a rank outside ``group``.

    Raises:
        NotInitializedError: before ``init_process_group``.

    Example:
        >>> import simdist
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     upper = simdist.new_group([1, 2])
        ...     return simdist.get_rank(), simdist.get_rank(upper)
        >>> simdist.simulate(fn, 3).values
        [(0, -1), (1, 0), (2, 1)]
    """
    world = require_world("get_rank")
    if group is None or group is GroupMember.WORLD:
        return world.rank
    if group is GroupMember.NON_GROUP_MEMBER:
        return -1
    return group.rank


@library_call
def get_world_size(group: Any = None) -> int:
    """The number of ranks in ``group`` (the default group if ``None``); -1 if this rank is not a member.

    Args:
        group: a group from ``new_group``, ``GroupMember.WORLD`` or ``None``.

    Returns:
        The group's size; -1 on a rank outside ``group``.

    Raises:
        NotInitializedError: before ``init_process_group``.

    Example:
        >>> import simdist
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     upper = simdist.new_group([1, 2])
        ...     return simdist.get_world_size(), simdist.get_world_size(upper)
        >>> simdist.simulate(fn, 3).values
        [(3, -1), (3, 2), (3, 2)]
    """
    world = require_world("get_world_size")
    if group is None or group is GroupMember.WORLD:
        return world.size
    if group is GroupMember.NON_GROUP_MEMBER:
        return -1
    return group.size


@library_call
def get_backend(group: Any = None) -> str:
    """The backend name given to ``init_process_group`` (``'sim'`` if none was given), the same for every group.

    On the simulator this is the name the program asked for (``"gloo"``), although the simulator
    runs it; torch would answer with the backend that runs.

    Args:
        group: a group from ``new_group`` or ``None``; every group answers the same.

    Returns:
        The backend's name.

    Raises:
        NotInitializedError: before ``init_process_group``.
        ValueError: ``group`` is ``GroupMember.NON_GROUP_MEMBER`` (this rank is not a member).

    Example:
        >>> import simdist
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     return simdist.get_backend()
        >>> simdist.simulate(fn, 2).values
        ['gloo', 'gloo']
    """
    world = require_world("get_backend")
    if group is GroupMember.NON_GROUP_MEMBER:
        raise ValueError("get_backend: group=GroupMember.NON_GROUP_MEMBER; this rank is not a member of the group")
    return world.backend or "sim"


@library_call
def new_group(
    ranks: Sequence[int] | None = None,
    timeout: Any = None,
    backend: str | None = None,
    pg_options: Any = None,
    use_local_synchronization: bool = False,
    group_desc: str | None = None,
    device_id: Any = None,
    sort_ranks: bool = True,
) -> Any:
    """A new group of the global ``ranks`` (all ranks if ``None``); ranks outside it get ``GroupMember.NON_GROUP_MEMBER``.

    Group ranks follow the sorted global ranks, as in torch, or the order of ``ranks`` when
    ``sort_ranks=False``. Every rank of the world must call ``new_group`` with the same ranks,
    in the same order as its other ``new_group`` calls (on the simulator a difference is a
    ``CollectiveMismatchError``). ``group_desc`` names the group in error reports and traces'
    views (``"group a"`` rather than ``"group 1"``).

    Args:
        ranks: global ranks, each once, or ``None`` for every rank.
        timeout: the process backend's timeout; ignored by the simulator.
        backend: the group's backend, for process worlds that mix backends.
        pg_options: accepted for torch's signature.
        use_local_synchronization: accepted for torch's signature.
        group_desc: a name for the group in reports and traces.
        device_id: accepted for torch's signature.
        sort_ranks: number the group's ranks in sorted order (default) or in the order given.

    Returns:
        The group (a ``ProcessGroup``) on its members; ``GroupMember.NON_GROUP_MEMBER`` elsewhere.

    Raises:
        NotInitializedError: before ``init_process_group``.
        TypeError: ``ranks`` is not a list of ints, or ``group_desc`` not a str.
        ValueError: ``ranks`` is empty, names a rank twice or one outside the world.

    Example:
        >>> import simdist, torch
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     evens = simdist.new_group([0, 2])
        ...     t = torch.tensor([rank])
        ...     if rank % 2 == 0:
        ...         simdist.all_reduce(t, group=evens)
        ...     return int(t)
        >>> simdist.simulate(fn, 4).values
        [2, 1, 2, 3]
    """
    world = require_world("new_group")
    if group_desc is not None and not isinstance(group_desc, str):
        raise TypeError(
            f"group_desc must be a str naming the group, got {type(group_desc).__name__} ({group_desc!r:.60})"
        )
    if ranks is None:
        members = list(range(world.size))
    else:
        if not isinstance(ranks, (list, tuple, range)):
            raise TypeError(f"ranks must be a list of global ranks, got {type(ranks).__name__} ({ranks!r:.60})")
        members = [check_int(r, f"ranks[{i}]") for i, r in enumerate(ranks)]
        if sort_ranks:
            members.sort()
        bad = [r for r in members if not 0 <= r < world.size]
        if bad:
            raise ValueError(f"ranks={list(ranks)} has ranks {bad} outside 0..{world.size - 1}")
        if len(set(members)) != len(members):
            raise ValueError(f"ranks={list(ranks)} names a rank more than once")
        if not members:
            raise ValueError("ranks=[] is empty; a group needs at least one rank")
    group = world.new_group(members, backend=backend, timeout=timeout)
    if group_desc and isinstance(group, ProcessGroup):
        group.group_desc = group_desc
    return group


@library_call
def get_process_group_ranks(group: Any) -> list[int]:
    """The global ranks of ``group``, in group-rank order.

    Args:
        group: a group from ``new_group``, or ``None`` for the default group.

    Returns:
        A list of global ranks; ``[]`` on a rank outside ``group`` (with a ``UserWarning``).

    Raises:
        NotInitializedError: before ``init_process_group``.
        TypeError: ``group`` is not a group.
        ValueError: ``group`` was destroyed.

    Example:
        >>> import simdist
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     group = simdist.new_group([2, 0], sort_ranks=False)
        ...     return simdist.get_process_group_ranks(group) if rank != 1 else None
        >>> simdist.simulate(fn, 3).values
        [[2, 0], None, [2, 0]]
    """
    world, pg = resolve("get_process_group_ranks", group)
    return list(pg.ranks) if pg is not None else []


@library_call
def get_global_rank(group: Any, group_rank: int) -> int:
    """The global rank of ``group_rank`` in ``group``.

    Args:
        group: a group from ``new_group``, or ``None`` for the default group.
        group_rank: a rank of ``group``, from 0.

    Returns:
        The global rank.

    Raises:
        NotInitializedError: before ``init_process_group``.
        TypeError: ``group`` is not a group, or ``group_rank`` not an int.
        ValueError: ``group_rank`` is out of range, or this rank is not in ``group``.

    Example:
        >>> import simdist
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     upper = simdist.new_group([1, 2])
        ...     return simdist.get_global_rank(upper, 0) if rank > 0 else None
        >>> simdist.simulate(fn, 3).values
        [None, 1, 1]
    """
    _, pg = resolve("get_global_rank", group)
    g = check_int(group_rank, "group_rank")
    if pg is None or not 0 <= g < pg.size:
        raise ValueError(f"group_rank={g} is not a rank of the group")
    return pg.ranks[g]


@library_call
def get_group_rank(group: Any, global_rank: int) -> int:
    """The rank within ``group`` of global rank ``global_rank``.

    Args:
        group: a group from ``new_group``, or ``None`` for the default group.
        global_rank: a global rank that is a member of ``group``.

    Returns:
        Its group rank, from 0.

    Raises:
        NotInitializedError: before ``init_process_group``.
        TypeError: ``group`` is not a group, or ``global_rank`` not an int.
        ValueError: ``global_rank`` is out of range or not a member of ``group``, or ``group`` is
            ``NON_GROUP_MEMBER`` (this rank is outside it).

    Example:
        >>> import simdist
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     upper = simdist.new_group([1, 2])
        ...     return simdist.get_group_rank(upper, 2) if rank > 0 else None
        >>> simdist.simulate(fn, 3).values
        [None, 1, 1]
    """
    world, pg = resolve("get_group_rank", group)
    if pg is None:
        raise ValueError(
            "group is GroupMember.NON_GROUP_MEMBER (new_group's answer on a rank outside the new group): "
            "it has no group ranks to look up here"
        )
    return to_group_rank(world, pg, global_rank, "global_rank")


@library_call
def compute(seconds: float) -> None:
    """Annotate ``seconds`` of computation: a simulated rank's virtual clock advances by it.

    Outside a simulation it does nothing (real time passes on its own). It is not a scheduling
    point and needs no process group. The trace records it as a ``"compute"`` event.

    Args:
        seconds: a non-negative number of virtual seconds.

    Raises:
        TypeError: ``seconds`` is not a number.
        ValueError: ``seconds`` is negative or NaN.

    Example:
        >>> import simdist
        >>> def fn(rank):
        ...     simdist.compute(seconds=0.5 * (rank + 1))
        >>> simdist.simulate(fn, 2).time
        1.0
    """
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"seconds must be a number, got {type(seconds).__name__} ({seconds!r:.60})")
    if not seconds >= 0:
        raise ValueError(f"seconds={seconds!r} must be a non-negative number")
    world = current_world()
    if world is not None:
        world.compute(float(seconds), user_call_site())
