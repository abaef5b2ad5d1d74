"""The torch.distributed-compatible functions: set-up, point-to-point and collectives.

Every function resolves the world, then the group, checks its arguments, then calls
the group. Collectives wait for their Work unless ``async_op=True``, exactly like
torch. On a rank outside ``group`` an operation warns (``UserWarning``, as torch), does
nothing and returns ``None``. A collective's ``algorithm=`` picks one of simdist's
algorithms (``simdist.algorithms``) on the ``sim`` and ``socket`` backends; library
backends (NCCL, torch's) choose their own.
Ranks named by ``src``/``dst``/``peer`` are *global* ranks; ``group_src``/``group_dst``
name ranks within ``group``.
"""

from __future__ import annotations

import os

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from . import _arrays as A
from ._callsite import user_call_site
from ._entry import library_call
from ._checks import check_int, check_list, check_splits, resolve, root_of, same_kind, to_group_rank
from ._group import GroupMember, Options, ProcessGroup
from ._reduce_op import ReduceOp, as_reduce_op
from ._registry import BACKEND_ENV, backend_spec
from ._work import Work
from ._world import current_world, require_world

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
    "send",
    "recv",
    "isend",
    "irecv",
    "P2POp",
    "batch_isend_irecv",
    "broadcast",
    "all_reduce",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "gather",
    "scatter",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "compute",
]


# --- set-up ------------------------------------------------------------------------------


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


# --- point to point ------------------------------------------------------------------------


def _p2p(fn: str, tensor: Any, peer: Any, group: Any, tag: Any, group_peer: Any, kind: str) -> tuple:
    """Check a point-to-point call and start it: ``(group, work)``, or ``(None, None)`` outside the group."""
    pg, target, opts = _p2p_args(fn, tensor, peer, group, tag, group_peer, kind)
    if pg is None:
        return None, None
    return pg, (pg.send(tensor, target, opts) if kind == "send" else pg.recv(tensor, target, opts))


def _p2p_args(fn: str, tensor: Any, peer: Any, group: Any, tag: Any, group_peer: Any, kind: str) -> tuple:
    """The group, the peer's group rank and the Options of a checked point-to-point call."""
    world, pg = resolve(fn, group)
    A.check_array(tensor, "tensor")
    if kind == "recv":
        A.check_writable(tensor, "tensor")
    tag = check_int(tag, "tag", 0)
    if pg is None:
        return None, None, None
    argname = "dst" if kind == "send" else "src"
    if peer is None and group_peer is None:
        if kind == "send":
            raise ValueError(f"{fn}: dst=None; pass dst (a global rank) or group_dst (a rank of the group)")
        target = None
    else:
        target = root_of(world, pg, peer, group_peer, argname)
        if target == pg.rank:
            raise ValueError(f"{fn}: {argname}={pg.ranks[target]} is this rank itself; a rank cannot {kind} to itself")
    opts = Options(tag=tag, call_site=user_call_site(), async_op=fn in ("isend", "irecv"))
    return pg, target, opts


@library_call
def send(tensor: Any, dst: int | None = None, group: Any = None, tag: int = 0, group_dst: int | None = None) -> None:
    """Send ``tensor`` to global rank ``dst``; ``tensor`` is not modified.

    Blocks until the message is handed over: on the simulator, until ``dst`` has posted the
    matching receive (sends of at most ``simulate``'s ``eager_limit`` bytes return at once).
    Messages between one pair of ranks with one tag on one group arrive in send order.

    Args:
        tensor: the data: a torch tensor or numpy array; the receive must have its dtype and
            number of elements.
        dst: the receiver's global rank. Required unless ``group_dst`` is given.
        group: a group from ``new_group``; ``None`` is the default group.
        tag: a non-negative int; a send matches only a receive with the same tag.
        group_dst: ``dst`` as a rank of ``group``; pass one of ``dst`` and ``group_dst``.

    Raises:
        NotInitializedError: before ``init_process_group``.
        TypeError: ``tensor`` is not an array, or ``tag`` is not an int.
        ValueError: neither or both of ``dst`` and ``group_dst``, ``dst`` is this rank, out of
            range or not in ``group``, or ``tag`` is negative.
        DistError: on the simulator, when the matching receive has another dtype or size.
        DeadlockError: on the simulator, when no receive is ever posted and every rank waits.

    Example:
        >>> import simdist, torch
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     t = torch.arange(4) if rank == 0 else torch.zeros(4, dtype=torch.int64)
        ...     if rank == 0:
        ...         simdist.send(t, dst=1)
        ...     else:
        ...         simdist.recv(t, src=0)
        ...     return t
        >>> simdist.simulate(fn, 2).values
        [tensor([0, 1, 2, 3]), tensor([0, 1, 2, 3])]
    """
    _, work = _p2p("send", tensor, dst, group, tag, group_dst, "send")
    if work is not None:
        work.wait()


