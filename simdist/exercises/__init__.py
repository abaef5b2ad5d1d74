"""Exercises a class can do: a task, the code a student writes, and grading under every schedule.

An exercise is a TOML file (:mod:`simdist.exercises._format`); six ship with simdist, and a
teacher adds more by putting files in a folder named by ``$SIMDIST_EXERCISES``.
:func:`grade` checks a submission under bounded exhaustive search and seeded PCT/random
schedules and explains the first failure.
"""

from ._format import EXERCISES_ENV, Exercise, ExerciseError, exercise_folders, load, load_all, parse
from ._grade import SOURCE_NAME, Verdict, grade
from ._tally import TEACHER_ENV, Tally

__all__ = [
    "EXERCISES_ENV",
    "Exercise",
    "ExerciseError",
    "SOURCE_NAME",
    "TEACHER_ENV",
    "Tally",
    "Verdict",
    "exercise_folders",
    "grade",
    "load",
    "load_all",
    "parse",
]
