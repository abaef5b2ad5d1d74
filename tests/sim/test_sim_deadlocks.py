"""The deadlock corpus: every program here deadlocks; each must end in DeadlockError, fast."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

import simdist
import simdist as dist

HERE = os.path.basename(__file__)


def _init():
    dist.init_process_group("gloo")


def head_to_head(rank):
    _init()
    t = torch.zeros(4)
    dist.send(t, dst=1 - rank)
    dist.recv(t, src=1 - rank)


def cyclic_ring(rank):
    _init()
    n = dist.get_world_size()
    t = torch.zeros(2)
    dist.send(t, dst=(rank + 1) % n)
    dist.recv(t, src=(rank - 1) % n)


def skip_collective(rank):
    _init()
    t = torch.ones(3)
    if rank != 2:
        dist.all_reduce(t)


def groups_opposite_order(rank):
    _init()
    a = dist.new_group([0, 1])
    b = dist.new_group([0, 1])
    t = torch.ones(2)
    if rank == 0:
        dist.all_reduce(t, group=a)
        dist.all_reduce(t, group=b)
    elif rank == 1:
        dist.all_reduce(t, group=b)
        dist.all_reduce(t, group=a)


def tag_mismatch(rank):
    _init()
    t = torch.zeros(1)
    if rank == 0:
        dist.send(t, dst=1, tag=1)
    else:
        dist.recv(t, src=0, tag=2)


def recv_nobody_sends(rank):
    _init()
    if rank == 1:
        dist.recv(torch.zeros(1), src=0)


def recv_recv(rank):
    _init()
    t = torch.zeros(1)
    dist.recv(t, src=1 - rank)
    dist.send(t, dst=1 - rank)


def p2p_against_collective(rank):
    _init()
    t = torch.zeros(1)
    if rank == 0:
        dist.recv(t, src=1)
        dist.barrier()
    else:
        dist.barrier()
        dist.send(t, dst=0)


def wrong_peer(rank):
    _init()
    t = torch.zeros(1)
    if rank == 0:
        dist.send(t, dst=2)
    elif rank == 1:
        dist.recv(t, src=0)


def any_source_nobody(rank):
    _init()
    dist.recv(torch.zeros(1))


def subgroup_vs_world(rank):
    _init()
    g = dist.new_group([0, 1])
    if rank == 0:
        dist.barrier()
    elif rank == 1:
        dist.barrier(group=g)


def irecv_waited_never_sent(rank):
    _init()
    t = torch.zeros(2)
    if rank == 0:
        work = dist.irecv(t, src=1, tag=5)
        work.wait()
    else:
        dist.isend(t, dst=0, tag=6).wait()


def batch_only_receives(rank):
    _init()
    n = dist.get_world_size()
    bufs = [torch.zeros(1), torch.zeros(1)]
    ops = [dist.P2POp(dist.irecv, bufs[0], (rank - 1) % n), dist.P2POp(dist.irecv, bufs[1], (rank + 1) % n)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()


def async_collective_then_recv(rank):
    _init()
    t = torch.ones(4)
    if rank == 0:
        work = dist.all_reduce(t, async_op=True)
        dist.recv(torch.zeros(1), src=1)
        work.wait()
    else:
        dist.recv(torch.zeros(1), src=0)
        dist.all_reduce(t)


def rooted_collective_missing_root(rank):
    _init()
    t = torch.ones(2)
    if rank != 0:
        dist.broadcast(t, src=0)


def some_schedules_only(rank):
    # Rank 0 takes the first message from anyone, then expects rank 1: deadlocks
    # exactly when rank 1's message is the one taken first.
    _init()
    t = torch.zeros(1)
    if rank == 0:
        dist.recv(t)
        dist.recv(t, src=1)
    else:
        dist.send(t, dst=0)


CORPUS = [
    # (program, world size, options, ranks expected blocked)
    (head_to_head, 2, {}, {0, 1}),
    (cyclic_ring, 4, {}, {0, 1, 2, 3}),
    (skip_collective, 3, {}, {0, 1}),
    (skip_collective, 3, {"detail": "collectives"}, {0, 1}),
    (groups_opposite_order, 3, {}, {0, 1}),
    (groups_opposite_order, 3, {"detail": "collectives"}, {0, 1}),
    (tag_mismatch, 2, {}, {0, 1}),
    (recv_nobody_sends, 2, {}, {1}),
    (recv_recv, 2, {}, {0, 1}),
    (p2p_against_collective, 2, {}, {0, 1}),
    (wrong_peer, 3, {}, {0, 1}),
    (any_source_nobody, 3, {}, {0, 1, 2}),
    (subgroup_vs_world, 3, {}, {0, 1}),
    (irecv_waited_never_sent, 2, {}, {0, 1}),
    (batch_only_receives, 3, {}, {0, 1, 2}),
    (async_collective_then_recv, 2, {}, {0, 1}),
    (rooted_collective_missing_root, 3, {}, {1, 2}),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("program,world,options,blocked", CORPUS, ids=lambda v: getattr(v, "__name__", None))
def test_deadlock_is_reported_fast(program, world, options, blocked):
    before = threading.active_count()
    start = time.perf_counter()
    with pytest.raises(simdist.DeadlockError) as info:
        simdist.simulate(program, world, **options)
    elapsed = time.perf_counter() - start
    err = info.value
    assert elapsed < 30, f"took {elapsed:.2f} s"  # the scheduler finds it at once; a missed one would hang
    assert {b["rank"] for b in err.blocked} == blocked
    for b in err.blocked:
        assert HERE in b["call_site"], b
        assert f"rank {b['rank']} is blocked" in str(err)
    assert set(err.graph.nodes) >= blocked
    assert err.schedule and err.schedule in str(err)
    assert threading.active_count() == before
    with pytest.raises(simdist.DeadlockError) as again:
        simdist.simulate(program, world, schedule=err.schedule, **options)
    assert str(again.value) == str(err)


def test_head_to_head_report_names_cycle_lines_and_messages():
    with pytest.raises(simdist.DeadlockError) as info:
        simdist.simulate(head_to_head, 2)
    err = info.value
    line = head_to_head.__code__.co_firstlineno + 3
    assert all(b["call_site"].endswith(f"{HERE}:{line}") for b in err.blocked)
    assert sorted(err.cycle) == [0, 1]
    assert "wait-for cycle: 0 -> 1 -> 0" in str(err) or "wait-for cycle: 1 -> 0 -> 1" in str(err)
    assert len(err.unmatched) == 2 and all("send" in u for u in err.unmatched)
    assert {(b["op"], b["peer"]) for b in err.blocked} == {("send", 1), ("send", 0)}


def test_eager_limit_hides_head_to_head():
    assert simdist.simulate(head_to_head, 2, eager_limit=1024).values == [None, None]


def test_skip_collective_names_the_missing_rank():
    with pytest.raises(simdist.DeadlockError) as info:
        simdist.simulate(skip_collective, 3)
    text = str(info.value)
    assert "waiting for ranks [2] to join it" in text
    assert "ranks [2] finished without calling it" in text
    assert all(set(info.value.graph.successors(r)) == {2} for r in (0, 1))


def test_deadlock_only_under_some_schedules():
    outcomes = {}
    for seed in range(40):
        try:
            simdist.simulate(some_schedules_only, 3, seed=seed)
            outcomes.setdefault("ok", seed)
        except simdist.DeadlockError as err:
            outcomes.setdefault("deadlock", err)
    assert "ok" in outcomes and "deadlock" in outcomes
    token = outcomes["deadlock"].schedule
    with pytest.raises(simdist.DeadlockError):
        simdist.simulate(some_schedules_only, 3, schedule=token)
    # the same program, a schedule that avoids it
    simdist.simulate(some_schedules_only, 3, seed=outcomes["ok"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("program,world,options,blocked", CORPUS, ids=lambda v: getattr(v, "__name__", None))
def test_deadlock_is_reported_the_same_with_ranks_as_processes(program, world, options, blocked):
    errors = []
    for isolation in ("threads", "processes"):
        with pytest.raises(simdist.DeadlockError) as info:
            simdist.simulate(program, world, isolation=isolation, **options)
        errors.append(info.value)
    threads, processes = errors
    assert str(processes) == str(threads) and processes.schedule == threads.schedule
    assert processes.blocked == threads.blocked and processes.unmatched == threads.unmatched
    assert sorted(processes.graph.edges) == sorted(threads.graph.edges)
