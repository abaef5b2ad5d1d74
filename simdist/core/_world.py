"""The one piece of module state: which ``World`` the calling code lives in.

A rank thread of the simulator sees its own world (thread-local); a process sees the
process world. Every public function resolves the world, then the group, then calls
the group.
"""

from __future__ import annotations

import os
import threading
from abc import ABC, abstractmethod
from typing import Any, Callable, Sequence

from ._errors import NotInitializedError
from ._group import ProcessGroup

__all__ = [
    "DEFAULT_TIMEOUT",
    "ProcessWorld",
    "World",
    "current_world",
    "require_world",
    "set_thread_world",
    "set_process_world",
    "thread_world",
]


class World(ABC):
    """The ranks one program runs as, and the groups it has made.

    Attributes:
        rank: this rank's global rank (known before ``init_process_group`` inside a simulation).
        size: the number of ranks.
        backend: the backend name given to ``init_process_group``, once initialized.
        default_group: the group of all ranks, once initialized.
        groups: the groups this rank belongs to, the default group first.
    """

    rank: int = -1
    size: int = -1
    backend: str | None = None
    default_group: ProcessGroup | None = None
    groups: list[ProcessGroup]

    process_world: bool = False
    """Whether ``init_process_group`` outside a simulation makes this world for the process (one rank per
    process, started by a launcher)."""
    needs_rendezvous: bool = True
    """Whether such a process needs ``env://`` (``MASTER_ADDR``) or an ``init_method`` to find its peers."""

    @property
    def initialized(self) -> bool:
        return self.default_group is not None

    @classmethod
    def spawn(
        cls,
        fn: Callable,
        args: tuple,
        nprocs: int,
        *,
        daemon: bool,
        start_method: str | None,
        backend: str,
        **options: Any,
    ) -> list:
        """The values of ``fn(rank, *args)`` on ``nprocs`` ranks of this backend (what :func:`simdist.spawn` runs).

        A backend that can start its ranks itself overrides this; here it raises ``ValueError``.
        """
        raise ValueError(f"backend={backend!r} cannot launch ranks; use backend='sim'")

    def compute(self, seconds: float, call_site: str, op: str = "compute") -> None:
        """Account for ``seconds`` of the program's own computation (``simdist.sim.compute``, DDP's backward):
        a simulated world advances its rank's virtual clock; a real one, where computing takes its own time,
        does nothing."""

    @abstractmethod
    def init(
        self, backend: str | None, *, init_method: str | None, timeout: Any, world_size: int, rank: int, store: Any
    ) -> None:
        """Create the default group (``init_process_group``)."""

    @abstractmethod
    def new_group(self, ranks: Sequence[int], *, backend: str | None, timeout: Any) -> Any:
        """Create a group of ``ranks`` (every rank calls it); non-members get ``NON_GROUP_MEMBER``."""

    @abstractmethod
    def destroy(self, group: ProcessGroup | None) -> None:
        """Destroy ``group``, or every group and the default group when ``None``."""

    def destroy_subgroup(self, group: ProcessGroup | None) -> bool:
        """Destroy ``group`` if it is a group other than the default one; whether it was."""
        if group is None or group is self.default_group:
            return False
        if group in self.groups:
            self.groups.remove(group)
            group.destroy()
        return True


DEFAULT_TIMEOUT = 300.0
"""Seconds an operation of a process world may wait for its peers before ``DistTimeoutError`` (``timeout=`` of
``init_process_group`` or ``$SIMDIST_TIMEOUT`` change it)."""


class ProcessWorld(World):
    """A world of one rank per process (socket, NCCL, torch's backends), made by ``init_process_group`` in a
    process that a launcher started (``simdist run``, :func:`simdist.spawn`, torchrun)."""

    process_world = True
    timeout: float = DEFAULT_TIMEOUT

    @staticmethod
    def timeout_of(timeout: Any) -> float:
        """The seconds an operation waits: ``timeout`` (``init_process_group``'s), else ``$SIMDIST_TIMEOUT``, else
        :data:`DEFAULT_TIMEOUT`."""
        # a circle by choice: _checks reads the world at import; this reads a check only when called
        from ._checks import timeout_seconds

        if timeout is not None:
            return timeout_seconds(timeout, "timeout", positive=True)
        raw = os.environ.get("SIMDIST_TIMEOUT")
        if raw is None:
            return DEFAULT_TIMEOUT
        try:
            return timeout_seconds(float(raw), "SIMDIST_TIMEOUT", positive=True)
        except ValueError:
            raise ValueError(f"SIMDIST_TIMEOUT={raw!r} must be a finite number of seconds > 0") from None


class _Local(threading.local):
    world: World | None = None  # a class default: reading it where no thread world was set raises nothing


_local = _Local()
_process_world: World | None = None


def current_world() -> World | None:
    """The calling thread's world, else the process world, else ``None``."""
    return _local.world or _process_world


def thread_world() -> World | None:
    """The calling thread's own world (a simulated rank's), ignoring the process world."""
    return _local.world


def require_world(fn: str) -> World:
    """The current world, initialized; ``NotInitializedError`` naming ``fn`` otherwise."""
    world = current_world()
    if world is None or not world.initialized:
        raise NotInitializedError(f"{fn}() needs the default process group: call simdist.init_process_group() first")
    return world


def set_thread_world(world: World | None) -> None:
    _local.world = world


def set_process_world(world: World | None) -> None:
    global _process_world
    _process_world = world