@library_call
def recv(tensor: Any, src: int | None = None, group: Any = None, tag: int = 0, group_src: int | None = None) -> int:
    """Receive into ``tensor`` (overwritten in place) from global rank ``src``, or from any rank; return the sender.

    With ``src=None`` the first matching message of any sender is taken; on the simulator which
    sender that is is a scheduler choice (another seed may pick another sender).

    Args:
        tensor: the output: a writable array of the send's dtype and number of elements.
        src: the sender's global rank, or ``None`` (with no ``group_src``) for any rank.
        group: a group from ``new_group``; ``None`` is the default group.
        tag: a non-negative int; only a send with the same tag matches.
        group_src: ``src`` as a rank of ``group``; pass at most one of ``src`` and ``group_src``.

    Returns:
        The sender's global rank; -1 on a rank outside ``group``.

    Raises:
        NotInitializedError: before ``init_process_group``.
        TypeError: ``tensor`` is not an array, or ``tag`` is not an int.
        ValueError: ``tensor`` is read-only; both ``src`` and ``group_src``; ``src`` is this rank,
            out of range or not in ``group``; ``tag`` is negative.
        DistError: on the simulator, when the matched send has another dtype or size.

    Example:
        >>> import simdist, torch
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     if rank > 0:
        ...         simdist.send(torch.tensor([rank]), dst=0)
        ...         return None
        ...     t = torch.zeros(1, dtype=torch.int64)
        ...     return sorted(simdist.recv(t) for _ in range(2))   # any source: ranks 1 and 2
        >>> simdist.simulate(fn, 3).values
        [[1, 2], None, None]
    """
    pg, work = _p2p("recv", tensor, src, group, tag, group_src, "recv")
    if work is None:
        return -1
    work.wait()
    return work.source_rank()


@library_call
def isend(
    tensor: Any, dst: int | None = None, group: Any = None, tag: int = 0, group_dst: int | None = None
) -> Work | None:
    """Start sending ``tensor`` to ``dst`` and return at once: a ``Work`` to ``wait()`` on.

    ``tensor`` must not be modified before ``work.wait()`` returns. On the simulator with
    ``check_buffers=True`` (as in ``simdist.testing``), such a write raises ``BufferRaceError``
    at ``wait()``; every ``Work`` must be waited on (else a ``LeakWarning`` at the end of
    ``simulate``).

    Args:
        tensor: the data: a torch tensor or numpy array.
        dst: the receiver's global rank. Required unless ``group_dst`` is given.
        group: a group from ``new_group``; ``None`` is the default group.
        tag: a non-negative int; a send matches only a receive with the same tag.
        group_dst: ``dst`` as a rank of ``group``; pass one of ``dst`` and ``group_dst``.

    Returns:
        A ``Work`` (``wait()``, ``is_completed()``); ``None`` on a rank outside ``group``.

    Raises:
        NotInitializedError: before ``init_process_group``.
        TypeError: ``tensor`` is not an array, or ``tag`` is not an int.
        ValueError: neither or both of ``dst`` and ``group_dst``, ``dst`` is this rank, out of
            range or not in ``group``, or ``tag`` is negative.

    Example:
        >>> import simdist, torch
        >>> def fn(rank):                     # two ranks swap tensors; neither blocks the other
        ...     simdist.init_process_group("gloo")
        ...     mine, theirs = torch.tensor([rank, rank]), torch.zeros(2, dtype=torch.int64)
        ...     works = [simdist.isend(mine, dst=1 - rank), simdist.irecv(theirs, src=1 - rank)]
        ...     for w in works:
        ...         w.wait()
        ...     return theirs
        >>> simdist.simulate(fn, 2).values
        [tensor([1, 1]), tensor([0, 0])]
    """
    return _p2p("isend", tensor, dst, group, tag, group_dst, "send")[1]


@library_call
def irecv(
    tensor: Any, src: int | None = None, group: Any = None, tag: int = 0, group_src: int | None = None
) -> Work | None:
    """Start receiving into ``tensor`` from ``src`` (any rank if ``None``) and return at once: a ``Work``.

    ``tensor`` holds the message, overwritten in place, once ``work.wait()`` returns; do not
    read or write it before. On the simulator with ``check_buffers=True`` (as in
    ``simdist.testing``), a write before then raises ``BufferRaceError`` at ``wait()``.
    ``work.source_rank()`` is the sender's global rank after the wait.

    Args:
        tensor: the output: a writable array of the send's dtype and number of elements.
        src: the sender's global rank, or ``None`` (with no ``group_src``) for any rank.
        group: a group from ``new_group``; ``None`` is the default group.
        tag: a non-negative int; only a send with the same tag matches.
        group_src: ``src`` as a rank of ``group``; pass at most one of ``src`` and ``group_src``.

    Returns:
        A ``Work`` (``wait()``, ``is_completed()``, ``source_rank()``); ``None`` on a rank outside
        ``group``.

    Raises:
        NotInitializedError: before ``init_process_group``.
        TypeError: ``tensor`` is not an array, or ``tag`` is not an int.
        ValueError: ``tensor`` is read-only; both ``src`` and ``group_src``; ``src`` is this rank,
            out of range or not in ``group``; ``tag`` is negative.

    Example:
        >>> import simdist, torch
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     if rank == 1:
        ...         simdist.send(torch.arange(4), dst=0)
        ...         return None
        ...     t = torch.zeros(4, dtype=torch.int64)
        ...     work = simdist.irecv(t)
        ...     work.wait()
        ...     return t, work.source_rank()
        >>> simdist.simulate(fn, 2).values
        [(tensor([0, 1, 2, 3]), 1), None]
    """
    return _p2p("irecv", tensor, src, group, tag, group_src, "recv")[1]


