"""The leak report at the end of a run, and algorithm defaults per run and per group."""

from __future__ import annotations

import pytest
import torch

import simdist
import simdist as dist


def leaky(rank):
    dist.init_process_group("gloo")
    if rank == 0:
        dist.isend(torch.ones(2), dst=1, tag=3)  # never matched, never waited
    dist.irecv(torch.zeros(1), src=(rank + 1) % 2, tag=9)  # never waited, never matched
    dist.destroy_process_group()


def test_leaks_are_reported_as_a_warning_and_on_the_result():
    with pytest.warns(simdist.LeakWarning, match="never waited") as record:
        res = simdist.simulate(leaky, 2, leaks="warn")
    text = str(record[0].message)
    assert "unmatched send 0->1 tag 3" in text
    assert "unmatched recv 1<-0 tag 9" in text and "unmatched recv 0<-1 tag 9" in text
    assert sum("never waited" in line for line in res.leaks) == 3
    assert res.schedule in text


def test_leaks_as_error_and_ignored():
    with pytest.raises(simdist.DistError, match="leak"):
        simdist.simulate(leaky, 2, leaks="error")
    res = simdist.simulate(leaky, 2, leaks="ignore")
    assert res.leaks


def test_clean_program_has_no_leaks_and_undestroyed_groups_are_listed():
    def clean(rank):
        dist.init_process_group("gloo")
        dist.all_reduce(torch.ones(1))
        dist.destroy_process_group()

    def undestroyed(rank):
        dist.init_process_group("gloo")

    assert simdist.simulate(clean, 3, leaks="error").leaks == []
    res = simdist.simulate(undestroyed, 3, leaks="error")
    assert res.leaks == ["ranks [0, 1, 2]: the default process group was never destroyed (destroy_process_group)"]


def _algorithms_used(res):
    return {e.algorithm for e in res.trace.of_kind("collective")}


def test_default_algorithm_per_run_and_per_group():
    def program(rank, use_group_default):
        dist.init_process_group("gloo")
        g = dist.new_group([0, 1, 2, 3])
        if use_group_default:
            g.set_default_algorithm("all_reduce", "binomial")
        t = torch.ones(1000)
        dist.all_reduce(t, group=g)
        dist.all_reduce(t, group=g, algorithm="recursive_doubling")
        return float(t[0])

    res = simdist.simulate(program, 4, (False,), algorithms={"all_reduce": "ring"})
    assert _algorithms_used(res) == {"ring", "recursive_doubling"}
    assert res.values == [16.0] * 4
    res = simdist.simulate(program, 4, (True,), algorithms={"all_reduce": "ring"})
    assert _algorithms_used(res) == {"binomial", "recursive_doubling"}
    with pytest.raises(ValueError, match="'nope'"):
        simdist.simulate(program, 4, (False,), algorithms={"all_reduce": "nope"})
