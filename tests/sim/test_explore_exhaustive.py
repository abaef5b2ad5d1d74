"""Bounded exhaustive search: order by preemptions, completeness, max_runs, the seven bug kinds, reduction soundness."""

from __future__ import annotations

import math

import pytest
import torch
from search_bugs import BUGS, WORLD

import simdist as dist
import simdist.testing as sdt
from simdist.sim import enumerate_schedules
from simdist.testing._program import Program
from simdist.testing._search import Search, preemptions

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.slow,
]  # slow: starts processes or explores many schedules (quick feedback: -m 'not slow')

OPTS = {"leaks": "ignore"}


def independent(rank, n):
    """``n`` scheduling points per rank that share nothing: receives posted at different ranks, never matched."""
    dist.init_process_group("gloo")
    for i in range(n):
        dist.irecv(torch.zeros(1), src=1 - rank, tag=i)
    return rank


def any_source(rank):
    """Rank 0 receives three times from anyone (twice from rank 1): the outcome is the order of arrival."""
    dist.init_process_group("gloo")
    if rank == 0:
        out = tuple(int(dist.recv(torch.zeros(1))) for _ in range(3))
    else:
        dist.send(torch.zeros(1), dst=0)
        if rank == 1:
            dist.send(torch.zeros(1), dst=0)
        out = None
    dist.destroy_process_group()
    return out


def mixed(rank):
    """Two pairs exchange independently, then rank 3 reports to rank 0 which also hears from rank 1."""
    dist.init_process_group("gloo")
    peer = rank ^ 1
    t = torch.tensor([float(rank)])
    if rank % 2 == 0:
        dist.send(t, dst=peer)
    else:
        dist.recv(t, src=peer)
    if rank == 0:
        first = dist.recv(torch.zeros(1))
        dist.recv(torch.zeros(1))
        return first
    if rank in (1, 3):
        dist.send(torch.zeros(1), dst=0)
    return None


def relay(rank):
    """Rank 2 hands rank 1 a value, then both report to rank 0, which takes them in arrival order."""
    dist.init_process_group("gloo")
    t = torch.tensor([float(rank)])
    if rank == 2:
        dist.send(t, dst=1)
    elif rank == 1:
        dist.recv(t, src=2)
    if rank == 0:
        return tuple(int(dist.recv(torch.zeros(1))) for _ in range(2))
    dist.send(t, dst=0)
    return None


def outcomes(fn, n, **kw):
    """Every final outcome (values, or the error's type and message) the search saw, and the search."""
    found = Search(Program(fn, n, kw.pop("args", ()), dict(OPTS)), **kw)
    seen = set()
    for run in found:
        if run.error is None:
            seen.add(("ok", repr(run.result.values)))
        else:
            seen.add((type(run.error).__name__, str(run.error).split("replay token")[0]))
    return seen, found


def test_schedules_come_in_order_of_preemptions():
    levels = [
        preemptions(run.choices)
        for run in Search(Program(any_source, 3, (), dict(OPTS)), preemption_bound=3, reduce=False, max_runs=10_000)
    ]
    assert levels == sorted(levels) and levels[0] == 0 and levels[-1] == 3
    reduced = [
        preemptions(run.choices)
        for run in Search(Program(mixed, 4, (), dict(OPTS)), preemption_bound=2, reduce=True, max_runs=10_000)
    ]
    assert reduced == sorted(reduced) and set(reduced) == {0, 1, 2}


@pytest.mark.parametrize("n", [1, 2, 3])
def test_full_enumeration_counts_match_a_formula(n):
    # Two ranks, each n + 1 steps (the last ends the rank) and a choice after every step but the last:
    # the schedules are the interleavings of two sequences of n + 1 steps, C(2n + 2, n + 1).
    seen, plain = outcomes(independent, 2, args=(n,), preemption_bound=None, reduce=False, max_runs=10_000)
    assert plain.complete and plain.runs == math.comb(2 * n + 2, n + 1) and seen == {("ok", "[0, 1]")}
    assert plain.runs == sum(1 for _ in enumerate_schedules(independent, 2, args=(n,), **OPTS))
    summary = sdt.explore(independent, 2, args=(n,), strategy="exhaustive", max_runs=10_000)
    assert summary.complete and summary.distinct == len(plain.signatures) == 1
    assert summary.runs < plain.runs or n == 1


def test_full_enumeration_counts_outcomes_of_a_race():
    seen, plain = outcomes(any_source, 3, preemption_bound=None, reduce=False, max_runs=10_000)
    assert plain.runs == sum(1 for _ in enumerate_schedules(any_source, 3, **OPTS))
    # rank 1 sends twice, in order, and rank 2 once: rank 2's message comes first, second or third
    assert seen == {("ok", repr([order, None, None])) for order in [(2, 1, 1), (1, 2, 1), (1, 1, 2)]}
    summary = sdt.explore(any_source, 3, strategy="exhaustive", max_runs=10_000)
    assert summary.complete and summary.distinct >= 3 and summary.runs <= plain.runs


def test_max_runs_cut_is_incomplete_and_warns():
    with pytest.warns(UserWarning, match=r"stopped at max_runs=5 .*incomplete"):
        summary = sdt.explore(any_source, 3, strategy="exhaustive", max_runs=5)
    assert summary.runs == 5 and not summary.complete
    done = sdt.explore(any_source, 3, strategy="exhaustive", preemption_bound=1, max_runs=1000)
    assert done.complete and "with up to 1 preemptions" in str(done)


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="preemption_bound=-1"):
        sdt.explore(any_source, 3, strategy="exhaustive", preemption_bound=-1)
    with pytest.raises(ValueError, match="preemption_bound=1.*strategy='exhaustive'"):
        sdt.explore(any_source, 3, strategy="pct", preemption_bound=1)
    with pytest.raises(TypeError, match="reduction='yes'"):
        sdt.explore(any_source, 3, strategy="exhaustive", reduction="yes")


@pytest.mark.parametrize("name", list(BUGS))
@pytest.mark.parametrize("reduce", [True, False])
def test_each_bug_kind_is_found_within_100_runs_with_one_preemption(name, reduce):
    found = Search(Program(BUGS[name], WORLD, (), dict(OPTS)), preemption_bound=1, reduce=reduce, max_runs=100)
    failing = next((run for run in found if run.error is not None), None)
    assert failing is not None and found.runs <= 100 and preemptions(failing.choices) <= 1
    if name in ("parameter server", "torch task server"):  # these need a preemption: matching order
        assert found.runs > 1 and preemptions(failing.choices) == 1
    with pytest.raises(dist.DistError):
        sdt.explore(BUGS[name], WORLD, strategy="exhaustive", preemption_bound=1, max_runs=100, reduction=reduce)


@pytest.mark.parametrize(
    "fn, n, bound",
    [
        (any_source, 3, None),
        (relay, 3, None),
        (independent, 2, None),
        (any_source, 3, 1),
        (mixed, 4, 1),
        (mixed, 4, 2),
        (BUGS["parameter server"], WORLD, None),
        (BUGS["torch task server"], WORLD, 1),
    ],
)
def test_reduction_finds_every_outcome_that_full_search_finds(fn, n, bound):
    args = (2,) if fn is independent else ()
    full, plain = outcomes(fn, n, args=args, preemption_bound=bound, reduce=False, max_runs=20_000)
    reduced, red = outcomes(fn, n, args=args, preemption_bound=bound, reduce=True, max_runs=20_000)
    assert plain.complete and red.complete
    assert reduced == full
    assert red.signatures == plain.signatures  # the same equivalence classes, in fewer runs
    assert red.runs <= plain.runs