@dataclass
class P2POp:
    """One point-to-point operation for :func:`batch_isend_irecv`: ``op`` is ``isend`` or ``irecv``.

    Args:
        op: ``simdist.isend`` or ``simdist.irecv`` (the functions themselves).
        tensor: the data to send, or the writable array to receive into.
        peer: the other side's global rank (``dst`` of a send, ``src`` of a receive).
        group: a group from ``new_group``; ``None`` is the default group.
        tag: a non-negative int; sends and receives match by tag.
        group_peer: ``peer`` as a rank of ``group``; give ``peer`` or ``group_peer``.

    Raises:
        ValueError: ``op`` is neither function, or neither ``peer`` nor ``group_peer`` is given.
    """

    op: Callable
    tensor: Any
    peer: int | None = None
    group: Any = None
    tag: int = 0
    group_peer: int | None = None

    def __post_init__(self) -> None:
        if self.op not in (isend, irecv):
            raise ValueError(f"op={self.op!r} must be simdist.isend or simdist.irecv")
        if self.peer is None and self.group_peer is None:
            raise ValueError("P2POp: peer=None and group_peer=None; pass peer (a global rank) or group_peer")


@library_call
def batch_isend_irecv(p2p_op_list: Sequence[P2POp]) -> list[Work]:
    """Start every operation of ``p2p_op_list`` and return their works, to ``wait()`` on each.

    The operations on one group start together (on NCCL, in one NCCL group), so two ranks that
    each send to the other before receiving do not wait on each other. Receive buffers hold
    their messages once their works are waited on.

    Args:
        p2p_op_list: a non-empty list of :class:`P2POp`.

    Returns:
        One ``Work`` per operation on a group this rank belongs to, in the order of the list
        within each group (groups in order of first appearance).

    Raises:
        NotInitializedError: before ``init_process_group``.
        TypeError: an entry is not a ``P2POp``, or its tensor is not an array.
        ValueError: ``p2p_op_list`` is empty or not a list, or an entry fails the checks of
            ``isend``/``irecv`` (read-only receive buffer, peer is this rank, ...).

    Example:
        >>> import simdist, torch
        >>> def fn(rank):                     # a ring: send right, receive from the left
        ...     simdist.init_process_group("gloo")
        ...     right, left = (rank + 1) % 3, (rank - 1) % 3
        ...     got = torch.zeros(1, dtype=torch.int64)
        ...     ops = [simdist.P2POp(simdist.isend, torch.tensor([rank]), right),
        ...            simdist.P2POp(simdist.irecv, got, left)]
        ...     for work in simdist.batch_isend_irecv(ops):
        ...         work.wait()
        ...     return int(got)
        >>> simdist.simulate(fn, 3).values
        [2, 0, 1]
    """
    if not isinstance(p2p_op_list, (list, tuple)) or not p2p_op_list:
        raise ValueError(f"p2p_op_list must be a non-empty list of P2POp, got {p2p_op_list!r:.60}")
    for i, p in enumerate(p2p_op_list):
        if not isinstance(p, P2POp):
            raise TypeError(f"p2p_op_list[{i}] must be a P2POp, got {type(p).__name__} ({p!r:.60})")
    batches: dict[int, tuple[Any, list]] = {}  # per group, in the order of the list
    for p in p2p_op_list:
        fn, kind = ("isend", "send") if p.op is isend else ("irecv", "recv")
        pg, target, opts = _p2p_args(fn, p.tensor, p.peer, p.group, p.tag, p.group_peer, kind)
        if pg is not None:
            batches.setdefault(id(pg), (pg, []))[1].append((kind, p.tensor, target, opts))
    return [work for pg, ops in batches.values() for work in pg.batch_p2p(ops)]


# --- collectives ------------------------------------------------------------------------------


def _reduced_into(x: Any, argname: str, op: Any) -> ReduceOp:
    """``op`` as a ReduceOp, once ``x`` is checked as a writable array that ``op`` can reduce."""
    A.check_array(x, argname)
    A.check_writable(x, argname)
    op = as_reduce_op(op)
    A.check_reduce_op(x, op)
    return op


def _run(work: Work, async_op: bool) -> Work | None:
    if async_op:
        return work
    work.wait()
    return None


def _opts(async_op: Any, algorithm: str | None, **kw: Any) -> Options:
    if not isinstance(async_op, bool):
        raise TypeError(f"async_op must be a bool, got {type(async_op).__name__} ({async_op!r:.60})")
    if algorithm is not None and not isinstance(algorithm, str):
        raise TypeError(f"algorithm must be a str or None, got {type(algorithm).__name__} ({algorithm!r:.60})")
    return Options(async_op=async_op, algorithm=algorithm, call_site=user_call_site(), **kw)


@library_call
def broadcast(
    tensor: Any,
    src: int | None = None,
    group: Any = None,
    async_op: bool = False,
    group_src: int | None = None,
    *,
    algorithm: str | None = None,
) -> Work | None:
    """Copy rank ``src``'s ``tensor`` into ``tensor`` on every rank of the group, in place.

    Afterwards ``tensor`` is identical on every rank; ``src``'s own tensor is unchanged.

    Args:
        tensor: the data on ``src``; the output on the others (writable, the same dtype and
            shape on every rank).
        src: the global rank that sends. Required (unlike torch, ``None`` is not rank 0)
            unless ``group_src`` is given.
        group: a group from ``new_group``; ``None`` is the default group.
        async_op: return a ``Work`` at once instead of waiting.
        group_src: ``src`` as a rank of ``group``; pass one of ``src`` and ``group_src``.
        algorithm: a name from ``simdist.algorithms`` (``"binomial"``, ...); ``None`` lets the
            backend choose.

    Returns:
        A ``Work`` if ``async_op``, else ``None``; ``None`` on a rank outside ``group``.

    Raises:
        NotInitializedError: before ``init_process_group``.
        TypeError: ``tensor`` is not an array, or ``group``/``async_op``/``algorithm`` has the
            wrong type.
        ValueError: ``tensor`` is read-only; neither or both of ``src`` and ``group_src`` given;
            ``src`` is out of range or not in ``group``.
        CollectiveMismatchError: on the simulator, when the ranks' calls disagree (``src``
            included).

    Example:
        >>> import simdist, torch
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     t = torch.arange(4) if rank == 1 else torch.zeros(4, dtype=torch.int64)
        ...     simdist.broadcast(t, src=1)
        ...     return t
        >>> simdist.simulate(fn, 3).values
        [tensor([0, 1, 2, 3]), tensor([0, 1, 2, 3]), tensor([0, 1, 2, 3])]
    """
    world, pg = resolve("broadcast", group)
    A.check_array(tensor, "tensor")
    A.check_writable(tensor, "tensor")
    if pg is None:
        return None
    root = root_of(world, pg, src, group_src, "src", default=None)
    return _run(pg.broadcast(tensor, _opts(async_op, algorithm, root=root)), async_op)


