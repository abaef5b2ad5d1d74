"""What makes rank threads behave like separate processes.

- Global random number generators (``random``, numpy's legacy global generator and
  torch's CPU generator) are saved and restored at every switch between ranks. Rank
  ``r`` starts with each of them seeded with ``r``, so a run does not depend on the
  caller's state and seeding one rank never changes another. The caller's states are
  restored when the run ends.
- ``os.environ`` is per rank: each rank starts with a copy of the environment as it was when
  the run started, and what it sets stays its own (``setup()`` functions that set MASTER_PORT
  change neither the other ranks nor the caller). Only Python-level reads see a rank's copy.
- Optionally, ``sys.stdout`` is prefixed ``[rank N]`` line by line.
- Rank threads run on one CPU core. Only one runs at a time anyway, and handing the
  baton to a thread on the same core is several times faster than waking another
  core (``pin_cpu``). The caller's intra-op thread pool is created before any pinning, so
  it keeps every core; each rank does its own intra-op work on its own thread, as torchrun's
  ranks do with ``OMP_NUM_THREADS=1`` (``_threads``).
- With ``cuda_as_cpu`` (the default on a machine without CUDA), each rank sees a node of
  ``gpus_per_node`` simulated GPUs backed by the CPU, so GPU code runs unchanged
  (``simdist._torch_cuda``).
- ``torch.multiprocessing.spawn`` on a rank raises a clear error (``simdist._torch_spawn``).
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import random
import sys
import threading
from collections.abc import Iterator, MutableMapping
from typing import Any

import numpy as np
import torch

from simdist import _torch_cuda, _torch_spawn

from . import _threads

__all__ = ["enter", "leave", "enter_thread", "leave_thread", "save", "restore"]

_running = threading.Lock()


def enter(engine: Any) -> tuple:
    """Set up process-wide isolation for a run; returns what :func:`leave` restores."""
    if not _running.acquire(blocking=False):
        raise RuntimeError(
            "a simulation is already running in this process; simulations cannot be nested "
            "(a rank called simdist.simulate or simdist.spawn)"
        )
    saved = (random.getstate(), np.random.get_state(), torch.get_rng_state(), sys.stdout, os.environ)
    if engine.prefix_output:
        sys.stdout = _Prefixed(sys.stdout, engine)
    engine.environ = _RankEnviron(os.environ)
    os.environ = engine.environ  # type: ignore[assignment]  # noqa: B003 - put back by leave()
    from simdist import _torch_bridge

    _torch_bridge.install(engine)
    _torch_spawn.install()
    if engine.cuda_as_cpu:
        _torch_cuda.install()
    return saved


def leave(engine: Any, saved: tuple) -> None:
    from simdist import _torch_bridge

    _torch_bridge.uninstall(engine)
    _torch_spawn.uninstall()
    if engine.cuda_as_cpu:
        _torch_cuda.uninstall()
    py, npy, th, stdout, environ = saved
    os.environ = environ  # noqa: B003 - the real mapping again
    random.setstate(py)
    np.random.set_state(npy)
    torch.set_rng_state(th)
    if engine.prefix_output:
        sys.stdout.flush()
        sys.stdout = stdout
    _running.release()


class _RawState:
    """Copies the raw bytes of a generator's state: exact, and ~50x faster than get/set_state.

    Used only when a self-test at import shows that the bytes at ``address`` are the
    whole state (the layout of CPython's ``random.Random`` and numpy's MT19937);
    otherwise the public get/set API is used.
    """

    def __init__(self, address: int, size: int):
        self.address, self.size = address, size

    def get(self) -> bytes:
        return ctypes.string_at(self.address, self.size)

    def set(self, data: bytes) -> None:
        ctypes.memmove(self.address, data, self.size)


def _python_raw() -> _RawState | None:
    """The Mersenne Twister of ``random`` (``int index; uint32 state[624]`` after the object header)."""
    if platform.python_implementation() != "CPython":
        return None
    return _verified(
        _RawState(id(random._inst) + 2 * ctypes.sizeof(ctypes.c_void_p), 4 + 624 * 4),
        random.getstate,
        random.setstate,
        lambda: random.getrandbits(64),
    )


def _numpy_raw() -> _RawState | None:
    """The MT19937 state of numpy's global RandomState (``uint32 key[624]; int pos``)."""
    bitgen = getattr(np.random.mtrand._rand, "_bit_generator", None)
    if type(bitgen).__name__ != "MT19937":
        return None
    return _verified(
        _RawState(bitgen.ctypes.state_address, 624 * 4 + 4),
        np.random.get_state,
        np.random.set_state,
        lambda: int(np.random.randint(0, 2**62)),
    )


def _verified(raw: _RawState, get, put, draw) -> _RawState | None:
    saved = get()
    try:
        snap = raw.get()
        first = [draw() for _ in range(700)]
        raw.set(snap)
        again = [draw() for _ in range(700)]
        put(saved)
        via_api = [draw() for _ in range(700)]
        return raw if first == again == via_api else None
    except Exception:  # noqa: BLE001 - any failure means: use the public API
        return None
    finally:
        put(saved)


