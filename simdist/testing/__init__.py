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
"""

from ._check import CheckError
from ._explain import explain
from ._explore import ExploreSummary, explore, minimize, spmd
from ._run import NondeterminismError, replay, run
from ._schedule import Schedule
from ._strategies import COLLECTIVE_OPS, CollectiveInputs, collective_inputs, schedules, topologies, world_sizes

__all__ = [
    "run",
    "replay",
    "explain",
    "explore",
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
]
