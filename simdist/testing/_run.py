"""``run`` and ``replay``: one simulated run for a test, its failures checked to replay identically."""

from __future__ import annotations

import os
import random
import shlex
import sys
import threading
import time
import warnings
from typing import Any, Callable

from pytest_simdist import OPTIONS

from simdist.core._callsite import is_user_file, trace_user_code, user_call_site
from simdist.core._errors import CollectiveMismatchError, DeadlockError, DistError, LeakWarning

from simdist.backends.sim import SimOptions

from ._check import check_argument
from ._explain import note_decisions
from ._program import Program
from ._schedule import Schedule

__all__ = [
    "NondeterminismError",
    "Schedule",
    "current_test",
    "failure_site",
    "replay",
    "replay_worlds",
    "run",
    "run_program",
    "run_script",
    "same_failure",
    "warn_leaks",
]
__tracebackhide__ = True  # pytest shows a failure's frames in the user's code, not simdist's

_UNDESTROYED = "(destroy_process_group)"  # how simulate lists groups never destroyed, which are not warned about

# The seeds of runs given no seed, schedule or strategy. Registered with Hypothesis (below),
# which resets it for each example, so a seedless run inside a Hypothesis test repeats exactly;
# outside Hypothesis successive runs get different seeds. Draw schedules() to vary interleavings.
_SEEDS = random.Random(0)
try:
    from hypothesis import register_random

    register_random(_SEEDS)
except ImportError:  # pragma: no cover - hypothesis is a dependency
    pass


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


def _how(nprocs: int, seed: Any, strategy: Any, schedule: Any) -> dict:
    """How a run is scheduled: ``pytest --simdist-replay``'s token, else the schedule, seed or strategy given, else a
    seed drawn from the generator Hypothesis resets."""
    if OPTIONS["replay"] is not None:
        return {"schedule": _replayed(OPTIONS["replay"], nprocs, OPTIONS["test"])}
    if schedule is not None:
        return {"schedule": schedule}
    if strategy is None and seed is None:
        seed = _SEEDS.randrange(1 << 32)
    return {"seed": seed, "strategy": strategy}


def current_test() -> str | None:
    """The node id of the pytest test running now (its runs' tokens record it), or ``None``."""
    return OPTIONS["test"]


def _replayed(token: str, nprocs: int, test: str | None) -> str:
    """``token`` of ``pytest --simdist-replay``, checked against the test and world size it was made for.

    Inside a Hypothesis test a run at another world size is rejected (as ``assume`` would), so
    only the examples at the token's size run.
    """
    from simdist.backends.sim import split_token

    _, world, made_for, _ = split_token(token)
    if made_for is not None and test is not None and made_for != test:
        raise ValueError(
            f"--simdist-replay {token} was made for the test {made_for}, not this one ({test}); "
            f"replay it there: pytest {shlex.quote(made_for)} --simdist-replay {shlex.quote(token)}"
        )
    if world is not None and world != nprocs:
        from hypothesis import currently_in_test_context, reject

        if currently_in_test_context():
            reject()
        raise ValueError(f"--simdist-replay {token} was made for a run of {world} ranks, not of nprocs={nprocs}")
    return token


def replay_worlds(worlds: list[int]) -> list[int]:
    """The world sizes of ``worlds`` that ``pytest --simdist-replay`` replays: the token's, if it is among them."""
    from simdist.backends.sim import split_token

    world = None if OPTIONS["replay"] is None else split_token(OPTIONS["replay"]).world
    return [world] if world in worlds else worlds


