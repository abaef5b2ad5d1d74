"""Strategies, replay tokens, exhaustive enumeration, determinism and false alarms."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap

import pytest
import torch

import simdist
import simdist as dist
from simdist.backends.sim import PCTStrategy, RandomStrategy, ReplayStrategy
from simdist.backends.sim._strategies import decode_choices, encode_choices

pytestmark = pytest.mark.slow  # slow: starts processes or explores many schedules (quick feedback: -m 'not slow')


def racy(rank):
    """Rank 0 records the order in which the others' messages arrive."""
    dist.init_process_group("gloo")
    t = torch.tensor([float(rank)])
    if rank == 0:
        return [dist.recv(t) for _ in range(dist.get_world_size() - 1)]
    dist.send(t, dst=0)
    return None


def mixed(rank, world):
    """A correct program mixing collectives, p2p, subgroups, async ops and any-source receives."""
    dist.init_process_group("gloo")
    t = torch.arange(4.0) + rank
    dist.all_reduce(t)
    sub = dist.new_group(list(range(0, world, 2)))
    if rank % 2 == 0:
        dist.broadcast(t, src=0, group=sub)
    right, left = (rank + 1) % world, (rank - 1) % world
    buf = torch.zeros(4)
    works = [dist.isend(t, dst=right), dist.irecv(buf, src=left)]
    for w in works:
        w.wait()
    if rank == 0:
        got = sorted(dist.recv(torch.zeros(1)) for _ in range(world - 1))
        assert got == list(range(1, world))
    else:
        dist.send(torch.ones(1), dst=0)
    work = dist.all_gather(out := [torch.zeros(4) for _ in range(world)], buf, async_op=True)
    simdist.compute(1e-6)
    work.wait()
    dist.barrier()
    dist.destroy_process_group()
    return float(sum(o.sum() for o in out))


def test_tokens_round_trip():
    for choices in ([], [0], [1, 0, 3], [5] * 300, list(range(1000))):
        assert decode_choices(encode_choices(choices)) == [*choices][: len(choices)] or choices[-1] == 0
    assert decode_choices(encode_choices([2, 0, 0])) == [2]
    with pytest.raises(ValueError, match="schedule='choices:\\$\\$'"):
        simdist.simulate(racy, 3, schedule="choices:$$")


@pytest.mark.parametrize("strategy", ["random", "round_robin", "pct"])
def test_same_seed_same_run_and_token_replays(strategy):
    a = simdist.simulate(mixed, 4, (4,), seed=3, strategy=strategy)
    b = simdist.simulate(mixed, 4, (4,), seed=3, strategy=strategy)
    assert a.values == b.values and a.choices == b.choices
    assert a.trace.to_chrome_json() == b.trace.to_chrome_json()
    replay = simdist.simulate(mixed, 4, (4,), schedule=a.schedule)
    assert replay.trace.to_json() == a.trace.to_json()
    explicit = simdist.simulate(mixed, 4, (4,), schedule=a.choices)
    assert explicit.trace.events == a.trace.events
    assert explicit.schedule.startswith("choices:")
    again = simdist.simulate(mixed, 4, (4,), schedule=explicit.schedule)
    assert again.trace.events == a.trace.events


def test_any_source_order_is_a_scheduler_choice():
    orders = {tuple(simdist.simulate(racy, 4, seed=s).values[0]) for s in range(30)}
    assert len(orders) > 1
    assert all(sorted(o) == [1, 2, 3] for o in orders)


def test_choice_zero_keeps_the_lowest_rank():
    res = simdist.simulate(racy, 4, schedule=[])
    assert res.values[0] == [1, 2, 3]
    assert all(c == 0 for c in res.choices)


def test_out_of_range_choices_wrap():
    res = simdist.simulate(racy, 3, schedule=[7, 9, 11, 13])
    assert sorted(res.values[0]) == [1, 2]
    assert all(c < n for c, n in zip(res.choices, res.option_counts))


