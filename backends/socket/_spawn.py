"""``simdist.spawn(..., backend="socket")``: one process per rank on this machine."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import time
import traceback
from multiprocessing.connection import wait
from typing import Any, Callable

from simdist.core import DistTimeoutError, PeerLostError, RankError, add_note
from simdist.core import BACKEND_ENV, SERVED_ENV, STORE_ENV, free_port

__all__ = ["spawn"]

SETTLE_S = 5.0
"""How long spawn waits for the original error once a rank reported only another rank's failure (or a timeout)."""


def _send(conn: Any, message: tuple) -> None:
    """Send ``message`` pickled by value.

    ``Connection.send`` would use the ``ForkingPickler``, whose torch reductions pass a
    tensor as a shared-memory file descriptor that is gone once the rank has exited.
    """
    conn.send_bytes(pickle.dumps(message))


def _child(fn: Callable, args: tuple, rank: int, world_size: int, env: dict, conn: Any, forked: bool) -> None:
    os.environ.update(env)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank))
    if forked:  # the parent's OpenMP pool does not survive fork(): a parallel torch op would wait for it forever
        import torch

        torch.set_num_threads(1)
    try:
        from simdist.torch_bridge import processes

        processes.install_from_env()  # torch.distributed code on the socket backend too
        value = fn(rank, *args)
        _send(conn, ("ok", value))
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent
        try:
            _send(conn, ("error", exc, traceback.format_exc()))
        except Exception:  # noqa: BLE001 - an exception that cannot be pickled travels as text
            _send(conn, ("error", RuntimeError(f"{type(exc).__name__}: {exc}"), traceback.format_exc()))
        raise SystemExit(1) from None
    finally:
        from simdist.core import current_world

        world = current_world()
        if world is not None and world.initialized:
            world.destroy(None)


def _context(start_method: str | None) -> Any:
    """``forkserver`` by default where it exists: one server imports torch once and forks each rank.

    Like ``spawn`` it starts ranks from a clean process (no inherited threads or locks) and
    needs a picklable ``fn``, but a rank starts in milliseconds instead of importing torch anew.
    """
    if start_method is None:
        start_method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(["torch", "simdist", "simdist.backends.socket"])
    return ctx


def _blames(err: RankError) -> int | None:
    """The rank that ``err`` (a rank's failure) says failed first: another rank, or -1 for a timeout."""
    cause = err.__cause__
    if isinstance(cause, PeerLostError) and cause.rank is not None and cause.rank != err.rank:
        return cause.rank
    return -1 if isinstance(cause, DistTimeoutError) else None


def _original(errors: dict[int, RankError], first: int) -> RankError:
    """The error to report: follow the ranks each error blames, from the first one reported."""
    rank, seen = first, {first}
    while (blamed := _blames(errors[rank])) in errors and blamed not in seen:
        rank = blamed
        seen.add(rank)
    primary = [r for r in errors if _blames(errors[r]) is None]
    return errors[rank] if _blames(errors[rank]) is None or not primary else errors[primary[0]]


def _stop(procs: list) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(2)
        if p.is_alive():
            p.kill()
            p.join()


def spawn(
    fn: Callable,
    args: tuple = (),
    nprocs: int = 1,
    daemon: bool = False,
    start_method: str | None = None,
    timeout: float | None = None,
    backend: str = "socket",
    **options: Any,
) -> list:
    """Run ``fn(rank, *args)`` in ``nprocs`` processes joined by ``backend``; return their values.

    ``backend`` is a process backend: ``"socket"``, or torch's (``"gloo"``, ``"torch-nccl"``),
    whose ranks start the same way.

    Each process sees the caller's environment as it is at the call, plus MASTER_ADDR,
    MASTER_PORT, RANK, LOCAL_RANK, WORLD_SIZE and a fresh SIMDIST_SECRET, as under torchrun,
    so ``init_process_group()`` needs no arguments; simdist's store listens at another port
    (SIMDIST_STORE), so MASTER_PORT is free for a torch program's ``TCPStore``. With
    ``backend="socket"``, ``torch.distributed`` code in ``fn`` runs on the socket backend too
    (:mod:`simdist.torch_bridge.processes`). The first rank to fail stops the others
    and raises ``RankError`` with its exception as ``__cause__``; a rank that failed only
    because another did (a ``PeerLostError`` naming it) or timed out waits up to
    ``SETTLE_S`` seconds for the original error, which is the one raised. No process
    outlives the call. Return values travel pickled by value.

    ``start_method="fork"`` lets ``fn`` be a closure; each forked rank then runs torch on one
    intra-op thread (``torch.set_num_threads(1)``), because OpenMP's thread pool does not
    survive ``fork()`` and the first parallel torch operation would hang.
    """
    if options:
        raise TypeError(f"spawn(backend={backend!r}) got unexpected keyword arguments {sorted(options)}")
    from ._auth import new_secret

    from simdist.torch_bridge.processes import TORCH_BACKEND_ENV

    master_port, store_port = free_port(), free_port()
    while store_port == master_port:
        store_port = free_port()
    env = {
        **os.environ,  # the caller's environment now: a forkserver started earlier would hand out its own
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(master_port),  # torch's, as under torchrun: a torch program's TCPStore listens there
        STORE_ENV: f"127.0.0.1:{store_port}",  # simdist's store, served by rank 0
        "WORLD_SIZE": str(nprocs),
        "LOCAL_WORLD_SIZE": str(nprocs),
        "SIMDIST_SECRET": new_secret(),
        BACKEND_ENV: backend,
    }
    env.pop(SERVED_ENV, None)
    env.pop(TORCH_BACKEND_ENV, None)
    if backend == "socket":
        env[TORCH_BACKEND_ENV] = "socket"
    if timeout is not None:
        env["SIMDIST_TIMEOUT"] = str(timeout)
    ctx = _context(start_method)
    pipes = [ctx.Pipe(duplex=False) for _ in range(nprocs)]
    forked = ctx.get_start_method() == "fork"
    procs = [
        ctx.Process(
            target=_child, args=(fn, args, r, nprocs, env, pipes[r][1], forked), daemon=daemon, name=f"simdist-rank-{r}"
        )
        for r in range(nprocs)
    ]
    for p in procs:
        p.start()
    for _, w in pipes:
        w.close()
    values: dict[int, Any] = {}
    errors: dict[int, RankError] = {}
    readers = {pipes[r][0]: r for r in range(nprocs)}
    settle_by: float | None = None
    try:
        while readers and not any(_blames(e) is None for e in errors.values()):
            ready = wait(list(readers), None if settle_by is None else max(settle_by - time.monotonic(), 0.0))
            if not ready:
                break  # only secondary errors came within SETTLE_S
            for conn in ready:
                r = readers.pop(conn)
                try:
                    status, *payload = pickle.loads(conn.recv_bytes())
                except EOFError:  # the process ended without sending anything: it died
                    procs[r].join(5)
                    code = procs[r].exitcode
                    errors[r] = RankError(r, ChildProcessError(f"rank {r} died (exit code {code}) without a result"))
                    continue
                if status == "error":
                    exc, text = payload
                    add_note(exc, f"traceback in rank {r}:\n{text}")
                    errors[r] = RankError(r, exc)
                else:
                    values[r] = payload[0]
            if errors and settle_by is None:
                settle_by = time.monotonic() + SETTLE_S
    finally:
        _stop(procs)
    if errors:
        raise _original(errors, next(iter(errors)))
    return [values[r] for r in range(nprocs)]
