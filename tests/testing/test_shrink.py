"""Shrinking failing schedules to a local minimum, checked results and exploration seeds (simdist.testing).

Four programs whose bug needs exactly one preemption (a message-order assumption on an
any-source receive; a lost update on a counter served by rank 0; a deadlock when rank 2's
message comes first, from tests/testing/test_testing_demos.py; ranks that assume they arrive in
rank order, failing on whichever rank notices first) are found by ``explore`` and must
shrink to one non-zero choice; the shrunk schedule must be a local minimum, checked here by
trying every single deletion and lowering. The 100-seed measurement is marked slow; a
10-seed one runs by default.
"""

from __future__ import annotations

import re
import statistics
import traceback

import pytest
import torch
from test_testing_demos import racing_receives  # rank 0 takes any message, then waits for rank 2's

import simdist
import simdist as dist
import simdist.testing as sdt
from simdist.testing._run import same_failure
from simdist.testing._shrink import minimize

pytestmark = pytest.mark.timeout(300)


# -- programs whose bug needs exactly one preemption ---------------------------------------------------------------


def first_message(rank):
    """Rank 0 assumes rank 1's message arrives before the others'; an all_reduce follows."""
    dist.init_process_group("gloo")
    first = None
    if rank == 0:
        first = dist.recv(torch.zeros(1))
        for _ in range(dist.get_world_size() - 2):
            dist.recv(torch.zeros(1))
    else:
        dist.send(torch.tensor([float(rank)]), dst=0)
    t = torch.ones(4)
    dist.all_reduce(t)
    assert rank != 0 or first == 1, f"rank {first}'s message came first"
    dist.destroy_process_group()


GET, PUT = 0.0, 1.0


def lost_update(rank):
    """Rank 0 serves a counter; every other rank reads it and writes it back plus one, with no lock."""
    dist.init_process_group("gloo")
    clients = dist.get_world_size() - 1
    if rank == 0:
        value, msg = 0.0, torch.zeros(2)
        for _ in range(2 * clients):
            src = dist.recv(msg)
            if msg[0] == GET:
                dist.send(torch.tensor([value]), dst=src)
            else:
                value = msg[1].item()
        assert value == clients, f"counter is {value} after {clients} increments"
    else:
        dist.send(torch.tensor([GET, 0.0]), dst=0)
        got = torch.zeros(1)
        dist.recv(got, src=0)
        dist.send(torch.tensor([PUT, got.item() + 1]), dst=0)
    dist.destroy_process_group()


def position(rank):
    """Rank 0 tells each sender its arrival position; each assumes it came in rank order."""
    dist.init_process_group("gloo")
    t = torch.zeros(1)
    if rank == 0:
        for i in range(dist.get_world_size() - 1):
            src = dist.recv(t)
            dist.send(torch.tensor([float(i)]), dst=src)
    else:
        dist.send(t, dst=0)
        dist.recv(t, src=0)
        assert t.item() == rank - 1, f"rank {rank} came {int(t.item()) + 1}th"
    dist.destroy_process_group()


ONE_PREEMPTION = [
    (first_message, 4, simdist.RankError),
    (lost_update, 4, simdist.RankError),
    (racing_receives, 3, simdist.DeadlockError),
    (position, 4, simdist.RankError),
]
LARGER = [
    (first_message, 8, simdist.RankError),
    (lost_update, 6, simdist.RankError),
    (racing_receives, 3, simdist.DeadlockError),
    (position, 6, simdist.RankError),
]
IDS = ["first_message", "lost_update", "racing_receives", "position"]


def significant(choices) -> list[int]:
    """The choices up to the last non-zero one (the rest are implied)."""
    choices = list(choices)
    while choices and choices[-1] == 0:
        choices.pop()
    return choices


def nonzero(choices) -> int:
    return sum(1 for c in choices if c)


