"""The socket backend end to end: real processes, the same programs as on the simulator."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
import torch

import simdist
import simdist as dist

pytestmark = pytest.mark.timeout(120)


def seed_all_reduce(rank, world_size):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    tensor = torch.tensor([rank + 1], dtype=torch.float32)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    dist.destroy_process_group()
    return tensor.item()


def seed_scatter_gather(rank, world_size):
    dist.init_process_group("gloo")
    mine = torch.zeros(1)
    scatter_list = [torch.tensor([i + 1.0]) for i in range(world_size)] if rank == 0 else None
    dist.scatter(tensor=mine, scatter_list=scatter_list, src=0)
    gather_list = [torch.zeros(1) for _ in range(world_size)] if rank == 0 else None
    dist.gather(tensor=mine * 10, gather_list=gather_list, dst=0)
    dist.destroy_process_group()
    return mine.item(), [t.item() for t in gather_list] if gather_list else None


def every_collective(rank, world_size):
    """Each collective once on integer data; returns results comparable across backends."""
    dist.init_process_group("gloo")
    out = {}
    t = torch.arange(6, dtype=torch.int64) + 10 * rank
    a = t.clone()
    dist.all_reduce(a)
    out["all_reduce"] = a.tolist()
    b = t.clone()
    dist.broadcast(b, src=world_size - 1)
    out["broadcast"] = b.tolist()
    c = t.clone()
    dist.reduce(c, dst=0, op=dist.ReduceOp.MAX)
    out["reduce"] = c.tolist() if rank == 0 else None
    g = [torch.zeros(6, dtype=torch.int64) for _ in range(world_size)]
    dist.all_gather(g, t)
    out["all_gather"] = [x.tolist() for x in g]
    rs = torch.zeros(2, dtype=torch.int64)
    dist.reduce_scatter_tensor(rs, torch.arange(2 * world_size, dtype=torch.int64) * (rank + 1))
    out["reduce_scatter"] = rs.tolist()
    a2a = torch.zeros(world_size, dtype=torch.int64)
    dist.all_to_all_single(a2a, torch.arange(world_size, dtype=torch.int64) + 100 * rank)
    out["all_to_all"] = a2a.tolist()
    objs = [None] * world_size
    dist.all_gather_object(objs, {"rank": rank})
    out["objects"] = objs
    f = torch.linspace(-1.0, 1.0, 7, dtype=torch.float32) * (rank + 0.5)
    work = dist.all_reduce(f, op=dist.ReduceOp.AVG, async_op=True)
    work.wait()
    out["float_avg"] = f.tolist()
    dist.barrier()
    dist.destroy_process_group()
    return out


def ring_p2p(rank, world_size):
    dist.init_process_group("gloo")
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    got = np.zeros(4, dtype=np.float32)
    works = [dist.isend(np.full(4, rank, dtype=np.float32), dst=right), dist.irecv(got, src=left)]
    for w in works:
        w.wait()
    dist.destroy_process_group()
    return got.tolist()


def raises_on_rank_1(rank, world_size):
    dist.init_process_group("gloo")
    if rank == 1:
        raise KeyError("rank 1 cannot find its data")
    dist.barrier()


def killed_mid_collective(rank, world_size):
    dist.init_process_group("gloo")
    dist.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(1 << 16))
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [1, 2, 4])
def test_seed_all_reduce_on_processes(world):
    assert (
        simdist.spawn(seed_all_reduce, args=(world,), nprocs=world, backend="socket")
        == [float(sum(range(1, world + 1)))] * world
    )


def test_seed_scatter_and_gather():
    res = simdist.spawn(seed_scatter_gather, args=(3,), nprocs=3, backend="socket")
    assert [r[0] for r in res] == [1.0, 2.0, 3.0]
    assert res[0][1] == [10.0, 20.0, 30.0]


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
def test_results_match_the_simulator(world):
    """Integer results equal the simulator's bit for bit; float results agree within tolerance."""
    real = simdist.spawn(every_collective, args=(world,), nprocs=world, backend="socket")
    simulated = simdist.spawn(every_collective, args=(world,), nprocs=world, backend="sim")
    for r, s in zip(real, simulated):
        assert np.allclose(r.pop("float_avg"), s.pop("float_avg"), rtol=1e-6, atol=1e-7)
    assert real == simulated


def test_point_to_point_ring_with_numpy():
    assert simdist.spawn(ring_p2p, args=(3,), nprocs=3, backend="socket") == [[2.0] * 4, [0.0] * 4, [1.0] * 4]


def returns_a_big_tensor(rank):
    return torch.full((1 << 18,), float(rank)), np.arange(rank, dtype=np.int16)


@pytest.mark.parametrize("start_method", ["forkserver", "fork"])
def test_return_values_travel_by_value(start_method):
    """Tensors and arrays come back whole though their rank has exited (no shared-memory handles)."""
    values = simdist.spawn(returns_a_big_tensor, nprocs=6, backend="socket", start_method=start_method)
    for rank, (t, a) in enumerate(values):
        assert t.shape == (1 << 18,) and bool((t == rank).all())
        assert a.tolist() == list(range(rank))