def run(
    fn: Callable,
    nprocs: int,
    *,
    args: tuple = (),
    check: Callable | None = None,
    options: SimOptions | None = None,
    **fields: Any,
) -> Any:
    """Run ``fn(rank, *args)`` on ``nprocs`` simulated ranks: a ``SimResult`` (``values``, ``trace``, ``schedule``).

    Like :func:`simdist.simulate`, which does the work. With no ``seed``, ``strategy`` or
    ``schedule`` the seed comes from a generator registered with Hypothesis. Under
    ``pytest --simdist-replay TOKEN`` every run replays ``TOKEN`` (refused in another test, or
    at another world size, than the token's). A failing run is replayed once before its
    error is raised: if the replay does not fail the same way, :class:`NondeterminismError`
    says what in the program is not under the simulator's control. The error's ``schedule``
    is the replay token; when it has at most a few preemptions, a note lists them
    (:func:`simdist.testing.explain`). ``check(values)``, if given, is called after the
    run; if it raises or returns ``False`` the run fails with
    :class:`~simdist.testing.CheckError`. What a passing run leaves behind (never-waited
    works, unmatched messages) is a ``LeakWarning``; ``leaks='ignore'`` or ``'error'`` as
    for :func:`simdist.simulate`.

    Args:
        fn: the program of one rank, called as ``fn(rank, *args)``.
        nprocs: the number of ranks.
        args: the arguments after ``rank``.
        check: ``check(values)`` after the run; raising or returning ``False`` fails it.
        options: how the run goes, a :class:`simdist.SimOptions`. Its default here differs from
            ``simulate``'s in three fields: ``check_buffers=True`` (``BufferRaceError`` on early writes),
            ``test`` the running pytest test, and ``isolation`` that of ``pytest --simdist-isolation``
            (else ``'threads'``). With no ``seed``, ``strategy`` or ``schedule`` the seed is drawn from
            Hypothesis's registered random.
        fields: any field of :class:`simdist.SimOptions` as a keyword (``seed``, ``strategy``,
            ``schedule``, ``detail``, ``topology``, ``eager_limit``, ``timeout``, ...): it replaces that
            field of ``options``.

    Returns:
        The run's ``SimResult`` (``values`` by rank, ``trace``, ``schedule``, ...).

    Raises:
        DeadlockError, CollectiveMismatchError, RankError, BufferRaceError, DistTimeoutError:
            as :func:`simdist.simulate`, after one replay, with ``.schedule`` set.
        CheckError: ``check`` raised or returned ``False`` (``.values`` holds the values).
        NondeterminismError: the failure did not repeat when its schedule was replayed.
        TypeError: ``check`` is not callable.

    Example:
        >>> import simdist, torch
        >>> import simdist.testing as sdt
        >>> def ring_sum(rank):
        ...     simdist.init_process_group("gloo")
        ...     t = torch.tensor([float(rank)])
        ...     simdist.all_reduce(t, algorithm="ring")
        ...     return t.item()
        >>> sdt.run(ring_sum, 4, check=lambda values: values == [6.0] * 4).values
        [6.0, 6.0, 6.0, 6.0]
    """
    if options is None:
        options = SimOptions(check_buffers=True, test=current_test(), isolation=OPTIONS.get("isolation") or "threads")
    opts = SimOptions.of(options, fields)
    check_argument(check)
    kwargs = {name: value for name, value in opts.fields().items() if name not in ("seed", "strategy", "schedule")}
    return run_program(Program(fn, nprocs, args, kwargs, check), opts.seed, opts.strategy, opts.schedule)


def run_script(
    path: str | os.PathLike,
    nprocs: int,
    args: Any = (),
    *,
    nnodes: int = 1,
    module: bool = False,
    launch: str = "auto",
    workdir: str | os.PathLike | None = None,
    check: Callable | None = None,
    options: SimOptions | None = None,
    **fields: Any,
) -> Any:
    """Run the script ``path`` on ``nprocs`` simulated ranks as torchrun would: a ``SimResult`` whose ``values`` are each
    rank's :class:`ScriptRank` (its exit status and the lines it printed).

    Every rank runs the script as ``__main__`` with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,
    MASTER_ADDR, ...) and ``sys.argv`` ``[path, *args]``; a script that starts its own ranks
    (``torch.multiprocessing.spawn``) runs once, on a node of ``nprocs`` simulated GPUs (``launch``). The run
    happens in a copy of ``workdir`` (default: the current directory): what it writes there is gone afterwards,
    and the replay of a failure starts from the same files. As :func:`run` does for functions: the seed, a
    failure replayed once and explained, ``pytest --simdist-replay``. A rank that raises or exits with another
    status than 0 fails the run (``RankError``), as a deadlock, a collective mismatch or a buffer race does.

    Args:
        path: the script (with ``module``, a module's name, as ``python -m`` takes it).
        nprocs: ranks per node (``--nproc-per-node``).
        args: the script's arguments (``sys.argv[1:]``), strs.
        nnodes: nodes (the world is ``nprocs * nnodes`` ranks).
        module: ``path`` is a module's name.
        launch: ``'auto'`` (default: ``'spawn'`` when the script's source starts ranks of its own), ``'torchrun'``
            or ``'spawn'``.
        workdir: the folder whose copy the run starts in (default: the current directory).
        check: ``check(values)`` after the run, in the run's folder; raising or returning ``False`` fails it.
        options: a :class:`simdist.SimOptions`; ``fields`` its fields as keywords. Here the defaults are ranks as
            processes (threads where the system has no pidfd, or with ``isolation='threads'``), output kept
            (``capture_output=True``) and buffer races checked.

    Returns:
        The run's ``SimResult``: ``values`` (each rank's ``ScriptRank``), ``trace``, ``schedule``, ``time``, ...

    Raises:
        RankError, DeadlockError, CollectiveMismatchError, BufferRaceError, DistTimeoutError, CheckError:
            the run's failure, with its replay token (``.schedule``), after one replay.
        ValueError, TypeError: a bad argument (a script that does not exist, a token of another script, ...).

    Example:
        >>> import simdist.testing as sdt
        >>> res = sdt.run_script("train.py", 2, ["--steps", "3"], seed=1)  # doctest: +SKIP
        >>> [rank.stdout[-1] for rank in res.values]  # doctest: +SKIP
        ['loss 0.25', 'loss 0.25']
    """
    from ._script import Script, ScriptProgram, script_defaults
    from ._workdir import Scratch

    script = Script.of(path, nprocs, args, nnodes=nnodes, module=module, launch=launch)
    check_argument(check)
    if options is None:
        isolation = fields.get("isolation") or OPTIONS.get("isolation")
        options = SimOptions(test=current_test(), **script_defaults(isolation))
    opts = SimOptions.of(options, fields)
    kwargs = {name: value for name, value in opts.fields().items() if name not in ("seed", "strategy", "schedule")}
    with Scratch(os.getcwd() if workdir is None else workdir) as files:
        program = ScriptProgram.of(script, kwargs, check, files)
        return run_program(program, opts.seed, opts.strategy, opts.schedule)


