"""``monitored_barrier``: a barrier that names the ranks that did not arrive, in gloo's words."""

from __future__ import annotations

from typing import Any, cast

import torch

from . import _p2p
from ..core._checks import resolve, timeout_seconds
from ..core._entry import library_call
from ..core._errors import DistTimeoutError
from ..core._work import Work
from ..core._world import ProcessWorld

__all__ = ["monitored_barrier"]

_TAG = 2**40 + 1
"""The tag of monitored_barrier's messages: beyond the 32-bit tags of torch's backends, so no user's."""

_DEFAULT_TIMEOUT = 1800.0
"""torch's default process-group timeout (30 minutes): a simulated run's, in virtual seconds."""


@library_call
def monitored_barrier(group: Any = None, timeout: Any = None, wait_all_ranks: bool = False) -> None:
    """Return once every rank of the group has arrived; else raise on group rank 0 naming the missing ranks.

    As gloo's: group rank 0 waits for each other rank in turn, at most ``timeout`` for each,
    then answers them all; the others wait as long for that answer. The error's message is
    gloo's (``"[Rank 0]: Rank 2 failed to pass monitoredBarrier in 1000 ms"``). On the
    simulator the timeout is virtual time: a wait times out when no rank can run any more, or
    when what it waits for completes later than the timeout; it never waits in real time.

    Args:
        group: a group from ``new_group``; ``None`` is the default group.
        timeout: a ``timedelta`` or seconds; ``None`` is the process backend's timeout
            (``init_process_group``'s), on the simulator torch's default of 30 minutes.
        wait_all_ranks: on group rank 0, wait for every rank and name every missing one,
            instead of stopping at the first.

    Raises:
        NotInitializedError: before ``init_process_group``.
        TypeError: ``timeout`` is neither a number nor a ``timedelta``.
        DistTimeoutError: (a ``RuntimeError``, as torch raises) on group rank 0, naming the
            ranks that did not arrive in time; on another rank, when rank 0 did not answer.

    Example:
        >>> import simdist
        >>> def fn(rank):
        ...     simdist.init_process_group("gloo")
        ...     simdist.compute(seconds=rank)
        ...     simdist.monitored_barrier(timeout=10)
        ...     return "passed"
        >>> simdist.simulate(fn, 3).values
        ['passed', 'passed', 'passed']
    """
    world, pg = resolve("monitored_barrier", group)
    default = world.timeout if isinstance(world, ProcessWorld) else _DEFAULT_TIMEOUT
    seconds = timeout_seconds(timeout, "timeout", default=default)
    if pg is None:
        return
    me = pg.rank
    if me != 0:
        sent = _post(_p2p.isend, group, 0)
        try:
            _post(_p2p.irecv, group, 0).wait(seconds)
        except DistTimeoutError:
            raise DistTimeoutError(
                f"Rank {me} successfully reached monitoredBarrier, but received errors while "
                "waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank."
            ) from None
        sent.wait()
        return
    missing = _missing_ranks(group, pg.size, seconds, wait_all_ranks)
    if missing:
        ms = int(seconds * 1000)
        if len(missing) > 1 or wait_all_ranks:
            raise DistTimeoutError(
                f"[Rank 0]: Ranks {', '.join(map(str, missing))} failed to pass monitoredBarrier in {ms} ms"
            )
        raise DistTimeoutError(f"[Rank 0]: Rank {missing[0]} failed to pass monitoredBarrier in {ms} ms")
    for work in [_post(_p2p.isend, group, r) for r in range(1, pg.size)]:
        work.wait()


def _post(op: Any, group: Any, peer: int) -> Work:
    """The work of ``op`` (``isend`` or ``irecv``) of a one-value token with group rank ``peer``, on the barrier's tag."""
    side = "group_dst" if op is _p2p.isend else "group_src"
    return cast(Work, op(torch.zeros(1), group=group, tag=_TAG, **{side: peer}))  # a Work: this rank is in the group


def _missing_ranks(group: Any, size: int, seconds: float, wait_all: bool) -> list[int]:
    """The group ranks from 1 whose token group rank 0 did not get within ``seconds`` each (the first only, unless
    ``wait_all``)."""
    missing = []
    for r in range(1, size):
        try:
            _post(_p2p.irecv, group, r).wait(seconds)
        except DistTimeoutError:
            missing.append(r)
            if not wait_all:
                break
    return missing