def test_exception_in_a_rank_is_a_rank_error():
    with pytest.raises(simdist.RankError) as info:
        simdist.spawn(raises_on_rank_1, args=(3,), nprocs=3, backend="socket", timeout=20)
    assert info.value.rank == 1
    assert isinstance(info.value.__cause__, KeyError)


def _children() -> set[int]:
    me = os.getpid()
    out = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                        out.add(int(pid))
            except OSError:
                pass
    return out


def rank_only(rank):
    return rank


@pytest.mark.timeout(300)
def test_killed_rank_fails_the_job_without_hanging_or_orphans():
    simdist.spawn(rank_only, nprocs=1, backend="socket")  # starts the forkserver and resource tracker, which stay
    before = _children()
    start = time.monotonic()
    with pytest.raises(simdist.RankError) as info:
        simdist.spawn(killed_mid_collective, args=(3,), nprocs=3, backend="socket", timeout=200)
    assert time.monotonic() - start < 100  # through the lost peer, not the 200 s timeout
    assert info.value.rank in (0, 1, 2)
    deadline = time.monotonic() + 30  # spawn has joined its ranks; /proc may show them a moment longer
    while _children() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _children() - before == set()


def skips_an_all_reduce(rank, world_size):
    dist.init_process_group("gloo")
    dist.barrier()
    if rank == 2:
        time.sleep(600)  # never enters the all_reduce: spawn stops it once another rank has failed
        return None
    dist.all_reduce(torch.ones(4))


def test_timeout_reports_which_rank_never_entered_the_collective():
    # a timeout long enough for joining and the barrier on a busy machine: only the all_reduce meets it
    with pytest.raises(simdist.RankError) as info:
        simdist.spawn(skips_an_all_reduce, args=(3,), nprocs=3, backend="socket", timeout=20)
    err = info.value.__cause__
    assert isinstance(err, simdist.DistTimeoutError)
    text = str(err)
    assert "timed out in #2 (all_reduce) on group 0" in text
    assert "rank 2 completed #1 (barrier) and never entered #2 (all_reduce) on group 0" in text
    assert "its last call site is" in text and "test_socket_backend.py" in text


def waits_alone_on_a_short_group(rank, world_size):
    dist.init_process_group("gloo")
    group = dist.new_group(list(range(world_size)), timeout=1)
    outcome = None
    if rank == 0:  # alone: the group's own timeout ends the wait, the world's (20 s) does not
        start = time.monotonic()
        with pytest.raises(simdist.DistTimeoutError, match="rank 1 never entered a collective on group 1"):
            dist.barrier(group=group)
        outcome = time.monotonic() - start
    dist.barrier()  # the world's group still works
    dist.destroy_process_group()
    return outcome


def test_a_groups_own_timeout_ends_its_waits():
    waited, _ = simdist.spawn(waits_alone_on_a_short_group, args=(2,), nprocs=2, backend="socket", timeout=20)
    assert 1.0 <= waited < 10.0


def traced_program(rank, world_size):
    dist.init_process_group("gloo")
    t = torch.ones(1000)
    for _ in range(3):
        dist.all_reduce(t)
    dist.broadcast(t, src=0)
    dist.destroy_process_group()


def test_simdist_trace_makes_every_rank_write_a_trace_that_merges(tmp_path, monkeypatch):
    monkeypatch.setenv("SIMDIST_TRACE", str(tmp_path))
    simdist.spawn(traced_program, args=(3,), nprocs=3, backend="socket")
    files = sorted(tmp_path.glob("rank*.trace.json"))
    assert [f.name for f in files] == ["rank0.trace.json", "rank1.trace.json", "rank2.trace.json"]
    trace = simdist.Trace.merge([simdist.Trace.from_json(f.read_text()) for f in files])
    assert trace.meta["backend"] == "socket" and trace.meta["world_size"] == 3
    for rank in range(3):
        ops = [(e.op, e.collective_id) for e in trace if e.rank == rank]
        assert ops == [("all_reduce", 1), ("all_reduce", 2), ("all_reduce", 3), ("broadcast", 4)]
    assert all(0 <= e.t_start <= e.t_end < 60 for e in trace)
    from simdist import visualize as V

    assert V.timeline(trace).world == 3


def picks_for_1_mib(rank, world_size):
    from simdist.core._group import Options
    from simdist.core._world import current_world

    dist.init_process_group("gloo")
    picked = current_world().default_group._pick("all_reduce", Options(), 1 << 20)
    dist.destroy_process_group()
    return picked


def test_one_machine_keeps_the_models_all_reduce_choice():
    """On one machine the automatic choice is the model's (across machines it is ring_pipelined from
    ACROSS_HOSTS_RING_BYTES: tests/launch/test_across_hosts.py)."""
    from simdist.backends.socket._group import SocketGroup

    picked = simdist.spawn(picks_for_1_mib, args=(4,), nprocs=4, backend="socket", timeout=60)
    expected = simdist.algorithms.choose("all_reduce", 1 << 20, 4, **SocketGroup.network)
    assert picked == [expected] * 4 and expected != "ring_pipelined", picked
