"""Grading a submission: the exercise's checks under every schedule its budget reaches.

:func:`grade` runs the student's code with the exercise's harness on each of its world
sizes: first a bounded exhaustive search (with reduction: reorderings of independent steps
are run once), then PCT and random schedules. The first failure is shrunk to a minimal
schedule; the verdict carries its replay token, the decisions that made it (at the
student's lines, ``solution.py:N``) and the error's own report (a deadlock's wait-for
graph, a mismatch's two call sites, the check's explanation).

It runs the code in the calling process: a page that grades students' code calls it in a
contained child process (:mod:`simdist.visualize._sandbox`).
"""

from __future__ import annotations

import itertools
import json
import linecache
import os
import tempfile
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from simdist.launch import _scripts
from simdist.core._errors import BufferRaceError, CollectiveMismatchError, DeadlockError, DistError, RankError
from simdist.algorithms import ALGORITHMS

from ._format import Exercise

__all__ = ["SOURCE_NAME", "Verdict", "grade"]

SOURCE_NAME = "solution.py"
"""The file name a submission's lines are reported under."""

KINDS = {
    DeadlockError: "deadlock",
    CollectiveMismatchError: "mismatched collectives",
    BufferRaceError: "buffer reused before its wait",
}


@dataclass(frozen=True)
class Verdict:
    """What grading a submission found.

    ``kind`` is ``"passed"`` or the failure's kind: ``"syntax error"``, ``"missing function"``,
    ``"deadlock"``, ``"mismatched collectives"``, ``"buffer reused before its wait"``, ``"wrong result"``,
    ``"exception"`` (the code raised) or ``"leak"`` (a message never received, a work never waited).
    """

    passed: bool
    kind: str
    summary: str  # one line for the student
    explanation: str = ""  # a failure's own words: the check's explanation, or the error's first line
    world: int | None = None  # the world size of the failing run
    report: str = ""  # the error's full report
    token: str | None = None  # the minimal failing schedule's replay token
    decisions: tuple[str, ...] = ()  # what the scheduler decided in that run, at the program's lines
    complete: bool = False  # the exhaustive search covered every schedule at every world size
    runs: int = 0  # schedules run in all
    checks: tuple[str, ...] = ()  # what held in every run before the failure (or in all)
    trace_json: str | None = None  # the failing run's trace (``simdist.Trace.from_json``), replayed from ``token``
    wait_for: dict | None = None  # a deadlock's wait-for graph: ``{"graph": node-link data, "cycle": [...]}``
    calls: tuple[tuple[str, ...], ...] = ()  # per rank, in order: the failing run's communication calls with values


def _compiled(source: str, name: str) -> Any:
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)  # reports quote its lines
    return compile(source, name, "exec")


def _program(
    exercise: Exercise, source: str, tap: _Tapped | None = None, folder: str | None = None
) -> tuple[Callable, Callable]:
    """``(main, check)``: the submission with the exercise's harness and check, in one namespace; with ``tap``,
    what each rank's communication calls held is recorded there. With ``folder``, the namespace is a module
    importable from there (rank processes import it: ``isolation='processes'``)."""
    if folder is not None:
        module = _scripts.importable([(source, SOURCE_NAME)], folder, _MODULE)
        if not callable(getattr(module, exercise.function, None)):
            raise LookupError(exercise.function)
        _scripts.forget(folder, _MODULE)
        parts = [(source, SOURCE_NAME), (exercise.harness, "harness.py"), (exercise.check, "check.py")]
        module = _scripts.importable(parts, folder, _MODULE)
        return module.main, module.check
    namespace: dict[str, Any] = {"__name__": "solution"}
    exec(_compiled(source, SOURCE_NAME), namespace)
    if not callable(namespace.get(exercise.function)):
        raise LookupError(exercise.function)
    exec(_compiled(exercise.harness, "harness.py"), namespace)
    exec(_compiled(exercise.check, "check.py"), namespace)
    main = namespace["main"]
    if tap is not None and "dist" in namespace:  # the student's functions read ``dist`` from this namespace
        tap.real, namespace["dist"] = namespace["dist"], tap

        def main(rank: int, *args: Any) -> Any:  # each rank's record starts with its run (a replay may run again)
            tap.start(rank)
            return namespace["main"](rank, *args)

    return main, namespace["check"]


_TAPPED_SENDS = ("send", "isend")
_TAPPED_RECEIVES = ("recv", "irecv")
_TAPPED_COLLECTIVES = tuple(name for name in ALGORITHMS if name != "barrier")  # those that move values


