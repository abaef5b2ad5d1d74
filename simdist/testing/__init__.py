"""Testing parallel code: runs under chosen or generated schedules, exploration, replay, a pytest plugin.

::

    from hypothesis import given
    import simdist.testing as sdt

    @given(world=sdt.world_sizes(1, 8), schedule=sdt.schedules())
    def test_my_ring_allreduce(world, schedule):
        res = sdt.run(my_ring_allreduce_program, world, schedule=schedule)
        assert all(v == sum(range(world)) for v in res.values)

A failure carries the replay token of its (shrunk) schedule, such as
``choices:0,2@world=4@test=tests/test_x.py::test_y``: ``sdt.replay(fn, world, token)`` or
``pytest --simdist-replay TOKEN`` reruns exactly that interleaving, ``sdt.explain(fn, world,
token)`` says which decisions made it (also noted on the failure when there are few), and
``sdt.Schedule.from_token(token)`` reads it as a list of choices.

A torchrun script is a program like a function: ``sdt.run_script("train.py", 4)`` runs it once on simulated
ranks and ``sdt.explore_script("train.py", 4)`` explores its schedules (``simdist test`` on the command line),
each run in a fresh copy of the working directory.
"""

from ._check import CheckError
from ._explain import explain
from ._explore import ExploreSummary, explore, explore_script, minimize, spmd
from ._run import NondeterminismError, replay, run, run_script
from ._schedule import Schedule
from ._script import ScriptError, ScriptRank
from ._strategies import COLLECTIVE_OPS, CollectiveInputs, collective_inputs, schedules, topologies, world_sizes

__all__ = [
    "run",
    "run_script",
    "replay",
    "explain",
    "explore",
    "explore_script",
    "spmd",
    "minimize",
    "schedules",
    "world_sizes",
    "topologies",
    "collective_inputs",
    "CollectiveInputs",
    "COLLECTIVE_OPS",
    "Schedule",
    "ExploreSummary",
    "NondeterminismError",
    "CheckError",
    "ScriptRank",
    "ScriptError",
]
