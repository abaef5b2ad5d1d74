"""An exercise as data: a TOML file a teacher drops in a folder.

Each file holds (strings unless said)::

    title = "Ring all-reduce from send and recv"
    task = "... Markdown: what the student is asked to do ..."
    function = "my_all_reduce"      # what the student writes (a top-level def of that name)
    starter = "... Python: the code the student starts from ..."
    solution = "... Python: the model solution (never shown to the student) ..."
    harness = "... Python: main(rank, world_size), which calls the student's function ..."
    check = "... Python: check(values, world_size), raising AssertionError with an explanation ..."
    worlds = [2, 3, 4]              # world sizes the submission is graded on
    budget = 300                    # exhaustive-search runs per world size (with reduction)
    preemptions = 2                 # the exhaustive search's bound: schedules with up to this many preemptions
    random_runs = 40                # then this many PCT and random schedules per world size
    hints = ["...", "..."]          # optional, shown one at a time
    eager_limit = 0                 # optional: simdist.simulate's eager_limit (0: every send synchronous)

The harness and the check run in the same module as the submission, after it; the
student sees the task, the starter and the hints only.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["EXERCISES_ENV", "Exercise", "ExerciseError", "exercise_folders", "load", "load_all", "parse"]

EXERCISES_ENV = "SIMDIST_EXERCISES"
"""A folder of a teacher's exercises (``*.toml``), read beside the shipped ones; ``os.pathsep`` separates several."""

SHIPPED = Path(__file__).resolve().parent / "shipped"

_TEXT = ("title", "task", "function", "starter", "solution", "harness", "check")


class ExerciseError(ValueError):
    """An exercise file that cannot be used: the message names the file, the field and what was expected."""


@dataclass(frozen=True)
class Exercise:
    """One exercise, as read from its file (see the module's docstring for the fields)."""

    name: str  # the file's stem: what a URL or a teacher's report calls it
    title: str
    task: str
    function: str
    starter: str
    solution: str
    harness: str
    check: str
    worlds: tuple[int, ...]
    budget: int
    random_runs: int
    preemptions: int = 2
    hints: tuple[str, ...] = ()
    eager_limit: int | None = None
    path: Path | None = field(default=None, compare=False)


def load(path: str | os.PathLike) -> Exercise:
    """The exercise in the TOML file ``path``.

    Args:
        path: a ``.toml`` file in the format of this module's docstring.

    Returns:
        An :class:`Exercise` named after the file's stem.

    Raises:
        ExerciseError: the file is not TOML, or a field is missing or of the wrong kind (named).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ExerciseError(f"exercise {path}: cannot be read: {exc}") from None
    return parse(text, path.stem, path)


def parse(text: str, name: str, path: Path | None = None) -> Exercise:
    """The exercise in ``text`` (a TOML file's content), named ``name``.

    Args:
        text: TOML in the format of this module's docstring.
        name: the exercise's name (its file's stem).
        path: the file it came from, for messages.

    Returns:
        An :class:`Exercise`.

    Raises:
        ExerciseError: the text is not TOML, or a field is missing or of the wrong kind (named).
    """
    where = path if path is not None else name
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ExerciseError(f"exercise {where}: cannot be read as TOML: {exc}") from None
    for key in _TEXT:
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise ExerciseError(f"exercise {where}: {key!r} must be a non-empty string, got {data.get(key)!r:.60}")
    worlds = data.get("worlds")
    if not isinstance(worlds, list) or not worlds or not all(type(w) is int and 1 <= w <= 16 for w in worlds):
        raise ExerciseError(f"exercise {where}: 'worlds' must be a list of world sizes from 1 to 16, got {worlds!r}")
    numbers = {}
    for key, default in (("budget", 300), ("random_runs", 40), ("preemptions", 2)):
        value = data.get(key, default)
        if type(value) is not int or not 0 <= value <= 100_000:
            raise ExerciseError(f"exercise {where}: {key!r} must be an int from 0 to 100000, got {value!r}")
        numbers[key] = value
    hints = data.get("hints", [])
    if not isinstance(hints, list) or not all(isinstance(h, str) for h in hints):
        raise ExerciseError(f"exercise {where}: 'hints' must be a list of strings, got {hints!r:.60}")
    eager = data.get("eager_limit")
    if eager is not None and (type(eager) is not int or eager < 0):
        raise ExerciseError(f"exercise {where}: 'eager_limit' must be a non-negative int, got {eager!r}")
    unknown = set(data) - set(_TEXT) - {"worlds", "budget", "random_runs", "preemptions", "hints", "eager_limit"}
    if unknown:
        raise ExerciseError(f"exercise {where}: unknown field(s) {sorted(unknown)}")
    return Exercise(
        name=name,
        title=data["title"],
        task=data["task"],
        function=data["function"],
        starter=data["starter"],
        solution=data["solution"],
        harness=data["harness"],
        check=data["check"],
        worlds=tuple(worlds),
        budget=numbers["budget"],
        random_runs=numbers["random_runs"],
        preemptions=numbers["preemptions"],
        hints=tuple(hints),
        eager_limit=eager,
        path=path,
    )


def exercise_folders() -> list[Path]:
    """The folders exercises are read from: the shipped ones, then those ``$SIMDIST_EXERCISES`` names."""
    extra = [Path(p) for p in os.environ.get(EXERCISES_ENV, "").split(os.pathsep) if p]
    return [SHIPPED, *extra]


def load_all() -> list[Exercise]:
    """Every exercise of :func:`exercise_folders`, ordered by file name within each folder; a teacher's file
    of the same name as a shipped one replaces it.

    Raises:
        ExerciseError: a file cannot be used (named).
    """
    found: dict[str, Exercise] = {}
    for folder in exercise_folders():
        for path in sorted(folder.glob("*.toml")):
            found[path.stem] = load(path)
    return list(found.values())