def where(err) -> object:
    """Where a failure happened, computed from the error's own report (the test's truth for 'the same failure')."""
    if isinstance(err, simdist.DeadlockError):
        return type(err), sorted(entry["call_site"] for entry in err.blocked)
    frame = traceback.extract_tb(err.__cause__.__traceback__)[-1]  # these programs raise in their own line
    return type(err), type(err.__cause__), frame.filename, frame.lineno


def outcome(fn, nprocs, choices):
    """``where`` of the failure of ``choices``, or None if the run passes."""
    try:
        simdist.simulate(fn, nprocs, schedule=list(choices), leaks="ignore")
    except simdist.DistError as err:
        return where(err)
    return None


def explored(fn, nprocs, kind, seed, strategy="pct"):
    with pytest.raises(kind) as info:
        sdt.explore(fn, nprocs, strategy=strategy, max_runs=200, seed=seed)
    return info.value


def replays_spent(err) -> int:
    """The replays the shrinker spent, from the note explore adds."""
    (spent,) = [
        int(m.group(1)) for note in err.__notes__ for m in [re.search(r"(\d+) (simpler ones )?replay", note)] if m
    ]
    return spent


@pytest.mark.parametrize(("fn", "nprocs", "kind"), ONE_PREEMPTION, ids=IDS)
def test_each_program_passes_by_default_and_fails_with_one_nonzero_choice(fn, nprocs, kind):
    assert outcome(fn, nprocs, []) is None
    widths = simdist.simulate(fn, nprocs, schedule=[]).option_counts
    singles = [outcome(fn, nprocs, [0] * i + [v]) for i, w in enumerate(widths) for v in range(1, w)]
    assert any(singles)


def shrink_to_one(fn, nprocs, kind, seeds, strategies=("pct", "random")):
    """For each seed (alternating the strategies): the shrunk error's non-zero choices and the replays spent."""
    counts, spent = [], []
    for seed in seeds:
        err = explored(fn, nprocs, kind, seed, strategies[seed % len(strategies)])
        counts.append(nonzero(err.choices))
        spent.append(replays_spent(err))
    return counts, spent


@pytest.mark.parametrize(("fn", "nprocs", "kind"), ONE_PREEMPTION, ids=IDS)
def test_a_one_preemption_bug_shrinks_to_one_nonzero_choice(fn, nprocs, kind):
    counts, _ = shrink_to_one(fn, nprocs, kind, range(10))
    assert counts.count(1) >= 9, counts


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize(("fn", "nprocs", "kind"), LARGER, ids=IDS)
def test_a_one_preemption_bug_shrinks_to_one_nonzero_choice_in_95_of_100_seeds(fn, nprocs, kind):
    counts, spent = shrink_to_one(fn, nprocs, kind, range(100))
    print(
        f"{fn.__name__} on {nprocs} ranks: {counts.count(1)}/100 shrunk to one non-zero choice; "
        f"replays per shrink: median {statistics.median(spent)}, max {max(spent)}"
    )
    assert counts.count(1) >= 95, counts


@pytest.mark.parametrize(("fn", "nprocs", "kind"), ONE_PREEMPTION, ids=IDS)
def test_the_shrunk_schedule_is_a_local_minimum(fn, nprocs, kind):
    for seed in range(3):
        err = explored(fn, nprocs, kind, seed)
        best = significant(err.choices)
        assert outcome(fn, nprocs, best) == where(err)  # it replays, failing as reported
        deletions = [best[:i] + best[i + 1 :] for i in range(len(best))]
        lowerings = [best[:i] + [low] + best[i + 1 :] for i, c in enumerate(best) if c for low in {0, c - 1}]
        assert deletions and lowerings
        for simpler in deletions + lowerings:
            assert outcome(fn, nprocs, simpler) != where(err), (best, simpler)


def failure_of(fn, nprocs, choices, **options):
    with pytest.raises(simdist.DistError) as info:
        simdist.simulate(fn, nprocs, schedule=choices, leaks="ignore", **options)
    return info.value