class _Tapped:
    """``simdist`` as the student's code sees it in the failing run's replay: each communication call made from
    the student's lines is recorded, per rank and in order, with the values it sent or received
    (``"solution.py:12 recv from rank 2: [1, 2]"``). A send is recorded when it is posted, a receive or a
    collective when it completes (its wait, or its return), and one that never completed as such."""

    def __init__(self) -> None:
        self.real: Any = None
        self._done: dict[int, list[str]] = {}
        self._pending: dict[int, dict[int, str]] = {}
        self._keys = itertools.count()  # next() is atomic: rank threads share it

    def start(self, rank: int) -> None:
        self._done[rank], self._pending[rank] = [], {}

    def calls(self, world: int) -> tuple[tuple[str, ...], ...]:
        """Per rank, what its calls held in order, then the receives and collectives that never completed."""
        return tuple(
            (*self._done.get(r, ()), *(f"{what}: never completed" for what in self._pending.get(r, {}).values()))
            for r in range(world)
        )

    def __getattr__(self, name: str) -> Any:
        real = getattr(self.real, name)
        if name not in _TAPPED_SENDS + _TAPPED_RECEIVES + _TAPPED_COLLECTIVES:
            return real
        return lambda *args, **kwargs: self._call(name, real, args, kwargs)

    def _call(self, name: str, real: Callable, args: tuple, kwargs: dict) -> Any:
        import sys

        caller = sys._getframe(2)
        line = f"{SOURCE_NAME}:{caller.f_lineno}" if caller.f_code.co_filename == SOURCE_NAME else None
        if line is None:  # the harness's own calls are not the student's
            return real(*args, **kwargs)
        rank = self.real.get_rank()
        done, pending = self._done.setdefault(rank, []), self._pending.setdefault(rank, {})
        tensor = args[0] if args else kwargs.get("tensor")
        if name in _TAPPED_SENDS:
            peer = args[1] if len(args) > 1 else kwargs.get("dst")
            done.append(f"{line} {name} to rank {peer}: {_values(tensor)}")
            return real(*args, **kwargs)
        peer = None
        if name in _TAPPED_RECEIVES:
            peer = args[1] if len(args) > 1 else kwargs.get("src")
            what = f"{line} {name} from {'any rank' if peer is None else f'rank {peer}'}"
        else:
            what = f"{line} {name}"
        key = next(self._keys)
        pending[key] = what
        result = real(*args, **kwargs)
        if result is None or not hasattr(result, "wait") or name == "recv":
            del pending[key]
            sender = f" (from rank {result})" if name == "recv" and peer is None else ""
            done.append(f"{what}: {_values(tensor)}{sender}")
            return result
        wait = result.wait

        def waited(*a: Any, **k: Any) -> Any:
            out = wait(*a, **k)
            if pending.pop(key, None) is not None:
                done.append(f"{what}, waited: {_values(tensor)}")
            return out

        result.wait = waited
        return result


def _values(tensor: Any, limit: int = 8) -> str:
    """A tensor's leading values as a list (``[1.0, 2.0, ...]``), or its ``repr`` if it is none."""
    try:
        flat = tensor.detach().reshape(-1).tolist()
    except AttributeError:
        return repr(tensor)[:60]
    shown = ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in flat[:limit])
    return f"[{shown}{', ...' if len(flat) > limit else ''}]"


def _kind(exc: BaseException) -> str:
    from simdist.testing import CheckError

    if isinstance(exc, CheckError):
        return "wrong result"
    for cls, kind in KINDS.items():
        if isinstance(exc, cls):
            return kind
    if isinstance(exc, RankError):
        return "exception"
    return "error"  # leaks are found by the run after the search (``leaks="error"``), not guessed from text


def _failing_run(
    exercise: Exercise, source: str, world: int, token: str, options: dict
) -> tuple[str | None, tuple[tuple[str, ...], ...]]:
    """The run ``token`` replays: its trace as JSON (``None`` if it could not be written), and what each rank's
    communication calls from the student's lines held, in order (see :class:`_Tapped`)."""
    import simdist.testing as sdt

    tap = _Tapped()
    main, _ = _program(exercise, source, tap)
    calls = lambda: tap.calls(world)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="simdist-grade-") as folder:
        path = os.path.join(folder, "trace.json")
        try:
            sdt.replay(main, world, token, args=(world,), trace_file=path, record_steps=True, **options)
        except DistError:
            pass  # it fails, as it did: its trace is what the student is shown
        except Exception:  # noqa: BLE001 - a replay that fails otherwise: no picture, the verdict stands
            return None, calls()
        try:
            with open(path, encoding="utf-8") as f:
                return f.read(), calls()
        except OSError:
            return None, calls()


def _threads(options: dict) -> dict:
    """``options`` with the ranks as threads: replaying a token there gives the run it gave on processes, and the
    replay's recorders (the decisions, the calls' values) see every rank."""
    return {**options, "isolation": "threads"}


def _wait_for(exc: BaseException) -> dict | None:
    """A deadlock's wait-for graph as JSON-ready data, else ``None``."""
    graph = getattr(exc, "graph", None)
    if not isinstance(exc, DeadlockError) or graph is None:
        return None
    import networkx as nx

    data = {"graph": nx.node_link_data(graph, edges="links"), "cycle": list(exc.cycle or [])}
    return json.loads(json.dumps(data, default=str))


