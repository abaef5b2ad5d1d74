"""What makes rank threads behave like separate processes, with any number of simulations at once.

- Global random number generators (``random``, numpy's legacy global generator and
  torch's CPU generator) are saved and restored at every switch between ranks. Rank
  ``r`` starts with each of them seeded with ``r``, so a run does not depend on the
  caller's state and seeding one rank never changes another.
- ``os.environ`` is per rank: each rank starts with a copy of the environment as it was when
  the run started, and what it sets stays its own (``setup()`` functions that set MASTER_PORT
  change neither the other ranks nor the caller). Only Python-level reads see a rank's copy.
- Optionally, ``sys.stdout`` is prefixed ``[rank N]`` line by line; with ``capture_output`` what a rank writes to
  ``sys.stdout`` and ``sys.stderr`` is kept on its ``RankState`` instead of printed.
- Rank threads run on one CPU core. Only one runs at a time anyway, and handing the
  baton to a thread on the same core is several times faster than waking another
  core (``pin_cpu``). The caller's intra-op thread pool is created before any pinning, so
  it keeps every core; each rank does its own intra-op work on its own thread, as torchrun's
  ranks do with ``OMP_NUM_THREADS=1`` (``_threads``).
- With ``cuda_as_cpu`` (the default on a machine without CUDA), each rank sees a node of
  ``gpus_per_node`` simulated GPUs backed by the CPU, so GPU code runs unchanged
  (``simdist.torch_bridge.cuda``).
- ``torch.multiprocessing.spawn`` on a rank raises a clear error (``simdist.torch_bridge.spawn``).

Several simulations may run at once, each started from its own thread (a Streamlit server
serves every browser session from a thread of one process); each gives exactly what it
gives alone: the same values, schedule and trace. What they share is process-wide:

- *Turns.* One rank thread, of any simulation, runs at a time: a rank takes the turn
  (:func:`take_turn`) when it receives its simulation's baton and installs its generator
  states, and gives it up (:func:`end_turn`) at its next scheduling point once they are
  saved; within a short time slice the turn goes along with the baton to the next rank
  of the same run. The baton is always taken before the turn, and no thread waits for a
  baton while holding the turn, so the two cannot deadlock. A run that times out gives
  up the turn of its rank that is stuck (:func:`abandon`): the others go on.
- *Stand-ins.* While any simulation runs, ``sys.stdout``, ``sys.stderr`` and ``os.environ`` are replaced
  by objects that answer per thread (a rank thread: its prefix, its captured output and its environment; any
  other thread: the real ones), and torch's hooks are installed; the first simulation
  to start installs them and the last to end removes them and puts back the generator
  states, ``sys.stdout``, ``sys.stderr`` and ``os.environ`` the process had when the first started.
  The stand-in of a stream is made once and kept (:func:`_stand_in`): CPython's
  ``print()`` holds ``sys.stdout`` by a borrowed reference while it writes, so a stand-in freed
  when the last run ends would crash a print that another thread had begun beside it.
- The global generators stay process-wide: a thread that is not a rank thread and draws
  from them while simulations run draws from the running rank's states, and that rank
  then no longer draws what it draws alone (the app's pages draw only on ranks).
- ``simulate`` on a rank thread raises: simulations do not nest.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import platform
import random
import sys
import threading
import time
from collections.abc import Iterator, MutableMapping
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import numpy as np
import torch

from simdist import torch_bridge
from simdist.core import user_tracer

from . import _threads

if TYPE_CHECKING:
    from ._state import RankState, Settings

__all__ = [
    "ThreadRanks",
    "abandon",
    "end_turn",
    "held",
    "pin_target",
    "pin_thread",
    "refuse_nested",
    "take_turn",
]

SLICE = 0.002
"""Seconds of real time a run keeps the turn while its ranks pass the baton among themselves (then it lets
other runs in): fewer hand-offs between runs, which wake threads of other runs."""

_local = threading.local()  # on a rank thread: .rank, .environ (its own copy), .prefix and .at_start (stdout),
# .output (with capture_output: its RankState's output), .core (the core it is pinned to, None: not pinned; set up
# once per thread)


class _Shared:
    """What the simulations running in this process share, and what the process had before the first."""

    def __init__(self) -> None:
        self.turn = threading.Lock()  # held by the one rank thread, of any simulation, running user code
        self.holder: dict[Any, bool] = {}  # {the rank (RankState) holding the turn: True}; popped by who gives it up
        self.slice_end = 0.0  # when the run holding the turn is to release it (time.perf_counter)
        self.gauss_pending = True  # whether the installed states may hold numpy's cached normal
        self.setup = threading.Lock()  # held while a simulation starts or ends
        self.runs = 0
        self.saved: tuple | None = None  # the process's generators, sys.stdout, os.environ and sys.stderr
        self.environ: tuple[dict, dict] = ({}, {})  # os.environ's raw bytes and its decoded copy, when last read


_shared = _Shared()


class RunSetup(NamedTuple):
    """What :meth:`ThreadRanks.enter` gives a run for its rank threads (:meth:`ThreadRanks.enter_thread`)."""

    environ: dict[str, str]  # the environment each rank's copy starts as
    torch_store: Any  # the store torch's rendezvous gives the ranks
    user_trace: Any  # the caller's sys.settrace function, blind to simdist (or None)


class ThreadRanks:
    """The engine's rank hooks in threads mode: each rank thread made to behave like a process of its own.

    The engine calls, in this order: :meth:`enter` once, as the run starts; on each rank's thread
    :meth:`take_turn` before it runs, :meth:`enter_thread`, then at each hand-off :meth:`end_turn` and
    :meth:`take_turn` again, and :meth:`leave_thread` once its function has returned; :meth:`abandon` for a
    run that timed out; :meth:`leave` once every rank thread has ended. (Ranks as processes have the same
    hooks: ``ProcessRanks``.)
    """

    def __init__(self, settings: Settings):
        self.settings = settings
        self.setup = RunSetup({}, None, None)

    def enter(self) -> None:
        """Set up process-wide isolation for the run (the first run installs the stand-ins)."""
        refuse_nested()
        with _shared.setup:
            _share()
            torch_bridge.spawn.install()
            if self.settings.cuda_as_cpu:
                torch_bridge.cuda.install()
            environ = _environ_copy(_shared.saved[4])
        # Hypothesis's explain phase also sees the ranks' lines through the caller's tracer
        self.setup = RunSetup(environ, torch_bridge.ranks.new_store(), user_tracer(sys.gettrace()))

    def leave(self) -> None:
        """Undo :meth:`enter` (the last run puts back what the process had before the first)."""
        with _shared.setup:
            torch_bridge.spawn.uninstall()
            if self.settings.cuda_as_cpu:
                torch_bridge.cuda.uninstall()
            _unshare()

    def take_turn(self, rs: RankState, aborting: bool) -> None:
        """Wait for the turn, unless it came with the baton, then install rank ``rs``'s generator states
        (not in a run that is ``aborting``: its ranks unwind with whatever states are installed)."""
        take_turn(rs, aborting, self.settings.size)

    def end_turn(self, rs: RankState, to: RankState | None = None, done: bool = False) -> None:
        """Save rank ``rs``'s generator states and give up the turn (to ``to`` within the time slice)."""
        end_turn(rs, to, done)

    def abandon(self, ranks: list) -> bool:
        """Give up the turn for whichever of ``ranks`` holds it; whether one did."""
        return abandon(ranks)

    def enter_thread(self, rs: RankState, now: Callable[[], float]) -> None:
        """Make the calling thread rank ``rs`` (its environment, prefix, torch world, core; ``now``: its virtual
        time, for the simulated GPUs' events)."""
        settings, setup = self.settings, self.setup
        _local.rank = rs.rank
        _local.environ = dict(setup.environ)
        _local.prefix = f"[rank {rs.rank}] " if settings.prefix_output else None
        _local.at_start = True
        _local.output = rs.output
        torch_bridge.ranks.enter_rank(setup.torch_store)
        pin_thread(settings.pin_core)
        if settings.cuda_as_cpu:
            torch_bridge.cuda.enter_thread(settings.gpus_per_node, now)
        if setup.user_trace is not None:
            sys.settrace(setup.user_trace)

    def leave_thread(self, rs: RankState) -> None:
        """Undo :meth:`enter_thread` on the calling thread (a pooled thread's next run starts as a new thread)."""
        torch_bridge.ranks.leave_rank()
        _local.rank = _local.environ = _local.prefix = _local.output = None
        torch.set_grad_enabled(True)
        if self.settings.cuda_as_cpu:
            torch_bridge.cuda.leave_thread()
        if self.setup.user_trace is not None:
            sys.settrace(None)


