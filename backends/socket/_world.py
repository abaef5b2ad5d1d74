"""The process world of the socket backend: rendezvous, the store, the peer network, groups."""

from __future__ import annotations

import atexit
import ipaddress
import os
import socket
import sys
from typing import Any, Callable, Sequence
from urllib.parse import urlparse

from simdist.core import DistError, DistTimeoutError, PeerLostError
from simdist.core import GroupMember
from simdist.core import SERVED_ENV, STORE_ENV, ProcessWorld, set_process_world

from ._checked import agreed_checks
from ._failures import FailureMonitor, Heartbeat, JobStore, caused_by, failure_text
from ._flight import FlightRecorder
from ._group import SocketGroup

__all__ = ["SocketWorld", "rendezvous"]


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None:
        raise ValueError(f"init_method='env://' needs the environment variable {name} (as torchrun sets it)")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def _store_address(value: str) -> tuple[str, int]:
    """``(host, port)`` of ``$SIMDIST_STORE`` (``HOST:PORT``)."""
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"environment variable {STORE_ENV}={value!r} must look like 'HOST:PORT'")
    return host.strip("[]"), int(port)


def rendezvous(init_method: str | None, rank: int, world_size: int) -> tuple[str, int, int, int]:
    """``(host, port, rank, world_size)`` from ``env://`` (the default) or ``tcp://host:port``.

    ``env://`` takes the store's address from ``$SIMDIST_STORE`` where a launcher set it, else from
    ``MASTER_ADDR`` and ``MASTER_PORT``.
    """
    url = init_method or "env://"
    if url.startswith("env://") and os.environ.get(STORE_ENV):
        host, port = _store_address(os.environ[STORE_ENV])
    elif url.startswith("env://"):
        master = os.environ.get("MASTER_ADDR")
        if not master:
            raise ValueError("init_method='env://' needs the environment variable MASTER_ADDR (as torchrun sets it)")
        host, port = master, _env_int("MASTER_PORT")
    elif url.startswith("tcp://"):
        parsed = urlparse(url)
        if not parsed.hostname or parsed.port is None:
            raise ValueError(f"init_method={init_method!r} must look like 'tcp://host:port'")
        host, port = parsed.hostname, parsed.port
    else:
        raise ValueError(f"init_method={init_method!r} is not supported; expected 'env://' or 'tcp://host:port'")
    if rank == -1:
        rank = _env_int("RANK")
    if world_size == -1:
        world_size = _env_int("WORLD_SIZE")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} and world_size={world_size} do not fit: expected 0 <= rank < world_size")
    return host, port, rank, world_size


AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"
"""``True`` under torchrun: its agent's ``TCPStore`` listens at MASTER_PORT, and the ranks are its clients."""


def _torchrun_holds(init_method: str | None) -> bool:
    """Whether ``env://`` means MASTER_PORT and torchrun's agent holds it (no launcher of simdist's set a store)."""
    env = (init_method or "env://").startswith("env://") and not os.environ.get(STORE_ENV)
    return env and os.environ.get(AGENT_STORE_ENV) == "True"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def shared_secret(host: str) -> bytes:
    """``$SIMDIST_SECRET``; on loopback without one, this user's secret (see :mod:`._secret`).

    Raises:
        ValueError: ``host`` is not loopback and ``$SIMDIST_SECRET`` is unset.
        PermissionError: the per-user secret file is readable by others or not this user's.
    """
    from ._auth import secret_from_env
    from ._secret import user_secret

    secret = secret_from_env()
    if secret:
        return secret
    if is_loopback(host):
        return user_secret()
    raise ValueError(
        f"MASTER_ADDR {host!r} is not a loopback address, so connections must be authenticated: set "
        "SIMDIST_SECRET to the same value on every host (simdist run generates one for a single node)"
    )


