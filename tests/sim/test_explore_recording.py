"""explore's passing runs and shrinking replays record no step snapshots; the failure it reports is unchanged.

The reference is the same search with ``record_steps=True`` given, which every run then
honours (the behaviour before passing runs went without snapshots): the error must match
it in type, message, schedule, choices and notes (the shrink note counts its replays, and
the decisions note is :func:`simdist.testing.explain`'s), and replaying its token must
raise the same error again.
"""

from __future__ import annotations

import pytest
import torch

import simdist as dist
import simdist.testing as sdt
from simdist.testing._program import Program

pytestmark = pytest.mark.timeout(240)


def reduce_then_race(rank):
    """An all_reduce (a collective whose steps are recorded), then rank 0 assumes rank 2's message comes first."""
    dist.init_process_group("gloo")
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 0:
        first = dist.recv(torch.zeros(1))
        dist.recv(torch.zeros(1))
        assert first == 2, f"rank {first}'s message came first"
    else:
        dist.send(t[:1] * rank, dst=0)
    dist.destroy_process_group()


def broadcast_then_deadlock(rank):
    """A broadcast, then every rank sends (synchronously) to the next before receiving: a deadlock."""
    dist.init_process_group("gloo")
    t = torch.arange(4.0) if rank == 0 else torch.zeros(4)
    dist.broadcast(t, src=0)
    dist.send(t, dst=(rank + 1) % dist.get_world_size())
    dist.recv(t, src=(rank - 1) % dist.get_world_size())
    dist.destroy_process_group()


def first_sender(rank):
    """Rank 0 returns whose message came first (checked below: a CheckError under some schedules)."""
    dist.init_process_group("gloo")
    t = torch.full((2,), float(rank))
    dist.all_reduce(t)
    value = None
    if rank == 0:
        value = dist.recv(torch.zeros(1))
        dist.recv(torch.zeros(1))
    else:
        dist.send(t[:1], dst=0)
    dist.destroy_process_group()
    return value


def rank_two_first(values):
    return values[0] == 2


CASES = [
    (reduce_then_race, 3, None, dist.RankError),
    (broadcast_then_deadlock, 3, None, dist.DeadlockError),
    (first_sender, 3, rank_two_first, sdt.CheckError),
]


def failure(fn, nprocs, check, **options):
    with pytest.raises(dist.DistError) as info:
        sdt.explore(fn, nprocs, check=check, max_runs=200, seed=3, **options)
    return info.value


def described(err) -> tuple:
    cause = err.__cause__
    return (
        type(err),
        str(err),
        err.schedule,
        list(err.choices),
        list(getattr(err, "__notes__", [])),
        None if cause is None else (type(cause), str(cause)),
    )


@pytest.mark.parametrize("strategy", ["pct", "random", "exhaustive"])
@pytest.mark.parametrize(("fn", "nprocs", "check", "kind"), CASES, ids=[c[0].__name__ for c in CASES])
def test_the_reported_failure_is_the_one_a_fully_recorded_search_reports(fn, nprocs, check, kind, strategy):
    quick = failure(fn, nprocs, check, strategy=strategy)
    full = failure(fn, nprocs, check, strategy=strategy, record_steps=True)
    assert type(quick) is kind
    assert described(quick) == described(full)
    if kind is not dist.DeadlockError:  # these need a preemption: their decisions are noted
        assert any("simdist.testing.explain" in note for note in quick.__notes__)
    with pytest.raises(kind) as again:
        sdt.replay(fn, nprocs, quick.schedule, check=check)
    assert (str(again.value), again.value.schedule) == (str(quick), quick.schedule)


def test_the_explained_decisions_are_those_of_the_token():
    err = failure(reduce_then_race, 3, None, strategy="pct")
    lines = sdt.explain(reduce_then_race, 3, err.schedule)
    assert lines
    note = next(n for n in err.__notes__ if "simdist.testing.explain" in n)
    assert note.splitlines()[1:] == ["  " + line for line in lines]


def test_unrecorded_turns_off_snapshots_unless_the_options_say_otherwise():
    program = Program(reduce_then_race, 3, (), {"detail": "messages"})
    assert program.unrecorded().options == {"detail": "messages", "record_steps": False}
    for kept in ({"record_steps": True}, {"record_steps": False}, {"record_steps": None}, {"trace_file": "run.json"}):
        assert Program(reduce_then_race, 3, (), kept).unrecorded().options is kept
    options = {"eager_limit": 0}
    Program(reduce_then_race, 3, (), options).unrecorded()
    assert options == {"eager_limit": 0}  # the caller's options are not changed


def test_the_steps_a_default_run_records_are_absent_only_where_asked():
    """The switch itself: record_steps=False drops the 'step'/'received' events and nothing else."""
    full = dist.simulate(reduce_then_race_passing, 4, seed=1)
    bare = dist.simulate(reduce_then_race_passing, 4, seed=1, record_steps=False)
    stepped = {"step", "work", "received"}
    assert any(e.kind in stepped for e in full.trace.events)
    assert not any(e.kind in stepped for e in bare.trace.events)
    assert [e for e in full.trace.events if e.kind not in stepped] == list(bare.trace.events)
    assert (full.values, full.schedule, full.choices) == (bare.values, bare.schedule, bare.choices)


def reduce_then_race_passing(rank):
    dist.init_process_group("gloo")
    t = torch.full((4,), float(rank))
    dist.all_reduce(t)
    dist.broadcast(t, src=1)
    dist.destroy_process_group()
    return t.tolist()