def _carried() -> Callable[[], Callable[[], None]]:
    """For a thread a rank thread starts: ``enter``, which gives it the rank's environment (the same mapping, as a
    process's threads share one) and output (its prefix and capture), and returns ``leave``."""
    environ, prefix, output = (
        getattr(_local, "environ", None),
        getattr(_local, "prefix", None),
        getattr(_local, "output", None),
    )
    if environ is None:
        return lambda: _nothing

    def enter() -> Callable[[], None]:
        _local.environ, _local.prefix, _local.output, _local.at_start = environ, prefix, output, True
        return _leave_carried

    return enter


def _leave_carried() -> None:
    _local.environ = _local.prefix = _local.output = None


def _nothing() -> None:
    return None


torch_bridge.ranks.carry(_carried)


def refuse_nested() -> None:
    """Raise ``RuntimeError`` on a rank thread: simulations do not nest."""
    rank = getattr(_local, "rank", None)
    if rank is not None:
        raise RuntimeError(
            f"simulated rank {rank} started a simulation; simulations cannot be nested (a rank called "
            "simdist.simulate or simdist.spawn): start it from outside the simulated ranks"
        )


def _environ_copy(real: MutableMapping) -> dict[str, str]:
    """A copy of the process environment ``real``, decoded again only when its bytes changed (``setup`` held)."""
    data = getattr(real, "_data", None)  # os.environ's bytes, compared in C: cheaper than decoding every entry
    if not isinstance(data, dict):
        return dict(real)
    if data != _shared.environ[0]:
        _shared.environ = (dict(data), dict(real))
    return dict(_shared.environ[1])


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Keep the stand-ins installed from the first run to the last of a series (an exploration's runs).

    Saving and putting back the process's generators took a tenth of a short run. Meanwhile, code
    between the runs sees the stand-ins (which answer it as the real objects do) and draws from the
    generators as the last rank left them; the process's own states are back once the block ends.
    """
    with _shared.setup:
        _share()
    try:
        yield
    finally:
        with _shared.setup:
            _unshare()


def _share() -> None:
    """Count one more user of the stand-ins; the first installs them (``_shared.setup`` held)."""

    if _shared.runs == 0:
        _shared.saved = (
            random.getstate(), np.random.get_state(), torch.get_rng_state(), sys.stdout, os.environ, sys.stderr
        )  # fmt: skip
        _shared.gauss_pending = True
        torch_bridge.ranks.install()
        if sys.stdout is not None:
            sys.stdout = _stand_in(sys.stdout, "stdout")
        if sys.stderr is not None:
            sys.stderr = _stand_in(sys.stderr, "stderr")
        os.environ = _Environ(os.environ)  # type: ignore[assignment]  # noqa: B003 - put back by _unshare()
    _shared.runs += 1


def _unshare() -> None:
    """Count one user fewer; the last puts back what the process had before the first (``_shared.setup`` held)."""

    _shared.runs -= 1
    if _shared.runs > 0:
        return
    torch_bridge.ranks.uninstall()
    py, npy, th, stdout, environ, stderr = _shared.saved
    _shared.saved = None
    os.environ = environ  # noqa: B003 - the real mapping again
    _restore_c_environment(environ)
    random.setstate(py)
    np.random.set_state(npy)
    torch.set_rng_state(th)
    for name, stream in (("stdout", stdout), ("stderr", stderr)):
        current = getattr(sys, name)
        if isinstance(current, _Stream):
            current.flush()
        setattr(sys, name, stream)


class _RawState:
    """Copies the raw bytes of a generator's state: exact, and ~50x faster than get/set_state.

    Used only when a self-test at import shows that the bytes at ``address`` are the
    whole state (the layout of CPython's ``random.Random``, numpy's MT19937 and torch's
    CPU generator); otherwise the public get/set API is used.
    """

    def __init__(self, address: int, size: int):
        # a view of the bytes: copying through it is several times faster than ctypes.string_at/memmove
        self.view = memoryview((ctypes.c_char * size).from_address(address)).cast("B")
        self.get = self.view.tobytes

    def set(self, data: bytes) -> None:
        self.view[:] = data


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


def _verified(raw: _RawState, get, put, draw, times: int = 700) -> _RawState | None:
    """``raw`` if restoring its bytes gives back the same ``times`` draws as the public API's ``put``, else ``None``."""
    saved = get()
    try:
        snap = raw.get()
        first = [draw() for _ in range(times)]
        raw.set(snap)
        again = [draw() for _ in range(times)]
        put(saved)
        via_api = [draw() for _ in range(times)]
        return raw if first == again == via_api else None
    except Exception:  # noqa: BLE001 - any failure means: use the public API
        return None
    finally:
        put(saved)


def _torch_raw() -> _RawState | None:
    """The CPU generator of torch: its MT19937 engine and cached normal samples, found in the generator's memory.

    ``torch.default_generator`` (a ``THPGenerator``: the object header, then a pointer to the
    ``CPUGeneratorImpl``) holds ``uint64 seed; int left; bool seeded; uint32 next;
    uint32 state[624]`` followed by two ``std::optional`` normal samples (float, double).
    The engine is found by searching the first bytes of the generator for the state words
    that ``get_state`` reports, and used only if restoring its bytes gives back exactly the
    draws and the ``get_state`` of the public API.
    """
    if platform.python_implementation() != "CPython":
        return None
    gen = torch.default_generator
    saved = gen.get_state()
    try:
        impl = ctypes.c_void_p.from_address(id(gen) + object.__basicsize__).value
        if not impl or impl % ctypes.alignment(ctypes.c_void_p):  # not a pointer to an object: another layout
            return None
        state = saved.numpy().tobytes()
        if len(state) < 24 + 624 * 8:
            return None
        words = np.frombuffer(state, dtype="<u8", count=624, offset=24).astype("<u4").tobytes()
        at = ctypes.string_at(impl, _TORCH_SEARCH + 64).find(words[:64])
        if at < 20 or at % 4:
            return None
        start = at - 20  # seed (8 bytes), left (4), seeded (1, padded to 4), next (4)
        end = (at + 624 * 4 + 8 + 7) // 8 * 8 + 16  # the state, optional<float>, then an 8-aligned optional<double>
        raw = _RawState(impl + start, end - start)
    except Exception:  # noqa: BLE001 - any failure means: use the public API
        return None
    finally:
        gen.set_state(saved)

    def draw() -> tuple:
        return (
            torch.rand(3).tolist(),
            torch.randn(1).item(),
            torch.randn(5).tolist(),
            torch.empty(2).normal_().tolist(),
            torch.randint(0, 2**40, (2,)).tolist(),
            torch.randperm(7).tolist(),
            gen.get_state().numpy().tobytes(),
        )

    return _verified(raw, gen.get_state, gen.set_state, draw, 100)  # ~30 words a draw: the state turns over


_TORCH_SEARCH = 512
"""How many bytes of torch's generator object are searched for its engine (it lies near the start)."""

_PY = _python_raw()
_NP = _numpy_raw()
_TORCH = torch.default_generator
_TORCH_RAW = _torch_raw()


class _RngState:
    """One rank's generator states: raw bytes where possible, else the public API's values."""

    __slots__ = ("np", "np_full", "np_gauss", "py", "py_gauss", "seed", "torch")

    def capture(self) -> _RngState:
        """Take the generators' current states into this one; a state equal to the one held stays the object held.

        (A rank that drew nothing keeps the bytes it was given: no new memory per rank and turn.)
        """
        py = _PY.get() if _PY else random.getstate()
        if py != getattr(self, "py", None):
            self.py = py
        self.py_gauss = random._inst.gauss_next
        cur = _NP.get() if _NP else None
        held = getattr(self, "np", None)
        # numpy's legacy normal() caches a second value (has_gauss) outside the MT bytes:
        # take the full state whenever the bytes moved or a cached value is pending.
        if _NP is None or cur != held or self.np_gauss:
            self.np_full = np.random.get_state()
            self.np_gauss = bool(self.np_full[3])
        if cur != held:
            self.np = cur
        state = _TORCH_RAW.get() if _TORCH_RAW else _TORCH.get_state()
        if _TORCH_RAW is None or state != getattr(self, "torch", None):
            self.torch = state
        return self

    def install(self, gauss_pending: bool) -> None:
        if _PY:
            _PY.set(self.py)
        else:
            random.setstate(self.py)
        random._inst.gauss_next = self.py_gauss
        if _NP and not (self.np_gauss or gauss_pending):
            _NP.set(self.np)
        elif self.np_full is None:  # still the state of seeding with ``seed`` (its bytes never moved)
            np.random.seed(self.seed)
        else:
            np.random.set_state(self.np_full)
        if _TORCH_RAW:
            _TORCH_RAW.set(self.torch)
        else:
            _TORCH.set_state(self.torch)


SEEDS_KEPT = 1024
"""How many ranks' seeded states a process keeps (the runs of an exploration reuse them); larger worlds seed in place."""


def _fresh_states(rank: int) -> _RngState:
    """Seed each generator with ``rank``: their states right after (the generators are left so)."""
    random.seed(rank)
    np.random.seed(rank)
    torch.default_generator.manual_seed(rank)
    state = _RngState()
    state.seed, state.np_full, state.np_gauss = rank, None, False
    if _NP:  # numpy's full state (22 µs to read) is needed only once its bytes move: seeding gives it back till then
        state.np = _NP.get()
    return state.capture()


@functools.lru_cache(maxsize=SEEDS_KEPT)
def _seed_states(rank: int) -> _RngState:
    """The generator states right after seeding each generator with ``rank`` (shared: never changed)."""
    return _fresh_states(rank)


def _seeded(rank: int, gauss_pending: bool, world: int) -> _RngState:
    """Install the states of each generator seeded with ``rank`` (as a rank starts); the rank's own copy of them.

    In a world of more than ``SEEDS_KEPT`` ranks each rank seeds the generators itself: kept
    states would only cycle through the cache.
    """
    if world > SEEDS_KEPT:
        return _fresh_states(rank)
    seeded, state = _seed_states(rank), _RngState()
    for name in _RngState.__slots__:
        setattr(state, name, getattr(seeded, name))
    state.install(gauss_pending)
    return state


def take_turn(rs: RankState, aborting: bool, world: int) -> None:
    """Wait for the turn, unless it came with the baton, then install rank ``rs``'s generator states.

    A rank of a run that is ``aborting`` unwinds with whatever states are installed.
    """
    if rs not in _shared.holder:
        _shared.turn.acquire()
        _shared.holder[rs] = True
        _shared.slice_end = time.perf_counter() + SLICE
    if aborting:
        return
    if rs.rng is None:
        rs.rng = _seeded(rs.rank, _shared.gauss_pending, world)
    else:
        rs.rng.install(_shared.gauss_pending)
    _shared.gauss_pending = rs.rng.np_gauss


def end_turn(rs: RankState, to: RankState | None = None, done: bool = False) -> None:
    """Save rank ``rs``'s generator states and give up the turn: it is about to pass the baton to ``to``.

    Within its run's time slice the turn goes with the baton to ``to``; after it (or without
    ``to``) the turn is released for any rank of any run. A rank that is ``done`` (finished,
    or unwound) saves nothing. A rank whose run timed out and gave up the turn for it
    (:func:`abandon`) gives up nothing: whoever pops the holder's entry (one atomic step)
    releases the turn, so it is released once.
    """
    state = None if done else (rs.rng or _RngState()).capture()
    if _shared.holder.pop(rs, False):
        # with no state saved, the rank may have drawn a normal since its last save
        _shared.gauss_pending = True if state is None else state.np_gauss
        if state is not None:
            rs.rng = state
        if to is not None and time.perf_counter() < _shared.slice_end:
            _shared.holder[to] = True
        else:
            _shared.turn.release()


def abandon(ranks: list) -> bool:
    """Give up the turn for whichever of ``ranks`` holds it (a run that timed out, its rank stuck outside simdist).

    Returns whether one of them held it.
    """
    for rs in ranks:
        if _shared.holder.pop(rs, False):
            _shared.gauss_pending = True
            _shared.turn.release()
            return True
    return False


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


def pin_thread(core: int | None) -> None:
    """Run the calling rank thread on ``core`` (``None``: on the process's cores), its intra-op work on it alone."""
    if getattr(_local, "core", False) is False:  # a new thread (a pooled one is set up by its first run)
        _threads.one_thread()
        _local.core = None
    if core != _local.core:
        os.sched_setaffinity(0, {core} if core is not None else os.sched_getaffinity(os.getpid()))
        _local.core = core


_WRITTEN: set[str] = set()
"""Variables rank threads set in the C environment while simulations run (put back when the last ends)."""


def _restore_c_environment(real: MutableMapping) -> None:
    """Put the C environment's variables that ranks set back to what the real ``os.environ`` holds."""
    for key in _WRITTEN:
        value = real.get(key)
        if value is None:
            os.unsetenv(key)
        else:
            os.putenv(key, value)
    _WRITTEN.clear()


class _Environ(MutableMapping):
    """``os.environ`` while simulations run: each rank thread sees and edits its own copy.

    A rank's copy is the environment as it was when its run started. Any other thread (a
    caller, threads a rank starts) sees and edits the real environment. Only Python-level
    reads see a rank's copy: subprocesses started without ``env=`` see the process environment.
    A variable a rank sets is also set in the process's C environment, which C code reads with
    ``getenv`` (inductor's compiled modules read there what torch's Python sets): the rank threads
    of a process share that one, and it is put back when the last simulation ends.
    """

    def __init__(self, real: MutableMapping) -> None:
        self.real = real

    def _env(self) -> MutableMapping:
        env = getattr(_local, "environ", None)
        return self.real if env is None else env

    def __getitem__(self, key: str) -> str:
        return self._env()[key]

    def __setitem__(self, key: str, value: str) -> None:
        env = self._env()
        env[key] = value
        if env is not self.real:
            os.putenv(key, value)
            _WRITTEN.add(key)

    def __delitem__(self, key: str) -> None:
        del self._env()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._env()))

    def __len__(self) -> int:
        return len(self._env())

    def copy(self) -> dict[str, str]:
        return dict(self._env())