@library_call
def all_reduce(
    tensor: Any, op: Any = ReduceOp.SUM, group: Any = None, async_op: bool = False, *, algorithm: str | None = None
) -> Work | None:
    """Reduce ``tensor`` across the group with ``op``: afterwards every rank holds the same result, in place.

    ``tensor`` is overwritten on every rank of ``group`` with the reduction of all the group's
    tensors (element-wise). Unlike torch, ``op`` may also be torch's ``ReduceOp`` or a name
    (``"max"``), and ``algorithm`` picks one of simdist's algorithms on the ``sim`` and
    ``socket`` backends (NCCL and torch's backends choose their own and warn once that it is
    ignored).

    Args:
        tensor: input and output: a writable torch tensor or numpy array, the same dtype and
            shape on every rank.
        op: a ``ReduceOp`` (default ``SUM``), torch's ``ReduceOp`` or its name. ``AVG`` needs a
            floating-point dtype; ``BAND``/``BOR``/``BXOR`` an integer or bool dtype.
        group: a group from ``new_group``; ``None`` is the default group.
        async_op: return a ``Work`` at once instead of waiting; ``tensor`` holds the result after
            ``work.wait()``.
        algorithm: a name from ``simdist.algorithms`` (``"ring"``, ``"recursive_doubling"``, ...);
            ``None``: the one of lowest alpha-beta cost for the size (``simulate``'s
            ``algorithms`` may set another default).

    Returns:
        A ``Work`` if ``async_op``, else ``None``; ``None`` on a rank outside ``group``.

    Raises:
        NotInitializedError: before ``init_process_group``.
        TypeError: ``tensor`` is not an array, ``op`` cannot reduce its dtype, ``group`` is not a
            group, ``async_op`` is not a bool or ``algorithm`` not a str.
        ValueError: ``op`` is not a reduction, ``tensor`` is read-only, ``group`` was destroyed,
            or ``algorithm`` is not an algorithm of ``all_reduce``.
        CollectiveMismatchError: on the simulator, when the ranks' calls disagree (op, dtype,
            shape, reduce op, ...). Under ``simdist.simulate`` a rank's error reaches the caller
            as ``RankError``, the original as its ``__cause__``.

    Example:
        >>> import simdist, torch
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     t = torch.arange(4) + 10 * rank        # rank 0: [0, 1, 2, 3]; rank 1: [10, 11, 12, 13]
        ...     simdist.all_reduce(t)
        ...     return t
        >>> simdist.simulate(fn, 2).values
        [tensor([10, 12, 14, 16]), tensor([10, 12, 14, 16])]
    """
    world, pg = resolve("all_reduce", group)
    op = _reduced_into(tensor, "tensor", op)
    if pg is None:
        return None
    return _run(pg.all_reduce(tensor, _opts(async_op, algorithm, op=op)), async_op)


@library_call
def reduce(
    tensor: Any,
    dst: int | None = None,
    op: Any = ReduceOp.SUM,
    group: Any = None,
    async_op: bool = False,
    group_dst: int | None = None,
    *,
    algorithm: str | None = None,
) -> Work | None:
    """Reduce ``tensor`` across the group with ``op`` into ``tensor`` on rank ``dst`` only, in place.

    ``dst``'s ``tensor`` ends as the element-wise reduction of every rank's; the other ranks'
    tensors are left unchanged (torch leaves them unspecified).

    Args:
        tensor: input on every rank, output on ``dst`` (writable, the same dtype and shape on
            every rank).
        dst: the global rank that receives the result. Required unless ``group_dst`` is given.
        op: a ``ReduceOp`` (default ``SUM``), torch's ``ReduceOp`` or its name.
        group: a group from ``new_group``; ``None`` is the default group.
        async_op: return a ``Work`` at once instead of waiting.
        group_dst: ``dst`` as a rank of ``group``; pass one of ``dst`` and ``group_dst``.
        algorithm: a name from ``simdist.algorithms``; ``None`` lets the backend choose.

    Returns:
        A ``Work`` if ``async_op``, else ``None``; ``None`` on a rank outside ``group``.

    Raises:
        NotInitializedError: before ``init_process_group``.
        TypeError: ``tensor`` is not an array, ``op`` cannot reduce its dtype, or an argument
            has the wrong type.
        ValueError: ``op`` is not a reduction, ``tensor`` is read-only, neither or both of
            ``dst`` and ``group_dst`` given, or ``dst`` is not in ``group``.
        CollectiveMismatchError: on the simulator, when the ranks' calls disagree.

    Example:
        >>> import simdist, torch
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     t = torch.arange(4) + 10 * rank
        ...     simdist.reduce(t, dst=0, op=simdist.ReduceOp.MAX)
        ...     return t
        >>> simdist.simulate(fn, 2).values
        [tensor([10, 11, 12, 13]), tensor([10, 11, 12, 13])]
    """
    world, pg = resolve("reduce", group)
    op = _reduced_into(tensor, "tensor", op)
    if pg is None:
        return None
    root = root_of(world, pg, dst, group_dst, "dst", default=None)
    return _run(pg.reduce(tensor, _opts(async_op, algorithm, op=op, root=root)), async_op)