def _address_towards(host: str, port: int) -> str:
    """This machine's address on the route to ``host`` (what peers on other hosts can reach)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, port))
        return probe.getsockname()[0]


class SocketWorld(ProcessWorld):
    """This process's place among the ranks of a socket job."""

    @classmethod
    def spawn(cls, fn: Callable, args: tuple, nprocs: int, **options: Any) -> list:
        """The values of ``fn(rank, *args)`` on ``nprocs`` processes of this machine, each with torchrun's
        environment (``daemon``, ``start_method``, ``backend`` and the backend's options as for :func:`spawn`)."""
        from ._spawn import spawn

        return spawn(fn, args, nprocs, **options)

    def __init__(self) -> None:
        self.server: Any = None
        self.store: Any = None
        self.network: Any = None
        self.heartbeat: Any = None
        self.groups: list[SocketGroup] = []
        self.group_count = 0
        self.checked = True
        self._hook: Any = None  # sys.excepthook as it was before init (this world's hook replaces it)

    def init(self, backend, *, init_method, timeout, world_size, rank, store) -> None:
        from ._peers import PeerNetwork

        self.timeout = self.timeout_of(timeout)
        host, port, rank, world_size, secret = self.connect_store(init_method, rank, world_size)
        self.checked = agreed_checks(self.store, rank)
        listen = "127.0.0.1" if is_loopback(host) else _address_towards(host, port)
        self.store.leave_will()
        self.heartbeat = self.store.heartbeat = Heartbeat(host, port, secret, rank, world_size)
        self.recorder = FlightRecorder(self.store, rank)
        self.network = PeerNetwork(
            rank,
            world_size,
            self.store,
            secret,
            host=listen,
            timeout=self.timeout,
            monitor=FailureMonitor(self.store, self.recorder),
        )
        self._await_ranks(rank, world_size)
        self.rank, self.size, self.backend = rank, world_size, backend or "socket"
        self._hook, sys.excepthook = sys.excepthook, self._excepthook
        atexit.register(self._at_exit)
        self.default_group = group = self._group(list(range(world_size)), 0)
        self.groups = [group]
        set_process_world(self)

    def _await_ranks(self, rank: int, world_size: int) -> None:
        """Return once every rank of the job has joined (its address is in the store), as torch's
        ``init_process_group`` returns once every rank has reached it.

        Raises:
            PeerLostError: a rank failed first (named, with its error).
            DistTimeoutError: some ranks (named) had not joined within the timeout.
        """
        keys = {r: f"peer/{r}" for r in range(world_size) if r != rank}
        if not keys:
            return
        try:
            self.store.wait(list(keys.values()), self.timeout)
        except DistTimeoutError:
            try:
                present = self.store.multi_get(list(keys.values()), timeout=5.0)
                missing: Any = [r for r, key in keys.items() if key not in present]
            except DistError:
                missing = "some"
            error = DistTimeoutError(
                f"init_process_group: rank {rank} waited {self.timeout:g} s for every rank of {world_size} to "
                f"join; rank(s) {missing} did not (their processes did not reach init_process_group, or reach "
                "another store)"
            )
            self._abandon(error)
            raise error from None
        except PeerLostError as exc:  # it names the failed rank and its error
            self._abandon(exc)
            raise
        except DistError as exc:
            error = DistError(f"init_process_group: rank {rank}, waiting for every rank of {world_size} to join: {exc}")
            self._abandon(error)
            raise error from exc

    def _abandon(self, error: DistError) -> None:
        """A failed ``init``: record ``error`` for the other ranks and close this rank's network."""
        self.store.record_failure(f"{type(error).__name__}: {error}", caused_by(error))
        self.recorder.close()
        self.network.close(failed=True)
        self.heartbeat.stop()

    def connect_store(self, init_method: str | None, rank: int, world_size: int) -> tuple[str, int, int, int, bytes]:
        """Rendezvous: rank 0 serves the store (unless the launcher does, see ``SERVED_ENV``), every
        rank connects to it.

        Sets ``server`` (rank 0) and ``store``; returns ``(host, port, rank, world_size, secret)``.
        """
        from ._store import StoreServer

        host, port, rank, world_size = rendezvous(init_method, rank, world_size)
        secret = shared_secret(host)
        if _torchrun_holds(init_method):
            host, port = self._meet_under_torchrun(host, port, rank, secret)
        elif rank == 0 and os.environ.get(SERVED_ENV) != f"{host}:{port}":
            self.server = StoreServer("127.0.0.1" if is_loopback(host) else "0.0.0.0", port, secret)
        self.store = JobStore(host, port, secret, rank=rank, world_size=world_size, timeout=self.timeout)
        return host, port, rank, world_size, secret

    def _meet_under_torchrun(self, master: str, master_port: int, rank: int, secret: bytes) -> tuple[str, int]:
        """``(host, port)`` of the job's store under torchrun, whose agent's ``TCPStore`` holds MASTER_PORT.

        Rank 0 serves simdist's store at a free port and publishes its address in torchrun's store
        (a key per restart of the job); the other ranks read it there, waiting up to the timeout.
        """
        import datetime

        import torch.distributed as td

        from ._store import StoreServer

        key = f"simdist/store/attempt{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        try:
            agent = td.TCPStore(master, master_port, is_master=False, timeout=datetime.timedelta(seconds=self.timeout))
            if rank == 0:
                loopback = is_loopback(master)
                self.server = StoreServer("127.0.0.1" if loopback else "0.0.0.0", 0, secret)
                here = "127.0.0.1" if loopback else _address_towards(master, master_port)
                agent.set(key, f"{here}:{self.server.port}")
            address = agent.get(key).decode()
        except RuntimeError as exc:  # torch's DistStoreError and its kin
            raise DistTimeoutError(
                f"rank {rank} found no simdist store in torchrun's store at {master}:{master_port} within "
                f"{self.timeout:g} s (rank 0 publishes it when it calls init_process_group): {exc}"
            ) from exc
        host, _, port = address.rpartition(":")
        return host, int(port)

    def goodbye(self, failed: bool = False) -> None:
        """Leave the store; rank 0 serves it until every rank has left or failed.

        A failing rank (``failed``) raises nothing here: its own error is the one to report.
        """
        # The server takes a goodbye before answering it, so a rank whose connection closes
        # during its own goodbye was seen: rank 0 saw everyone and shut down.
        try:
            try:
                self.store.say_goodbye()
            except DistError:
                if self.server is not None:
                    raise
            if self.server is not None:
                self.store.wait_goodbyes(self.timeout)
        except DistError:
            if not failed:
                raise
        finally:
            if self.server is not None:
                self.server.close()
            self.store.close()

    def _excepthook(self, kind: type, exc: BaseException, tb: Any) -> None:
        """An exception ends this process with the group alive: record it for the others, print it, leave."""
        text = failure_text(exc)
        if text is None or not self.initialized:
            self._hook(kind, exc, tb)
            return
        self.store.record_failure(text, caused_by(exc))
        try:
            self._hook(kind, exc, tb)
        finally:
            self._leave(text, caused_by(exc))

    def _at_exit(self) -> None:
        """The process ends normally with the group alive: leave as ``destroy_process_group`` would,
        so the others see a goodbye, not a failure (torch allows ending without destroying)."""
        if self.initialized:
            self._leave(None)

    def new_group(self, ranks: Sequence[int], *, backend, timeout) -> Any:
        self.group_count += 1
        if self.rank not in ranks:
            return GroupMember.NON_GROUP_MEMBER
        group = self._group(list(ranks), self.group_count, None if timeout is None else self.timeout_of(timeout))
        self.groups.append(group)
        return group

    def _group(self, ranks: list[int], group_id: int, timeout: float | None = None) -> Any:
        """This rank's group of ``ranks`` (global ranks in group-rank order); its waits end after ``timeout``
        seconds (``None``: the world's)."""
        return SocketGroup(
            self.network,
            ranks.index(self.rank),
            ranks,
            group_id,
            self.timeout if timeout is None else timeout,
            self.recorder,
            self.checked,
        )

    def _close_network(self, failed: bool = False) -> None:
        self.recorder.close()
        self.network.close(failed=failed)
        if self.heartbeat is not None:
            self.heartbeat.stop()

    def destroy(self, group) -> None:
        if self.destroy_subgroup(group):
            return
        # called while an exception propagates (try/finally): this rank is failing; the others learn it now
        exc = sys.exc_info()[1]
        self._leave(failure_text(exc), caused_by(exc))

    def _leave(self, failure: str | None, cause: int | None = None) -> None:
        """Destroy every group and say goodbye; a failing rank records ``failure`` (caused by rank ``cause``'s) first."""
        failed = failure is not None
        if failed:
            self.store.record_failure(failure, cause)
            self._close_network(failed=True)  # fails this rank's pending operations: nothing below waits for them
        for g in self.groups:
            g.destroy()
        self.groups, self.default_group, self.backend = [], None, None
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._hook
        atexit.unregister(self._at_exit)
        self._close_network(failed=failed)
        self.goodbye(failed=failed)
        set_process_world(None)