def test_strategy_objects():
    res = simdist.simulate(racy, 3, strategy=PCTStrategy(seed=2, depth=2, steps=20))
    assert res.schedule == "pct:2:2:20@world=3"
    assert simdist.simulate(racy, 3, schedule=res.schedule).values == res.values
    assert simdist.simulate(racy, 3, strategy=ReplayStrategy(res.choices)).values == res.values


def test_enumerate_schedules_visits_every_schedule_once():
    results = list(simdist.enumerate_schedules(racy, 3, max_runs=1000))
    assert {tuple(r.values[0]) for r in results} == {(1, 2), (2, 1)}
    assert len({tuple(r.choices) for r in results}) == len(results) == 112
    assert all(c < n for r in results for c, n in zip(r.choices, r.option_counts))


def test_enumerate_schedules_stops_at_max_runs_with_a_warning():
    with pytest.warns(UserWarning, match="max_runs=50"):
        assert len(list(simdist.enumerate_schedules(racy, 4, max_runs=50))) == 50


def test_enumerate_schedules_raises_the_failing_schedule():
    def fragile(rank):
        dist.init_process_group("gloo")
        t = torch.zeros(1)
        if rank == 0:
            dist.recv(t)
            dist.recv(t, src=1)
        else:
            dist.send(t, dst=0)

    with pytest.raises(simdist.DeadlockError) as info:
        for _ in simdist.enumerate_schedules(fragile, 3, max_runs=100):
            pass
    assert info.value.schedule.startswith("choices:")


@pytest.mark.timeout(240)
def test_no_false_alarms_over_1000_schedules():
    runs = 0
    for seed in range(350):
        for world, strategy in ((3, "random"), (4, "pct"), (5, "random")):
            res = simdist.simulate(mixed, world, (world,), seed=seed, strategy=strategy, leaks="error")
            expected = float(sum((torch.arange(4.0) * world + sum(range(world))).sum() for _ in range(world)))
            assert res.values == [expected] * world
            runs += 1
    for world in (2, 3, 4, 6):
        res = simdist.simulate(mixed, world, (world,), strategy="round_robin", leaks="error")
        runs += 1
    assert runs >= 1000


_CHILD = textwrap.dedent(
    """
    import hashlib, sys, torch, random
    import simdist, simdist as dist
    sys.path.insert(0, {tests!r})
    from test_sim_schedules import mixed
    random.seed()  # the parent process's own state must not matter
    res = simdist.simulate(mixed, 5, (5,), seed=11, detail={detail!r})
    print(res.values, res.schedule, hashlib.sha256(res.trace.to_chrome_json().encode()).hexdigest())
    """
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("detail", ["messages", "collectives"])
def test_determinism_across_processes(detail):
    import os

    code = _CHILD.format(tests=os.path.dirname(__file__), detail=detail)
    outs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100) for _ in range(2)]
    for o in outs:
        assert o.returncode == 0, o.stderr
    assert outs[0].stdout == outs[1].stdout
    local = simdist.simulate(mixed, 5, (5,), seed=11, detail=detail)
    digest = hashlib.sha256(local.trace.to_chrome_json().encode()).hexdigest()
    assert outs[0].stdout.split()[-1] == digest


def test_footprints_reach_a_strategy_that_observes():
    """Rank r sends to rank 0 with tag r: each message's key (ctx, dst, tag) is in some footprint."""

    class Observing(RandomStrategy):
        def observe(self, ran, footprint, runnable):
            seen.append(set(footprint))

    def tagged(rank):
        dist.init_process_group("gloo")
        t = torch.zeros(1)
        if rank == 0:
            for src in range(1, 4):
                dist.recv(t, src=src, tag=src)
        else:
            dist.send(t, dst=0, tag=rank)
        dist.destroy_process_group()

    seen: list[set] = []
    simdist.simulate(tagged, 4, strategy=Observing(0), leaks="ignore")
    keys = {k for fp in seen for k in fp if len(k) == 3 and isinstance(k[0], tuple)}
    assert {(dst, tag) for _, dst, tag in keys} == {(0, 1), (0, 2), (0, 3)}