def test_failures_on_different_ranks_at_one_call_site_are_the_same_failure():
    on_1, on_2 = failure_of(position, 3, [0, 1]), failure_of(position, 3, [0, 1, 1])
    assert (on_1.rank, on_2.rank) == (1, 2)
    assert where(on_1)[1:] == where(on_2)[1:]  # one line of the program, two ranks
    assert same_failure(on_1, on_2) and same_failure(on_2, on_1)
    elsewhere = failure_of(first_message, 3, [0, 1])  # an AssertionError on another line
    assert isinstance(elsewhere.__cause__, AssertionError) and not same_failure(on_1, elsewhere)
    deadlock = failure_of(racing_receives, 3, [0, 1])
    assert not same_failure(on_1, deadlock)
    # so the shrinker may trade the failure on rank 2 for the simpler one on rank 1
    shrunk = minimize(position, 3, (), on_2, {"leaks": "ignore"})
    assert shrunk.rank == 1 and significant(shrunk.choices) == [0, 1]


def test_deadlocks_are_the_same_when_their_blocked_call_sites_are():
    a, b = failure_of(racing_receives, 3, [0, 1]), failure_of(racing_receives, 3, [2, 2, 2, 2])
    assert where(a) == where(b) and same_failure(a, b)
    shrunk = minimize(racing_receives, 3, (), b, {"leaks": "ignore"})
    assert nonzero(significant(shrunk.choices)) == 1 and where(shrunk) == where(b)


def test_minimize_rejects_an_error_without_choices():
    with pytest.raises(ValueError, match="err=DistError has no scheduler choices"):
        minimize(position, 3, (), simdist.DistError("not simulated"), {})


# -- check=fn ------------------------------------------------------------------------------------------------------


def arrival_order(rank):
    """Rank 0 returns the senders in the order their messages arrived; the others return None."""
    dist.init_process_group("gloo")
    order = None
    if rank == 0:
        order = [dist.recv(torch.zeros(1)) for _ in range(dist.get_world_size() - 1)]
    else:
        dist.send(torch.tensor([float(rank)]), dst=0)
    dist.all_reduce(torch.ones(2))
    dist.destroy_process_group()
    return order


def in_rank_order(values):
    assert values[0] == sorted(values[0]), f"arrivals {values[0]}"


def test_a_failing_check_is_reported_with_its_minimal_schedule():
    assert sdt.run(arrival_order, 3, schedule=[]).values[0] == [1, 2]  # the default schedule passes the check
    with pytest.raises(sdt.CheckError) as info:
        sdt.explore(arrival_order, 3, check=in_rank_order, max_runs=100, seed=0)
    err = info.value
    assert isinstance(err.__cause__, AssertionError) and "in_rank_order" in str(err)
    assert err.values[0] == [2, 1] and err.schedule in str(err)
    assert nonzero(err.choices) == 1
    # independent truth: the schedule really gives out-of-order values, and checked it fails the same way
    assert sdt.replay(arrival_order, 3, err.schedule).values[0] == [2, 1]
    with pytest.raises(sdt.CheckError) as again:
        sdt.run(arrival_order, 3, schedule=err.schedule, check=in_rank_order)
    assert same_failure(err, again.value)


def test_a_check_that_returns_false_fails_and_other_results_pass():
    with pytest.raises(sdt.CheckError, match="returned False") as info:
        sdt.explore(arrival_order, 3, check=lambda values: values[0] == [1, 2], max_runs=100, seed=0)
    assert info.value.__cause__ is None and nonzero(info.value.choices) == 1
    summary = sdt.explore(arrival_order, 3, check=lambda values: sorted(values[0]) == [1, 2], max_runs=30)
    assert summary.runs == 30