@library_call
def all_gather(
    tensor_list: list, tensor: Any, group: Any = None, async_op: bool = False, *, algorithm: str | None = None
) -> Work | None:
    """Fill ``tensor_list[i]`` with rank i's ``tensor`` on every rank: the lists end identical, in place.

    ``tensor`` itself is not modified.

    Args:
        tensor_list: the outputs: a list of group-size writable arrays, each of ``tensor``'s
            dtype and number of elements (their shapes may differ from ``tensor``'s).
        tensor: this rank's input.
        group: a group from ``new_group``; ``None`` is the default group.
        async_op: return a ``Work`` at once instead of waiting.
        algorithm: a name from ``simdist.algorithms`` (``"ring"``, ...); ``None`` lets the
            backend choose.

    Returns:
        A ``Work`` if ``async_op``, else ``None``; ``None`` on a rank outside ``group``.

    Raises:
        NotInitializedError: before ``init_process_group``.
        TypeError: ``tensor`` or an entry of ``tensor_list`` is not an array, or an entry's
            dtype differs from ``tensor``'s.
        ValueError: ``tensor_list`` has the wrong length, an entry the wrong number of
            elements, or an entry is read-only.
        CollectiveMismatchError: on the simulator, when the ranks' calls disagree.

    Example:
        >>> import simdist, torch
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     out = [torch.zeros(2, dtype=torch.int64) for _ in range(2)]
        ...     simdist.all_gather(out, torch.tensor([rank, 10 * rank]))
        ...     return out
        >>> simdist.simulate(fn, 2).values
        [[tensor([0, 0]), tensor([ 1, 10])], [tensor([0, 0]), tensor([ 1, 10])]]
    """
    world, pg = resolve("all_gather", group)
    A.check_array(tensor, "tensor")
    if pg is None:
        return None
    check_list(tensor_list, pg.size, "tensor_list", tensor, A.numel(tensor), writable=True, refname="tensor")
    return _run(pg.all_gather(tensor_list, tensor, _opts(async_op, algorithm)), async_op)


@library_call
def all_gather_into_tensor(
    output_tensor: Any, input_tensor: Any, group: Any = None, async_op: bool = False, *, algorithm: str | None = None
) -> Work | None:
    """Concatenate every rank's ``input_tensor``, in rank order, into ``output_tensor`` on every rank.

    ``output_tensor`` ends identical on every rank (its first ``input_tensor.numel()`` elements
    are group rank 0's, and so on); ``input_tensor`` is not modified.

    Args:
        output_tensor: the output: writable, of ``input_tensor``'s dtype, with group size times
            its number of elements (any shape, e.g. ``(size * n,)`` or ``(size, n)``).
        input_tensor: this rank's input.
        group: a group from ``new_group``; ``None`` is the default group.
        async_op: return a ``Work`` at once instead of waiting.
        algorithm: a name from ``simdist.algorithms``; ``None`` lets the backend choose.

    Returns:
        A ``Work`` if ``async_op``, else ``None``; ``None`` on a rank outside ``group``.

    Raises:
        NotInitializedError: before ``init_process_group``.
        TypeError: an argument is not an array, or the dtypes differ.
        ValueError: ``output_tensor`` is read-only or has the wrong number of elements.
        CollectiveMismatchError: on the simulator, when the ranks' calls disagree.

    Example:
        >>> import simdist, torch
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     out = torch.zeros(2, 2, dtype=torch.int64)
        ...     simdist.all_gather_into_tensor(out, torch.tensor([rank, 10 * rank]))
        ...     return out
        >>> simdist.simulate(fn, 2).values[1]
        tensor([[ 0,  0],
                [ 1, 10]])
    """
    world, pg = resolve("all_gather_into_tensor", group)
    A.check_array(input_tensor, "input_tensor")
    same_kind(output_tensor, input_tensor, "output_tensor", "input_tensor")
    A.check_writable(output_tensor, "output_tensor")
    if pg is None:
        return None
    if A.numel(output_tensor) != pg.size * A.numel(input_tensor):
        raise ValueError(
            f"output_tensor has {A.numel(output_tensor)} elements, expected {pg.size} x {A.numel(input_tensor)} "
            "(group size x input elements)"
        )
    return _run(pg.all_gather_into_tensor(output_tensor, input_tensor, _opts(async_op, algorithm)), async_op)


def _root_list(pg, root: int, items: Any, argname: str, rootname: str, tensor: Any, writable: bool) -> list | None:
    """``items`` checked on the root rank (one tensor like ``tensor`` per rank); ``None`` on the others."""
    if pg.rank == root:
        if items is None:
            role = "destination" if rootname == "dst" else "source"
            raise ValueError(
                f"{argname}=None on the {role} rank {rootname}={pg.ranks[root]}; pass a list of {pg.size} tensors"
            )
        check_list(items, pg.size, argname, tensor, A.numel(tensor), writable=writable, refname="tensor")
        return items
    if items:
        raise ValueError(
            f"{argname} must be None on rank {pg.ranks[pg.rank]}, which is not {rootname}={pg.ranks[root]} "
            f"(got a list of {len(items)})"
        )
    return None