def run_program(program: Program, seed: Any = None, strategy: Any = None, schedule: Any = None) -> Any:
    """One run of ``program``, as :func:`run` makes it: its ``SimResult``, or its failure, replayed once and explained.

    ``schedule``, ``seed`` or ``strategy`` choose the run (``pytest --simdist-replay`` wins; with none of them a
    seed is drawn from the generator Hypothesis resets).
    """
    if isinstance(schedule, Schedule):
        schedule = list(schedule) if schedule.world is None else schedule.token
    how = _how(program.nprocs, seed, strategy, schedule)
    outer_trace = trace_user_code(sys._getframe())
    try:
        return program.run(**how)
    except DistError as err:
        if err.schedule is None:
            raise
        check_replays(program, err)
        note_decisions(program, err)
        raise
    finally:
        if outer_trace is not None:
            sys.settrace(outer_trace)


def replay(fn: Callable, nprocs: int, token: str, args: tuple = (), **options: Any) -> Any:
    """Rerun exactly the interleaving of ``token`` (a failure's ``.schedule``): its ``SimResult``, or its error.

    The same ``fn``, world size and arguments under the same token make the same choices, so
    the run returns the same values or raises the same error, every time. Failures are
    replayed and explained as by :func:`run`, which does the work.

    Args:
        fn: the program of one rank, called as ``fn(rank, *args)``.
        nprocs: the number of ranks; a token that records its world size (``@world=N``)
            replays only at that size.
        token: a replay token (``str``) or a :class:`Schedule`.
        args: the arguments after ``rank``.
        options: :func:`run`'s keyword arguments (``detail``, ``check``, ...), as in the run
            that made the token.

    Returns:
        The run's ``SimResult``.

    Raises:
        TypeError: ``token`` is neither a str nor a ``Schedule``.
        ValueError: ``token`` is not a replay token, or was made for another world size.
        DeadlockError, RankError, CheckError, ...: the replayed run's failure, as :func:`run`.

    Example:
        >>> import simdist, torch
        >>> import simdist.testing as sdt
        >>> def first_sender(rank):            # rank 0 takes a message from any rank
        ...     simdist.init_process_group("gloo")
        ...     if rank > 0:
        ...         return simdist.send(torch.tensor([rank]), dst=0)
        ...     return [simdist.recv(torch.zeros(1, dtype=torch.int64)) for _ in range(2)]
        >>> sdt.replay(first_sender, 3, "choices:0@world=3").values[0]    # no decision: rank 1 first
        [1, 2]
        >>> sdt.replay(first_sender, 3, "choices:0,1@world=3").values[0]  # one decision: rank 2 first
        [2, 1]
    """
    if isinstance(token, Schedule):
        token = token.token
    if not isinstance(token, str):
        raise TypeError(f"token must be a replay token (str), got {type(token).__name__} ({token!r:.60})")
    return run(fn, nprocs, args=args, schedule=token, **options)


def warn_leaks(res: Any) -> bool:
    """Whether ``res`` (a ``SimResult``) left never-waited works or unmatched messages: then one ``LeakWarning``.

    Groups never destroyed are listed on the result only, as :func:`simdist.simulate` does.
    """
    found = [line for line in res.leaks if not line.endswith(_UNDESTROYED)]
    if not found:
        return False
    site = user_call_site()
    filename, _, line = site.rpartition(":")
    text = f"a run left {len(found)} leak(s) (replay token {res.schedule}):\n  " + "\n  ".join(found)
    warnings.warn_explicit(text, LeakWarning, filename or site, int(line) if line.isdigit() else 0)
    return True