def _first_line(exc: BaseException) -> str:
    """What went wrong, in a line: a failed check's own explanation, else the error's first line."""
    from simdist.testing import CheckError

    if isinstance(exc, CheckError) and exc.__cause__ is not None and str(exc.__cause__):
        exc = exc.__cause__
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def grade(exercise: Exercise, source: str, isolation: str = "threads") -> Verdict:
    """The verdict on ``source`` (the student's code) for ``exercise``.

    Args:
        exercise: an :class:`~simdist.exercises.Exercise`.
        source: Python source that defines ``exercise.function``.
        isolation: what each rank of the runs is, ``'threads'`` or ``'processes'`` (as for
            :func:`simdist.simulate`): the same schedules give the same verdict; the failing run is
            replayed on threads to record what the student's calls held.

    Returns:
        A :class:`Verdict`: passed, or the first failure found (shrunk, with its replay token).
    """
    if isolation not in ("threads", "processes"):
        raise ValueError(f"isolation={isolation!r} is not a kind of rank; expected 'threads' or 'processes'")
    if isolation == "threads":
        return _grade(exercise, source, None)
    with tempfile.TemporaryDirectory(prefix="simdist-solution-") as folder:
        try:
            return _grade(exercise, source, folder)
        finally:
            _scripts.forget(folder, _MODULE)


_MODULE = "simdist_solution"
"""The module a submission graded on rank processes is (imported from a folder of its own)."""


def _grade(exercise: Exercise, source: str, folder: str | None) -> Verdict:
    import simdist.testing as sdt

    try:
        main, check = _program(exercise, source, folder=folder)
    except SyntaxError as exc:
        return Verdict(False, "syntax error", f"{SOURCE_NAME}:{exc.lineno}: {exc.msg}", report=str(exc))
    except LookupError:
        return Verdict(False, "missing function", f"{SOURCE_NAME} defines no function {exercise.function}()")
    except Exception as exc:  # noqa: BLE001 - the student's module raised while it was defined
        return Verdict(False, "exception", f"{SOURCE_NAME} raised {type(exc).__name__}: {exc}", report=repr(exc))
    options: dict[str, Any] = {"leaks": "ignore", "timeout": 60}  # leaks: checked once the results hold
    if folder is not None:
        options["isolation"] = "processes"
    if exercise.eager_limit is not None:
        options["eager_limit"] = exercise.eager_limit
    runs, complete = 0, True
    checks = ("no deadlock", "matching collectives", "no buffer reused before its wait", "no leak", "the check")
    for world in exercise.worlds:

        def checked(values: list, world: int = world) -> None:
            check(values, world)

        exhaustive = {"max_runs": exercise.budget, "seed": 0, "preemption_bound": exercise.preemptions}
        plan: list[tuple[str, dict]] = [("exhaustive", exhaustive)]
        if exercise.random_runs:
            plan += [(s, {"max_runs": exercise.random_runs, "seed": world}) for s in ("pct", "random")]
        for strategy, bounds in plan:
            if not bounds["max_runs"]:
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # a search cut short by its budget: said in ``complete``
                    summary = sdt.explore(main, world, args=(world,), strategy=strategy, check=checked,
                                          progress=False, **bounds, **options)  # fmt: skip
            except DistError as exc:
                token = exc.schedule
                decisions = tuple(sdt.explain(main, world, token, args=(world,), **_threads(options))) if token else ()
                kind, why = _kind(exc), _first_line(exc)
                why = why[len(kind) + 2 :] if why.lower().startswith(f"{kind}: ") else why  # "deadlock: no rank ..."
                trace_json, calls = (
                    _failing_run(exercise, source, world, token, _threads(options)) if token else (None, ())
                )
                return Verdict(
                    False, kind, f"world {world}: {kind}: {why}", explanation=why, world=world, report=str(exc),
                    token=token, decisions=decisions, complete=False, runs=runs, checks=(),
                    trace_json=trace_json, wait_for=_wait_for(exc), calls=calls,
                )  # fmt: skip
            runs += summary.runs
            if strategy == "exhaustive":
                complete = complete and summary.complete
    for world in exercise.worlds:  # what every run left behind: a message never received, a work never waited
        try:
            sdt.run(main, world, args=(world,), **{**options, "leaks": "error"})
        except DistError as exc:
            why = _first_line(exc)
            return Verdict(False, "leak", f"world {world}: leak: {why}", explanation=why, world=world, report=str(exc),
                           token=exc.schedule, runs=runs, checks=checks[:3] + checks[4:])  # fmt: skip
    searched = f"every schedule with up to {exercise.preemptions} preemptions" if complete else "a bounded search"
    return Verdict(
        True, "passed", f"passed {runs} schedules on world sizes {list(exercise.worlds)}: {searched}, then PCT and "
        "random schedules", complete=complete, runs=runs, checks=checks,
    )  # fmt: skip