@library_call
def gather(
    tensor: Any,
    gather_list: list | None = None,
    dst: int | None = None,
    group: Any = None,
    async_op: bool = False,
    group_dst: int | None = None,
    *,
    algorithm: str | None = None,
) -> Work | None:
    """Fill ``gather_list[i]`` on rank ``dst`` with rank i's ``tensor``; only ``dst`` receives.

    Only ``dst``'s ``gather_list`` changes, in place; ``tensor`` is not modified anywhere.

    Args:
        tensor: this rank's input.
        gather_list: on ``dst``, a list of group-size writable arrays of ``tensor``'s dtype and
            number of elements; on every other rank ``None`` (or empty).
        dst: the global rank that gathers; ``None`` (with no ``group_dst``) is the group's
            rank 0, as in torch.
        group: a group from ``new_group``; ``None`` is the default group.
        async_op: return a ``Work`` at once instead of waiting.
        group_dst: ``dst`` as a rank of ``group``; pass at most one of ``dst`` and ``group_dst``.
        algorithm: a name from ``simdist.algorithms``; ``None`` lets the backend choose.

    Returns:
        A ``Work`` if ``async_op``, else ``None``; ``None`` on a rank outside ``group``.

    Raises:
        NotInitializedError: before ``init_process_group``.
        TypeError: ``tensor`` or an entry of ``gather_list`` is not an array of ``tensor``'s dtype.
        ValueError: ``gather_list`` is missing on ``dst`` or given on another rank, has the
            wrong length, or an entry is read-only or has the wrong number of elements;
            ``dst`` is not in ``group``.
        CollectiveMismatchError: on the simulator, when the ranks' calls disagree.

    Example:
        >>> import simdist, torch
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     out = [torch.zeros(2, dtype=torch.int64) for _ in range(3)] if rank == 0 else None
        ...     simdist.gather(torch.tensor([rank, rank]), out, dst=0)
        ...     return out
        >>> simdist.simulate(fn, 3).values
        [[tensor([0, 0]), tensor([1, 1]), tensor([2, 2])], None, None]
    """
    world, pg = resolve("gather", group)
    A.check_array(tensor, "tensor")
    if pg is None:
        return None
    root = root_of(world, pg, dst, group_dst, "dst")
    gather_list = _root_list(pg, root, gather_list, "gather_list", "dst", tensor, writable=True)
    return _run(pg.gather(tensor, gather_list, _opts(async_op, algorithm, root=root)), async_op)


@library_call
def scatter(
    tensor: Any,
    scatter_list: list | None = None,
    src: int | None = None,
    group: Any = None,
    async_op: bool = False,
    group_src: int | None = None,
    *,
    algorithm: str | None = None,
) -> Work | None:
    """Copy ``scatter_list[i]`` of rank ``src`` into ``tensor`` on rank i, in place.

    Every rank's ``tensor`` is overwritten (``src``'s with ``scatter_list[src]``);
    ``scatter_list`` is not modified.

    Args:
        tensor: the output: writable, of the dtype and number of elements of the list's entries.
        scatter_list: on ``src``, a list of group-size arrays of ``tensor``'s dtype and number of
            elements; on every other rank ``None`` (or empty).
        src: the global rank that scatters; ``None`` (with no ``group_src``) is the group's
            rank 0, as in torch.
        group: a group from ``new_group``; ``None`` is the default group.
        async_op: return a ``Work`` at once instead of waiting.
        group_src: ``src`` as a rank of ``group``; pass at most one of ``src`` and ``group_src``.
        algorithm: a name from ``simdist.algorithms``; ``None`` lets the backend choose.

    Returns:
        A ``Work`` if ``async_op``, else ``None``; ``None`` on a rank outside ``group``.

    Raises:
        NotInitializedError: before ``init_process_group``.
        TypeError: ``tensor`` or an entry of ``scatter_list`` is not an array of ``tensor``'s dtype.
        ValueError: ``tensor`` is read-only; ``scatter_list`` is missing on ``src`` or given on
            another rank, has the wrong length or an entry the wrong number of elements;
            ``src`` is not in ``group``.
        CollectiveMismatchError: on the simulator, when the ranks' calls disagree.

    Example:
        >>> import simdist, torch
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     pieces = [torch.tensor([i, i]) for i in (5, 6, 7)] if rank == 0 else None
        ...     t = torch.zeros(2, dtype=torch.int64)
        ...     simdist.scatter(t, pieces, src=0)
        ...     return t
        >>> simdist.simulate(fn, 3).values
        [tensor([5, 5]), tensor([6, 6]), tensor([7, 7])]
    """
    world, pg = resolve("scatter", group)
    A.check_array(tensor, "tensor")
    A.check_writable(tensor, "tensor")
    if pg is None:
        return None
    root = root_of(world, pg, src, group_src, "src")
    scatter_list = _root_list(pg, root, scatter_list, "scatter_list", "src", tensor, writable=False)
    return _run(pg.scatter(tensor, scatter_list, _opts(async_op, algorithm, root=root)), async_op)