_PY = _python_raw()
_NP = _numpy_raw()
_TORCH = torch.default_generator


class _RngState:
    """One rank's generator states: raw bytes where possible, else the public API's values."""

    __slots__ = ("py", "py_gauss", "np", "np_gauss", "np_full", "torch")

    def capture(self) -> "_RngState":
        self.py = _PY.get() if _PY else random.getstate()
        self.py_gauss = random._inst.gauss_next
        cur = _NP.get() if _NP else None
        # numpy's legacy normal() caches a second value (has_gauss) outside the MT bytes:
        # take the full state whenever the bytes moved or a cached value is pending.
        if _NP is None or cur != getattr(self, "np", None) or self.np_gauss:
            self.np_full = np.random.get_state()
            self.np_gauss = bool(self.np_full[3])
        self.np = cur
        self.torch = _TORCH.get_state()
        return self

    def install(self, gauss_pending: bool) -> None:
        if _PY:
            _PY.set(self.py)
        else:
            random.setstate(self.py)
        random._inst.gauss_next = self.py_gauss
        if _NP and not (self.np_gauss or gauss_pending):
            _NP.set(self.np)
        else:
            np.random.set_state(self.np_full)
        _TORCH.set_state(self.torch)


def _seeded(rank: int) -> _RngState:
    random.seed(rank)
    np.random.seed(rank)
    torch.default_generator.manual_seed(rank)
    return _RngState().capture()


def save(engine: Any, rs: Any) -> None:
    """Remember rank ``rs``'s generator states (it is about to lose the baton)."""
    rs.rng = (rs.rng or _RngState()).capture()
    engine.np_gauss_pending = rs.rng.np_gauss


def restore(engine: Any, rs: Any) -> None:
    """Install rank ``rs``'s generator states (it is about to get the baton)."""
    if rs.rng is None:
        rs.rng = _seeded(rs.rank)
    else:
        rs.rng.install(getattr(engine, "np_gauss_pending", True))
    engine.np_gauss_pending = rs.rng.np_gauss


def pin_target() -> int | None:
    """The core rank threads are pinned to, or ``None`` where pinning is unavailable."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    _start_intra_op_pool()
    return cores[-1]


_pool_started = False


def _start_intra_op_pool() -> None:
    """Run one parallel torch op on this (unpinned) thread so the pool is made with every core."""
    global _pool_started
    if not _pool_started:
        torch.ones(1 << 20).sum()
        _pool_started = True


def enter_thread(engine: Any, rs: Any) -> None:
    from simdist import _torch_bridge

    engine.environ.start_rank()
    _torch_bridge.enter_rank()
    _threads.one_thread()
    if engine.pin_core is not None:
        os.sched_setaffinity(0, {engine.pin_core})
    if engine.cuda_as_cpu:
        _torch_cuda.enter_thread(engine.gpus_per_node, functools.partial(engine.now, rs))


def leave_thread(engine: Any, rs: Any) -> None:
    from simdist import _torch_bridge

    _torch_bridge.leave_rank()
    engine.environ.end_rank()
    if engine.cuda_as_cpu:
        _torch_cuda.leave_thread()


class _RankEnviron(MutableMapping):
    """``os.environ`` while the simulator runs: each rank thread sees and edits its own copy.

    A rank's copy is the environment as it was when the run started. Any other thread (the
    caller, threads a rank starts) sees and edits the real environment. Only Python-level reads
    see a rank's copy: C code calling ``getenv`` and subprocesses started without ``env=`` see
    the process environment.
    """

    def __init__(self, base: MutableMapping) -> None:
        self.base = base
        self.start = dict(base)
        self.views: dict[int, dict[str, str]] = {}

    def start_rank(self) -> None:
        self.views[threading.get_ident()] = dict(self.start)

    def end_rank(self) -> None:
        self.views.pop(threading.get_ident(), None)

    def _env(self) -> MutableMapping:
        return self.views.get(threading.get_ident(), self.base)

    def __getitem__(self, key: str) -> str:
        return self._env()[key]

    def __setitem__(self, key: str, value: str) -> None:
        self._env()[key] = value

    def __delitem__(self, key: str) -> None:
        del self._env()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._env()))

    def __len__(self) -> int:
        return len(self._env())

    def copy(self) -> dict[str, str]:
        return dict(self._env())


class _Prefixed:
    """A stdout that starts every line with ``[rank N]`` of the rank writing it."""

    def __init__(self, inner: Any, engine: Any):
        self.inner = inner
        self.engine = engine
        self.at_start: dict[int, bool] = {}

    def write(self, text: str) -> int:
        rs = self.engine.current
        if rs is None or threading.current_thread() is threading.main_thread():
            return self.inner.write(text)
        prefix = f"[rank {rs.rank}] "
        out = []
        for line in text.splitlines(keepends=True):
            if self.at_start.get(rs.rank, True):
                out.append(prefix)
            out.append(line)
            self.at_start[rs.rank] = line.endswith("\n")
        return self.inner.write("".join(out)) and len(text)

    def flush(self) -> None:
        self.inner.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