_STAND_INS: dict[tuple[int, str], _Stream] = {}
"""The stand-in made for each stream (by ``id`` and name; each holds its stream, so no id is reused)."""
MAX_STAND_INS = 64
"""Stand-ins kept at most; past that the oldest is dropped (a process that keeps replacing ``sys.stdout``)."""


def _stand_in(stream: Any, name: str) -> _Stream:
    """The stand-in of ``stream`` as ``sys.<name>``: the same object every time, so that it outlives any ``print``
    writing to it."""
    if isinstance(stream, _Stream):  # kept from an earlier run by the program, and put back
        return stream
    key = (id(stream), name)
    stand_in = _STAND_INS.get(key)
    if stand_in is None:
        if len(_STAND_INS) >= MAX_STAND_INS:
            del _STAND_INS[next(iter(_STAND_INS))]
        stand_in = _STAND_INS[key] = _Stream(stream, name == "stderr")
    return stand_in


class _Stream:
    """``sys.stdout`` or ``sys.stderr`` while simulations run. On a rank thread of a run with ``capture_output`` the
    text is kept on the rank; else on a rank thread of a run with ``prefix_output`` each line of stdout starts
    ``[rank N]``; everything else is written as is."""

    def __init__(self, inner: Any, is_stderr: bool):
        self.inner, self.is_stderr = inner, is_stderr

    def write(self, text: str) -> int:
        output = getattr(_local, "output", None)
        if output is not None:
            if not isinstance(text, str):
                raise TypeError(f"write() argument must be str, not {type(text).__name__}")
            output[self.is_stderr].append(text)
            return len(text)
        prefix = None if self.is_stderr else getattr(_local, "prefix", None)
        if prefix is None:
            return self.inner.write(text)
        out = []
        for line in text.splitlines(keepends=True):
            if _local.at_start:
                out.append(prefix)
            out.append(line)
            _local.at_start = line.endswith("\n")
        return self.inner.write("".join(out)) and len(text)

    def flush(self) -> None:
        self.inner.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
