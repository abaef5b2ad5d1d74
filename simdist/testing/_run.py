"""``run`` and ``replay``: one simulated run for a test, its failures checked to replay identically."""

from __future__ import annotations

import os
import random
import sys
import sysconfig
import threading
import time
from typing import Any, Callable

from simdist._errors import DistError, RankError

__all__ = ["run", "replay", "NondeterminismError", "Schedule"]

# The seeds of runs given no seed, schedule or strategy. Registered with Hypothesis (below),
# which resets it for each example, so a seedless run inside a Hypothesis test repeats exactly;
# outside Hypothesis successive runs get different seeds. Draw schedules() to vary interleavings.
_SEEDS = random.Random(0)
try:
    from hypothesis import register_random

    register_random(_SEEDS)
except ImportError:  # pragma: no cover - hypothesis is a dependency
    pass


class Schedule(list):
    """A list of scheduler choices (what :func:`simdist.testing.schedules` draws); ``repr`` is its token.

    Choice 0 keeps the running rank (or takes the lowest runnable one); choices past the
    end of the list are 0. So shorter lists of smaller numbers are simpler schedules.
    """

    @property
    def token(self) -> str:
        from simdist.backends.sim._strategies import encode_choices

        return encode_choices(self)

    def __repr__(self) -> str:
        return f"Schedule({self.token!r})"


class NondeterminismError(DistError):
    """A failing run did not fail the same way when replayed: the program is not deterministic.

    Attributes:
        first: the error of the original run; ``second``: what the replay gave (an
            error, or ``None`` if it passed); ``causes``: what the check saw the
            program do that a simulation cannot control.
    """

    def __init__(self, message: str, first: BaseException, second: BaseException | None, causes: list[str]):
        super().__init__(message)
        self.first, self.second, self.causes = first, second, causes


def _options_from(seed, strategy, schedule) -> dict:
    from simdist._pytest_plugin import OPTIONS

    if OPTIONS["replay"] is not None:
        return {"schedule": OPTIONS["replay"]}
    if schedule is not None:
        return {"schedule": list(schedule) if isinstance(schedule, Schedule) else schedule}
    if strategy is None and seed is None:
        seed = _SEEDS.randrange(1 << 32)
    return {"seed": seed, "strategy": strategy}


def run(fn: Callable, nprocs: int, *, args: tuple = (), seed: int | None = None, strategy: Any = None,
        schedule: Any = None, detail: str = "messages", topology: Any = None, eager_limit: int = 0,
        timeout: float | None = None, **options: Any) -> Any:
    """Run ``fn(rank, *args)`` on ``nprocs`` simulated ranks: a ``SimResult`` (``values``, ``trace``, ``schedule``).

    Like :func:`simdist.simulate`, which does the work. With no ``seed``, ``strategy`` or
    ``schedule`` the seed comes from a generator registered with Hypothesis. Under
    ``pytest --simdist-replay TOKEN`` every run replays ``TOKEN``. A failing run is
    replayed once before its error is raised: if the replay does not fail the same way,
    :class:`NondeterminismError` says what in the program is not under the simulator's
    control. The error's ``schedule`` is the replay token.
    """
    from simdist.backends.sim import simulate

    kwargs = dict(detail=detail, topology=topology, eager_limit=eager_limit, timeout=timeout, **options)
    kwargs.setdefault("leaks", "ignore")
    kwargs.setdefault("check_buffers", True)
    chosen = _options_from(seed, strategy, schedule)
    try:
        return simulate(fn, nprocs, args, **chosen, **kwargs)
    except DistError as err:
        if err.schedule is None:
            raise
        check_replays(fn, nprocs, args, err, kwargs)
        raise


def replay(fn: Callable, nprocs: int, token: str, args: tuple = (), **options: Any) -> Any:
    """Rerun exactly the interleaving of ``token`` (a failure's ``.schedule``): its ``SimResult``, or its error."""
    if not isinstance(token, str):
        raise TypeError(f"token must be a replay token (str), got {type(token).__name__} ({token!r:.60})")
    return run(fn, nprocs, args=args, schedule=token, **options)


