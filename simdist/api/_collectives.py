"""The torch.distributed-compatible collectives: broadcast, all_reduce, ..., barrier.

Every function resolves the world, then the group, checks its arguments, then calls
the group. Collectives wait for their Work unless ``async_op=True``, exactly like
torch. On a rank outside ``group`` an operation warns (``UserWarning``, as torch), does
nothing and returns ``None``. A collective's ``algorithm=`` picks one of simdist's
algorithms (``simdist.algorithms``) on the ``sim`` and ``socket`` backends; library
backends (NCCL, torch's) choose their own.
Ranks named by ``src``/``dst`` are *global* ranks; ``group_src``/``group_dst``
name ranks within ``group``.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..core import _arrays as A
from ..core._callsite import user_call_site
from ..core._entry import library_call
from ..core._checks import check_list, check_splits, resolve, root_of, same_kind
from ..core._group import Options
from ..core._reduce_op import ReduceOp, as_reduce_op
from ..core._work import Work

__all__ = [
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
]


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
