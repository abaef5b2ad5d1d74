"""Argument checks shared by the public functions: clear errors that name the argument."""

from __future__ import annotations

import datetime
import math
import warnings
from typing import Any, Sequence

from . import _arrays as A
from ._callsite import user_stacklevel
from ._group import GroupMember, ProcessGroup
from ._world import World, current_world, require_world

__all__ = ["resolve", "to_group_rank", "root_of", "check_int", "timeout_seconds", "check_list", "same_kind"]

_REQUIRED: Any = object()


def resolve(fn: str, group: Any) -> tuple[World, ProcessGroup | None]:
    """The world and the group for a call of ``fn``; the group is ``None`` if this rank is not a member."""
    if group is None:  # the common case, first: an initialized world's default group
        world = current_world()
        if world is not None and world.initialized:
            return world, world.default_group
    world = require_world(fn)
    if group is None or group is GroupMember.WORLD:
        return world, world.default_group
    if group is GroupMember.NON_GROUP_MEMBER:
        warnings.warn(
            f"running {fn} on global rank {world.rank} which does not belong to the given group",
            stacklevel=user_stacklevel(),
        )
        return world, None
    if not isinstance(group, ProcessGroup):
        raise TypeError(
            f"group must be a ProcessGroup from new_group() or None, got {type(group).__name__} ({group!r:.60})"
        )
    if group.destroyed:
        raise ValueError(f"group={group!r} was destroyed by destroy_process_group(); make a new one with new_group()")
    if group.ranks[group.rank] != world.rank:
        raise ValueError(
            f"group={group!r} is rank {group.ranks[group.rank]}'s group object, not rank {world.rank}'s: each rank has "
            "its own (a group kept where ranks share state, such as a module's when ranks are threads, is another's)"
        )
    return world, group


def check_int(value: Any, argname: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an ``int`` within ``minimum..maximum`` (either bound optional).

    Integers of other types (``numpy`` ints, ``__index__``) are accepted; ``bool`` is not.

    Raises:
        TypeError: ``value`` is not an integer. ValueError: it lies outside the bounds.
    """
    if type(value) is int and (minimum is None or value >= minimum) and (maximum is None or value <= maximum):
        return value
    if type(value) is not int:
        try:
            if isinstance(value, bool):
                raise TypeError
            value = value.__index__()
        except (AttributeError, TypeError):
            raise TypeError(f"{argname} must be an int, got {type(value).__name__} ({value!r:.60})") from None
    if minimum is not None and maximum is not None and not minimum <= value <= maximum:
        raise ValueError(f"{argname}={value!r} is out of range; expected an int in {minimum}..{maximum}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{argname}={value!r} must be at least {minimum}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{argname}={value!r} must be at most {maximum}")
    return value


def timeout_seconds(value: Any, argname: str, *, default: Any = _REQUIRED, positive: bool = False) -> Any:
    """``value`` (a number of seconds or a ``datetime.timedelta``) as float seconds; ``default`` if it is ``None``.

    Without a ``default``, ``None`` is an error. ``positive`` rejects zero too.

    Raises:
        TypeError: ``value`` is neither a number nor a timedelta (a ``bool`` is not a number here).
        ValueError: ``value`` is negative, infinite or NaN, or zero when ``positive``.
    """
    if value is None and default is not _REQUIRED:
        return default
    seconds = value.total_seconds() if isinstance(value, datetime.timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        expected = "a number of seconds, a datetime.timedelta" + (" or None" if default is not _REQUIRED else "")
        raise TypeError(f"{argname} must be {expected}, got {type(value).__name__} ({value!r:.60})")
    if not (math.isfinite(seconds) and (seconds > 0 if positive else seconds >= 0)):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{argname}={value!r} must be a finite number of seconds {bound}")
    return float(seconds)


def to_group_rank(world: World, group: ProcessGroup, rank: Any, argname: str) -> int:
    """The group rank of global rank ``rank``; errors name ``argname`` when it is out of range."""
    rank = check_int(rank, argname)
    if not 0 <= rank < world.size:
        raise ValueError(f"{argname}={rank} is out of range; expected a global rank in 0..{world.size - 1}")
    g = group.group_rank(rank)
    if g is None:
        raise ValueError(f"{argname}={rank} is not a member of the group (global ranks {list(group.ranks)})")
    return g


def root_of(
    world: World, group: ProcessGroup, rank: Any, group_rank: Any, argname: str, default: int | None = 0
) -> int:
    """The group rank named by a global ``src``/``dst`` or by ``group_src``/``group_dst``."""
    if group_rank is None and type(rank) is int and 0 <= rank < world.size:  # the common case, first
        g = group.group_rank(rank)
        if g is not None:
            return g
    if rank is not None and group_rank is not None:
        raise ValueError(f"pass either {argname}={rank!r} or group_{argname}={group_rank!r}, not both")
    if group_rank is not None:
        g = check_int(group_rank, f"group_{argname}")
        if not 0 <= g < group.size:
            raise ValueError(f"group_{argname}={g} is out of range; expected a group rank in 0..{group.size - 1}")
        return g
    if rank is None:
        if default is None:
            raise ValueError(f"{argname}=None; pass {argname} (a global rank) or group_{argname} (a rank of the group)")
        return default
    return to_group_rank(world, group, rank, argname)


def same_kind(x: Any, ref: Any, argname: str, refname: str = "the input tensor") -> None:
    """``x`` is an array of ``ref``'s dtype."""
    A.check_array(x, argname)
    if A.dtype_name(x) != A.dtype_name(ref):
        raise TypeError(f"{argname} has dtype {A.dtype_name(x)}, expected {A.dtype_name(ref)} (the dtype of {refname})")


def check_list(
    items: Any,
    length: int,
    argname: str,
    ref: Any | None = None,
    numel: int | None = None,
    writable: bool = False,
    refname: str = "the input tensor",
) -> list:
    """A list of ``length`` arrays (of ``ref``'s dtype and ``numel`` elements when given; outputs if ``writable``)."""
    if not isinstance(items, (list, tuple)):
        raise TypeError(f"{argname} must be a list of tensors, got {type(items).__name__} ({items!r:.60})")
    if len(items) != length:
        raise ValueError(f"{argname} has {len(items)} entries, expected {length} (the group size)")
    for i, x in enumerate(items):
        name = f"{argname}[{i}]"
        if ref is not None:
            same_kind(x, ref, name, refname)
        else:
            A.check_array(x, name)
        if numel is not None and A.numel(x) != numel:
            raise ValueError(f"{name} has shape {A.shape_of(x)} ({A.numel(x)} elements), expected {numel} elements")
        if writable:
            A.check_writable(x, name)
    return list(items)


def check_splits(splits: Sequence[int] | None, size: int, rows: int, argname: str) -> None:
    """Split sizes of ``all_to_all_single``: ``size`` non-negative ints summing to ``rows``."""
    if splits is None:
        if rows % size:
            raise ValueError(
                f"{argname} is None, so dim 0 ({rows}) must divide evenly among {size} ranks; pass split sizes"
            )
        return
    if not isinstance(splits, (list, tuple, range)):
        raise TypeError(f"{argname} must be a list of ints or None, got {type(splits).__name__} ({splits!r:.60})")
    if len(splits) != size:
        raise ValueError(f"{argname} has {len(splits)} entries, expected {size} (the group size)")
    for i, s in enumerate(splits):
        check_int(s, f"{argname}[{i}]", 0)
    if sum(splits) != rows:
        raise ValueError(f"{argname}={list(splits)} sums to {sum(splits)}, expected dim 0 of the tensor ({rows})")