@library_call
def reduce_scatter(
    output: Any,
    input_list: list,
    op: Any = ReduceOp.SUM,
    group: Any = None,
    async_op: bool = False,
    *,
    algorithm: str | None = None,
) -> Work | None:
    """Reduce ``input_list[i]`` across the group with ``op`` into ``output`` on rank i, in place.

    Rank i's ``output`` ends as the element-wise reduction of every rank's ``input_list[i]``;
    ``input_list`` is not modified. The pieces may differ in size from rank to rank.

    Args:
        output: the output: writable, with as many elements as ``input_list[rank]``.
        input_list: a list of group-size arrays of ``output``'s dtype; entry i is this rank's
            contribution to rank i.
        op: a ``ReduceOp`` (default ``SUM``), torch's ``ReduceOp`` or its name.
        group: a group from ``new_group``; ``None`` is the default group.
        async_op: return a ``Work`` at once instead of waiting.
        algorithm: a name from ``simdist.algorithms``; ``None`` lets the backend choose.

    Returns:
        A ``Work`` if ``async_op``, else ``None``; ``None`` on a rank outside ``group``.

    Raises:
        NotInitializedError: before ``init_process_group``.
        TypeError: an argument is not an array, the dtypes differ, or ``op`` cannot reduce them.
        ValueError: ``op`` is not a reduction, ``output`` is read-only, ``input_list`` has the
            wrong length, or ``input_list[rank]`` and ``output`` differ in number of elements.
        CollectiveMismatchError: on the simulator, when the ranks' calls disagree.

    Example:
        >>> import simdist, torch
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     pieces = [torch.tensor([rank, 1]), torch.tensor([10 * rank, 2])]
        ...     out = torch.zeros(2, dtype=torch.int64)
        ...     simdist.reduce_scatter(out, pieces)
        ...     return out
        >>> simdist.simulate(fn, 2).values
        [tensor([1, 2]), tensor([10,  4])]
    """
    world, pg = resolve("reduce_scatter", group)
    op = _reduced_into(output, "output", op)
    if pg is None:
        return None
    check_list(input_list, pg.size, "input_list", output, refname="output")
    if A.numel(input_list[pg.rank]) != A.numel(output):
        raise ValueError(
            f"input_list[{pg.rank}] has {A.numel(input_list[pg.rank])} elements but output has {A.numel(output)}"
        )
    return _run(pg.reduce_scatter(output, input_list, _opts(async_op, algorithm, op=op)), async_op)


@library_call
def reduce_scatter_tensor(
    output: Any,
    input: Any,
    op: Any = ReduceOp.SUM,
    group: Any = None,
    async_op: bool = False,
    *,
    algorithm: str | None = None,
) -> Work | None:
    """Reduce ``input`` across the group with ``op``; rank i gets the i-th of group-size equal pieces, in ``output``.

    ``input`` is read as flat and cut into group-size consecutive pieces of ``output.numel()``
    elements; ``output`` on rank i is overwritten with the reduction of every rank's piece i.
    ``input`` is not modified.

    Args:
        output: the output: writable, one piece.
        input: this rank's input: ``output``'s dtype, group size times its number of elements.
        op: a ``ReduceOp`` (default ``SUM``), torch's ``ReduceOp`` or its name.
        group: a group from ``new_group``; ``None`` is the default group.
        async_op: return a ``Work`` at once instead of waiting.
        algorithm: a name from ``simdist.algorithms``; ``None`` lets the backend choose.

    Returns:
        A ``Work`` if ``async_op``, else ``None``; ``None`` on a rank outside ``group``.

    Raises:
        NotInitializedError: before ``init_process_group``.
        TypeError: an argument is not an array, the dtypes differ, or ``op`` cannot reduce them.
        ValueError: ``op`` is not a reduction, ``output`` is read-only, or ``input`` has the
            wrong number of elements.
        CollectiveMismatchError: on the simulator, when the ranks' calls disagree.

    Example:
        >>> import simdist, torch
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     out = torch.zeros(2, dtype=torch.int64)
        ...     simdist.reduce_scatter_tensor(out, torch.arange(4) * (rank + 1))
        ...     return out
        >>> simdist.simulate(fn, 2).values
        [tensor([0, 3]), tensor([6, 9])]
    """
    world, pg = resolve("reduce_scatter_tensor", group)
    op = _reduced_into(output, "output", op)
    same_kind(input, output, "input", "output")
    if pg is None:
        return None
    if A.numel(input) != pg.size * A.numel(output):
        raise ValueError(
            f"input has {A.numel(input)} elements, expected {pg.size} x {A.numel(output)} "
            "(group size x output elements)"
        )
    return _run(pg.reduce_scatter_tensor(output, input, _opts(async_op, algorithm, op=op)), async_op)