def same_failure(a: BaseException, b: BaseException | None) -> bool:
    """Whether ``b`` is the failure ``a`` is: the same exception type at the same user call site (any rank)."""
    return b is not None and type(a) is type(b) and failure_site(a) == failure_site(b)


def failure_site(err: BaseException) -> Any:
    """Where in the user's code ``err`` happened, as compared by :func:`same_failure` (ranks left out).

    A deadlock: the call sites its blocked ranks wait at. A collective mismatch: the two
    calls' sites. An error with a ``__cause__`` (``RankError``, ``CheckError``): the cause's
    type and the innermost frame of its traceback that is user code (``file:line``).
    """
    if isinstance(err, DeadlockError):
        return frozenset(entry.get("call_site") for entry in err.blocked)
    if isinstance(err, CollectiveMismatchError):
        return frozenset(err.call_sites)
    cause = err.__cause__
    if cause is None:
        return None
    site, tb = None, cause.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if _is_user_file(name):
            site = f"{name}:{tb.tb_lineno}"
        tb = tb.tb_next
    return type(cause), site


def check_replays(program: Program, err: DistError) -> DistError:
    """The error of replaying ``err``'s schedule of ``program`` (then its check), which fails the same way as ``err``.

    Raises:
        NondeterminismError: the replay passed, or failed another way.
    """
    token = err.schedule
    if token is None:
        raise ValueError(f"{type(err).__name__} carries no replay token: only the error of a simulated run replays")
    try:
        program.run(schedule=token)
        second = None
    except DistError as again:
        second = again
    if second is not None and same_failure(err, second):
        return second
    causes = _diagnose(program, token)
    outcome = "passed" if second is None else f"raised {type(second).__name__}"
    raise NondeterminismError(
        f"the run failed with {type(err).__name__}, but its replay ({token}) {outcome}: the program does "
        "something the simulator does not control, so its schedule cannot be replayed.\n  " + "\n  ".join(causes),
        err,
        second,
        causes,
    ) from err


def _package_dirs() -> tuple[str, ...]:
    """The folders of simdist's packages, found without running the visualizer's or the backends' code."""
    import importlib.util

    folders = []
    for name in ("simdist", "simdist.backends", "simdist.visualize"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            folders.append(os.path.abspath(list(spec.submodule_search_locations)[0]) + os.sep)
    return tuple(folders)


_PACKAGES = _package_dirs()
"""All of simdist's folders (its backends and visualizer too, imported or not)."""


def _is_user_file(name: str) -> bool:
    """Whether code in file ``name`` is the user's (not simdist, the stdlib, an installed package or frozen)."""
    return is_user_file(name, _PACKAGES)


_SIMDIST = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _user_caller(past_simdist: bool = False) -> str | None:
    """``file:line`` of the caller's caller if it is the user's code (not simdist, the stdlib or a package);
    ``past_simdist``: first past simdist's own wrappers of the call (the bridge's of ``Thread.start``)."""
    frame: Any = sys._getframe(2)
    while past_simdist and frame.f_back is not None and frame.f_code.co_filename.startswith(_SIMDIST):
        frame = frame.f_back
    name = frame.f_code.co_filename
    return f"{name}:{frame.f_lineno}" if _is_user_file(name) else None


def _diagnose(program: Program, token: str) -> list[str]:
    """Rerun with the clocks and ``Thread.start`` watched; what the program did that a replay cannot repeat."""
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
        site = _user_caller(past_simdist=True)
        if site is not None:
            seen["thread"].add(f"a thread started at {site}")
        start(thread)

    for name, real in originals.items():
        setattr(time, name, watch(name, real))
    setattr(threading.Thread, "start", watched_start)  # put back below
    try:
        program.simulate(schedule=token)
    except BaseException:  # noqa: BLE001 - only what the program touched matters here
        pass
    finally:
        for name, real in originals.items():
            setattr(time, name, real)
        setattr(threading.Thread, "start", start)
    causes = [f"it reads the clock: {s}" for s in sorted(seen["clock"])]
    causes += [
        f"it starts its own threads (the simulator schedules only rank threads): {s}" for s in sorted(seen["thread"])
    ]
    if not causes:
        causes = [
            "it depends on state outside the run: global variables changed by an earlier run, "
            "unseeded randomness (os.urandom, uuid, hash() of str across processes), files or the network"
        ]
    return causes