def test_spmd_checks_the_values_too():
    test = sdt.spmd(nprocs=3, max_runs=100, check=in_rank_order)(arrival_order)
    with pytest.raises(sdt.CheckError) as info:
        test()
    assert nonzero(info.value.choices) == 1
    sdt.spmd(nprocs=[2, 3], max_runs=10, check=lambda values: len(values[0]) == len(values) - 1)(arrival_order)()


def test_explore_seed_must_be_a_non_negative_int():
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match=f"seed={bad!r} must be a non-negative int"):
            sdt.explore(arrival_order, 2, seed=bad)


def test_check_must_be_callable():
    for call in (
        lambda: sdt.explore(arrival_order, 2, check=3),
        lambda: sdt.spmd(nprocs=2, check="x"),
        lambda: sdt.run(arrival_order, 2, check=[1]),
    ):
        with pytest.raises(TypeError, match="check=.* must be a function of the ranks' values"):
            call()


# -- seeds and leaks -----------------------------------------------------------------------------------------------


def arrivals(rank):
    """Every rank sends rank 0 five messages; rank 0 returns their senders in arrival order (the interleaving)."""
    dist.init_process_group("gloo")
    order = []
    for _ in range(5):
        if rank == 0:
            order += [dist.recv(torch.zeros(1)) for _ in range(dist.get_world_size() - 1)]
        else:
            dist.send(torch.ones(1), dst=0)
    dist.destroy_process_group()
    return tuple(order)


def orders(seed, strategy):
    seen: list[tuple] = []
    sdt.explore(arrivals, 8, strategy=strategy, seed=seed, max_runs=50, check=lambda values: seen.append(values[0]))
    return seen


@pytest.mark.parametrize("strategy", ["random", "pct"])
def test_explorations_of_consecutive_seeds_share_no_schedule(strategy):
    """Run i of seed s used to be run i - 1 of seed s + 1 (49 of 50 schedules shared); now the seeds are unrelated.

    Eight ranks give PCT (an order of the ranks, two change points) enough schedules that
    unrelated seeds do not meet by chance either.
    """
    first, second = orders(7, strategy), orders(8, strategy)
    assert len(first) == len(second) == 50
    assert not set(first) & set(second)  # a shared schedule would give a shared arrival order
    assert len(set(first)) == 50  # the runs of one exploration differ as well
    assert orders(7, strategy) == first  # and an exploration repeats exactly


def never_waited(rank):
    dist.init_process_group("gloo")
    if rank == 0:
        dist.isend(torch.ones(1), dst=1)  # BUG: the work is never waited
    else:
        dist.recv(torch.zeros(1), src=0)
    dist.destroy_process_group()


def test_never_waited_works_warn_by_default():
    with pytest.warns(simdist.LeakWarning, match="never waited"):
        sdt.run(never_waited, 2)
    with pytest.warns(simdist.LeakWarning, match="never waited") as record:
        sdt.explore(never_waited, 2, max_runs=5)
    assert len([w for w in record if issubclass(w.category, simdist.LeakWarning)]) == 1  # once per exploration
    assert record[0].filename == __file__


def test_leaks_can_still_be_ignored_or_raised():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sdt.run(never_waited, 2, leaks="ignore")
        sdt.explore(never_waited, 2, max_runs=3, leaks="ignore")
        sdt.explore(arrivals, 3, max_runs=3)  # waits every work, destroys its group: no warning
    with pytest.raises(simdist.DistError, match="never waited"):
        sdt.explore(never_waited, 2, max_runs=3, leaks="error")


def test_replaying_an_error_without_a_token_is_refused_by_name():
    """Only the error of a simulated run carries a schedule to replay; another is refused, not replayed as ``None``."""
    from simdist.testing._program import Program
    from simdist.testing._run import check_replays

    with pytest.raises(ValueError, match="DeadlockError carries no replay token"):
        check_replays(Program(lambda rank: None, 2), simdist.DeadlockError("made by hand"))