@library_call
def all_to_all(
    output_tensor_list: list,
    input_tensor_list: list,
    group: Any = None,
    async_op: bool = False,
    *,
    algorithm: str | None = None,
) -> Work | None:
    """Send ``input_tensor_list[j]`` to rank j; receive rank j's piece for this rank into ``output_tensor_list[j]``.

    On rank i, ``output_tensor_list[j]`` is overwritten with rank j's ``input_tensor_list[i]``
    (a transpose of the ranks' lists); the inputs are not modified. Pieces may differ in size.

    Args:
        output_tensor_list: group-size writable arrays of ``input_tensor_list[0]``'s dtype;
            entry j as large as rank j's piece for this rank.
        input_tensor_list: group-size arrays of one dtype; entry j goes to rank j.
        group: a group from ``new_group``; ``None`` is the default group.
        async_op: return a ``Work`` at once instead of waiting.
        algorithm: a name from ``simdist.algorithms`` (``"pairwise"``, ``"bruck"``, ...);
            ``None`` lets the backend choose.

    Returns:
        A ``Work`` if ``async_op``, else ``None``; ``None`` on a rank outside ``group``.

    Raises:
        NotInitializedError: before ``init_process_group``.
        TypeError: an entry is not an array or the dtypes differ.
        ValueError: a list has the wrong length or an output is read-only.
        CollectiveMismatchError: on the simulator, when the ranks' calls disagree.

    Example:
        >>> import simdist, torch
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     ins = [torch.tensor([10 * rank + j]) for j in range(3)]
        ...     outs = [torch.zeros(1, dtype=torch.int64) for _ in range(3)]
        ...     simdist.all_to_all(outs, ins)
        ...     return [int(o) for o in outs]
        >>> simdist.simulate(fn, 3).values
        [[0, 10, 20], [1, 11, 21], [2, 12, 22]]
    """
    world, pg = resolve("all_to_all", group)
    if pg is None:
        return None
    check_list(input_tensor_list, pg.size, "input_tensor_list")
    check_list(
        output_tensor_list,
        pg.size,
        "output_tensor_list",
        input_tensor_list[0],
        writable=True,
        refname="input_tensor_list[0]",
    )
    check_list(input_tensor_list, pg.size, "input_tensor_list", input_tensor_list[0], refname="input_tensor_list[0]")
    return _run(pg.all_to_all(output_tensor_list, input_tensor_list, _opts(async_op, algorithm)), async_op)


@library_call
def all_to_all_single(
    output: Any,
    input: Any,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    group: Any = None,
    async_op: bool = False,
    *,
    algorithm: str | None = None,
) -> Work | None:
    """Split ``input`` along dim 0, send piece j to rank j, and concatenate the pieces received, in rank order, into ``output``.

    ``output`` is overwritten in place; ``input`` is not modified. With split sizes ``None``
    dim 0 is cut into group-size equal pieces.

    Args:
        output: the output: writable, of ``input``'s dtype, with ``sum(output_split_sizes)``
            rows (dim 0).
        input: this rank's input.
        output_split_sizes: the number of rows received from each rank (group-size non-negative
            ints), or ``None`` for equal pieces.
        input_split_sizes: the number of rows sent to each rank, or ``None`` for equal pieces.
        group: a group from ``new_group``; ``None`` is the default group.
        async_op: return a ``Work`` at once instead of waiting.
        algorithm: a name from ``simdist.algorithms``; ``None`` lets the backend choose.

    Returns:
        A ``Work`` if ``async_op``, else ``None``; ``None`` on a rank outside ``group``.

    Raises:
        NotInitializedError: before ``init_process_group``.
        TypeError: an argument is not an array, the dtypes differ, or split sizes are not a
            list of ints.
        ValueError: ``output`` is read-only; split sizes have the wrong length, a negative entry,
            or do not sum to dim 0; with ``None``, dim 0 does not divide by the group size.
        CollectiveMismatchError: on the simulator, when the ranks' calls disagree.

    Example:
        >>> import simdist, torch
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     out = torch.zeros(4, dtype=torch.int64)
        ...     simdist.all_to_all_single(out, torch.arange(4) + 10 * rank)
        ...     return out
        >>> simdist.simulate(fn, 2).values
        [tensor([ 0,  1, 10, 11]), tensor([ 2,  3, 12, 13])]
    """
    world, pg = resolve("all_to_all_single", group)
    A.check_array(input, "input")
    same_kind(output, input, "output", "input")
    A.check_writable(output, "output")
    if pg is None:
        return None
    for x, splits, name in (
        (input, input_split_sizes, "input_split_sizes"),
        (output, output_split_sizes, "output_split_sizes"),
    ):
        rows = A.shape_of(x)[0] if A.shape_of(x) else 1
        check_splits(splits, pg.size, rows, name)
    return _run(
        pg.all_to_all_single(output, input, output_split_sizes, input_split_sizes, _opts(async_op, algorithm)), async_op
    )


@library_call
def barrier(
    group: Any = None,
    async_op: bool = False,
    device_ids: Any = None,
    timeout: Any = None,
    *,
    algorithm: str | None = None,
) -> Work | None:
    """Return once every rank of the group has entered ``barrier``; no data changes.

    On the simulator no rank passes the barrier before the last one enters it, in virtual time
    as well: afterwards every member's clock reads at least the last arrival's.

    Args:
        group: a group from ``new_group``; ``None`` is the default group.
        async_op: return a ``Work`` at once instead of waiting.
        device_ids: accepted for torch's signature; ignored.
        timeout: accepted for torch's signature; ignored.
        algorithm: a name from ``simdist.algorithms`` (``"dissemination"``, ...); ``None``
            lets the backend choose.

    Returns:
        A ``Work`` if ``async_op``, else ``None``; ``None`` on a rank outside ``group``.

    Raises:
        NotInitializedError: before ``init_process_group``.
        TypeError: ``group``, ``async_op`` or ``algorithm`` has the wrong type.
        CollectiveMismatchError: on the simulator, when one rank calls ``barrier`` and another
            a different collective.

    Example:
        >>> import simdist
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     simdist.compute(seconds=rank)          # rank 1 arrives one second later
        ...     simdist.barrier()
        ...     return "passed"
        >>> simdist.simulate(fn, 2).values
        ['passed', 'passed']
    """
    world, pg = resolve("barrier", group)
    if pg is None:
        return None
    return _run(pg.barrier(_opts(async_op, algorithm)), async_op)
