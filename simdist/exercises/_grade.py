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

import json
import linecache
import os
import tempfile
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from simdist._errors import BufferRaceError, CollectiveMismatchError, DeadlockError, DistError, RankError

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


def _compiled(source: str, name: str) -> Any:
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)  # reports quote its lines
    return compile(source, name, "exec")


def _program(exercise: Exercise, source: str) -> tuple[Callable, Callable]:
    """``(main, check)``: the submission with the exercise's harness and check, in one namespace."""
    namespace: dict[str, Any] = {"__name__": "solution"}
    exec(_compiled(source, SOURCE_NAME), namespace)
    if not callable(namespace.get(exercise.function)):
        raise LookupError(exercise.function)
    exec(_compiled(exercise.harness, "harness.py"), namespace)
    exec(_compiled(exercise.check, "check.py"), namespace)
    return namespace["main"], namespace["check"]


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


def _failing_run(main: Callable, world: int, token: str, options: dict) -> str | None:
    """The trace of the run ``token`` replays, as JSON (``None`` if it could not be written)."""
    import simdist.testing as sdt

    with tempfile.TemporaryDirectory(prefix="simdist-grade-") as folder:
        path = os.path.join(folder, "trace.json")
        try:
            sdt.replay(main, world, token, args=(world,), trace_file=path, record_steps=True, **options)
        except DistError:
            pass  # it fails, as it did: its trace is what the student is shown
        except Exception:  # noqa: BLE001 - a replay that fails otherwise: no picture, the verdict stands
            return None
        try:
            with open(path, encoding="utf-8") as f:
                return f.read()
        except OSError:
            return None


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


def grade(exercise: Exercise, source: str) -> Verdict:
    """The verdict on ``source`` (the student's code) for ``exercise``.

    Args:
        exercise: an :class:`~simdist.exercises.Exercise`.
        source: Python source that defines ``exercise.function``.

    Returns:
        A :class:`Verdict`: passed, or the first failure found (shrunk, with its replay token).
    """
    import simdist.testing as sdt

    try:
        main, check = _program(exercise, source)
    except SyntaxError as exc:
        return Verdict(False, "syntax error", f"{SOURCE_NAME}:{exc.lineno}: {exc.msg}", report=str(exc))
    except LookupError:
        return Verdict(False, "missing function", f"{SOURCE_NAME} defines no function {exercise.function}()")
    except Exception as exc:  # noqa: BLE001 - the student's module raised while it was defined
        return Verdict(False, "exception", f"{SOURCE_NAME} raised {type(exc).__name__}: {exc}", report=repr(exc))
    options: dict[str, Any] = {"leaks": "ignore", "timeout": 60}  # leaks: checked once the results hold
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
                decisions = tuple(sdt.explain(main, world, token, args=(world,), **options)) if token else ()
                kind, why = _kind(exc), _first_line(exc)
                why = why[len(kind) + 2 :] if why.lower().startswith(f"{kind}: ") else why  # "deadlock: no rank ..."
                return Verdict(
                    False, kind, f"world {world}: {kind}: {why}", explanation=why, world=world, report=str(exc),
                    token=token, decisions=decisions, complete=False, runs=runs, checks=(),
                    trace_json=_failing_run(main, world, token, options) if token else None, wait_for=_wait_for(exc),
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
