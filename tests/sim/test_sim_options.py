"""``SimOptions``: one frozen object of the simulator's options, taken by simulate, testing.run and spawn."""

from __future__ import annotations

import dataclasses
import doctest

import pytest
import torch

import simdist
import simdist.testing as sdt
from simdist.backends.sim import SimOptions

pytestmark = pytest.mark.timeout(120)


def summed(rank: int) -> float:
    simdist.init_process_group("gloo")
    t = torch.tensor([float(rank)])
    simdist.all_reduce(t)
    simdist.destroy_process_group()
    return t.item()


def test_options_are_frozen_and_checked_when_made():
    opts = SimOptions(detail="collectives")
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.detail = "messages"  # type: ignore[misc]
    with pytest.raises(ValueError, match="detail='bytes' is not a level of detail"):
        SimOptions(detail="bytes")
    with pytest.raises(TypeError, match="eager_limit=1.5 must be an int"):
        SimOptions(eager_limit=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'nope' is not an all_reduce algorithm"):
        SimOptions(algorithms={"all_reduce": "nope"})


def test_simulate_takes_the_object_and_a_keyword_wins_over_its_field():
    opts = SimOptions(seed=4, detail="collectives")
    by_object = simdist.simulate(summed, 3, options=opts)
    by_keywords = simdist.simulate(summed, 3, seed=4, detail="collectives")
    assert by_object.values == by_keywords.values == [3.0] * 3
    assert by_object.schedule == by_keywords.schedule == "random:4@world=3"
    assert simdist.simulate(summed, 3, options=opts, seed=9).schedule == "random:9@world=3"
    assert opts.seed == 4  # the object is unchanged


def test_a_name_that_is_no_option_is_refused_with_the_options_listed():
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'seeds'.*expected one of \('seed', 'strategy'"):
        simdist.simulate(summed, 2, seeds=1)
    with pytest.raises(TypeError, match="options=.* must be a simdist.SimOptions"):
        simdist.simulate(summed, 2, options={"seed": 1})


def test_testing_run_and_spawn_take_the_same_object():
    opts = SimOptions(seed=2, detail="collectives")
    assert sdt.run(summed, 3, options=opts).schedule == simdist.simulate(summed, 3, options=opts).schedule
    assert simdist.spawn(summed, nprocs=3, options=opts) == [3.0] * 3
    assert simdist.spawn(summed, nprocs=3, seed=2, detail="collectives") == [3.0] * 3


def test_testing_runs_check_buffers_unless_its_options_say_otherwise():
    def early_write(rank: int) -> None:
        simdist.init_process_group("gloo")
        t = torch.zeros(1)
        if rank == 0:
            work = simdist.isend(t, 1)
            t += 1  # written before the send completed
            work.wait()
        else:
            simdist.recv(t, 0)
        simdist.destroy_process_group()

    with pytest.raises(simdist.BufferRaceError):
        sdt.run(early_write, 2, seed=0)
    sdt.run(early_write, 2, options=SimOptions(seed=0, leaks="ignore"))  # simulate's defaults: not checked


def test_the_docstring_example_runs():
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner()
    for test in finder.find(SimOptions, "SimOptions", globs={}):
        runner.run(test)
    assert runner.failures == 0 and runner.tries >= 2