def same_failure(a: BaseException, b: BaseException | None) -> bool:
    """Whether ``b`` is the failure ``a`` is: same type, same rank and cause type for a ``RankError``."""
    if b is None or type(a) is not type(b):
        return False
    if isinstance(a, RankError):
        return a.rank == b.rank and type(a.__cause__) is type(b.__cause__)
    return True


def check_replays(fn: Callable, nprocs: int, args: tuple, err: DistError, kwargs: dict) -> None:
    """Replay ``err``'s schedule; raise :class:`NondeterminismError` from ``err`` if it does not fail the same way."""
    from simdist.backends.sim import simulate

    try:
        simulate(fn, nprocs, args, schedule=err.schedule, **kwargs)
        second = None
    except DistError as again:
        second = again
    if same_failure(err, second):
        return
    causes = _diagnose(fn, nprocs, args, err.schedule, kwargs)
    outcome = "passed" if second is None else f"raised {type(second).__name__}"
    raise NondeterminismError(
        f"the run failed with {type(err).__name__}, but its replay ({err.schedule}) {outcome}: the program does "
        "something the simulator does not control, so its schedule cannot be replayed.\n  " + "\n  ".join(causes),
        err, second, causes,
    ) from err


def _library_dirs() -> tuple[str, ...]:
    import simdist
    import simdist.backends
    import simdist.visualize

    packages = [os.path.dirname(os.path.abspath(m.__file__)) for m in (simdist, simdist.backends, simdist.visualize)]
    paths = sysconfig.get_paths()
    return tuple(d + os.sep for d in (*packages, paths["stdlib"], paths["purelib"]))


_LIBRARY = _library_dirs()


def _user_caller() -> str | None:
    """``file:line`` of the caller's caller if it is the user's code (not simdist, the stdlib or a package)."""
    frame = sys._getframe(2)
    name = frame.f_code.co_filename
    if name.startswith(_LIBRARY) or name.startswith("<frozen"):
        return None
    return f"{name}:{frame.f_lineno}"


def _diagnose(fn: Callable, nprocs: int, args: tuple, token: str, kwargs: dict) -> list[str]:
    """Rerun with the clocks and ``Thread.start`` watched; what the program did that a replay cannot repeat."""
    from simdist.backends.sim import simulate

    seen: dict[str, set[str]] = {"clock": set(), "thread": set()}
    clocks = ("time", "time_ns", "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns")
    originals = {name: getattr(time, name) for name in clocks}
    start = threading.Thread.start

    def watch(name: str, real: Callable) -> Callable:
        def clock(*a: Any) -> Any:
            site = _user_caller()
            if site is not None:
                seen["clock"].add(f"time.{name}() at {site}")
            return real(*a)

        return clock

    def watched_start(thread: threading.Thread) -> None:
        site = _user_caller()
        if site is not None:
            seen["thread"].add(f"a thread started at {site}")
        start(thread)

    for name, real in originals.items():
        setattr(time, name, watch(name, real))
    threading.Thread.start = watched_start
    try:
        simulate(fn, nprocs, args, schedule=token, **kwargs)
    except BaseException:  # noqa: BLE001 - only what the program touched matters here
        pass
    finally:
        for name, real in originals.items():
            setattr(time, name, real)
        threading.Thread.start = start
    causes = [f"it reads the clock: {s}" for s in sorted(seen["clock"])]
    causes += [f"it starts its own threads (the simulator schedules only rank threads): {s}"
               for s in sorted(seen["thread"])]
    if not causes:
        causes = ["it depends on state outside the run: global variables changed by an earlier run, "
                  "unseeded randomness (os.urandom, uuid, hash() of str across processes), files or the network"]
    return causes
