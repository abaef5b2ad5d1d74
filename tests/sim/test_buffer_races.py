"""Buffer races: writing to the buffer of an in-flight isend/irecv raises BufferRaceError under every schedule.

The check (``simulate(..., check_buffers=True)``, on in ``simdist.testing``) copies the
buffer when the operation is posted and compares at its completion. Expected call sites
are read from this file's source (the line holding the call), not from simdist.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
import torch.distributed as tdist
from hypothesis import given, settings

import simdist
import simdist as dist
import simdist.testing as st
from simdist.testing import schedules

pytestmark = pytest.mark.timeout(180)

STRATEGIES = ("random", "round_robin", "pct")


def site_of(fn, text: str) -> str:
    """``file:line`` of the only line of ``fn``'s source that contains ``text``."""
    lines, start = inspect.getsourcelines(fn)
    hits = [start + i for i, line in enumerate(lines) if text in line]
    assert len(hits) == 1, (text, hits)
    return f"{__file__}:{hits[0]}"


def race_of(fn, nprocs: int, **options) -> simdist.BufferRaceError:
    with pytest.raises(simdist.BufferRaceError) as info:
        simdist.simulate(fn, nprocs, check_buffers=True, **options)
    return info.value


# -- a send buffer written before the send completed ---------------------------------------------------------

DELIVERED: list[float] = []  # what rank 1 received, run after run (rank threads run one at a time)


def isend_then_fill(rank):
    dist.init_process_group("gloo")
    t = torch.full((4,), float(rank + 1))
    if rank == 0:
        w = dist.isend(t, 1)  # the racing send
        t.fill_(7.0)
        w.wait()
    elif rank == 1:
        dist.recv(t, 0)
        DELIVERED.append(t[0].item())
        dist.send(t, 2)
    else:
        dist.recv(t, 1)
    dist.destroy_process_group()


def option_sets() -> list[dict]:
    return [{"strategy": s, "seed": seed} for s in STRATEGIES for seed in range(8)]


def test_the_race_is_real_without_the_check() -> None:
    """Unchecked, some schedules deliver the old values and some the written ones (so the schedules below vary)."""
    DELIVERED.clear()
    for opts in option_sets():
        simdist.simulate(isend_then_fill, 3, leaks="ignore", **opts)
    assert set(DELIVERED) == {1.0, 7.0}


def test_isend_written_before_wait_raises_under_every_seeded_schedule() -> None:
    site = site_of(isend_then_fill, "the racing send")
    DELIVERED.clear()
    choices = set()
    for opts in option_sets():
        err = race_of(isend_then_fill, 3, **opts)
        assert (err.rank, err.op, err.call_site) == (0, "isend", site)
        assert f"rank 0: buffer race on the isend at {site}" in str(err)
        assert "elements 0..3, float32" in str(err)
        assert err.schedule is not None
        choices.add(tuple(err.choices))
    assert len(choices) >= 2  # the runs took different interleavings
    assert len(option_sets()) >= 20
    assert DELIVERED and set(DELIVERED) == {1.0}  # the copy taken at post travels, never the written values


@settings(max_examples=25, deadline=None)
@given(schedule=schedules(max_choices=12, max_option=3))
def test_isend_written_before_wait_raises_under_drawn_schedules(schedule) -> None:
    err = race_of(isend_then_fill, 3, schedule=list(schedule))
    assert (err.rank, err.op) == (0, "isend")
    assert err.call_site == site_of(isend_then_fill, "the racing send")


def test_the_error_replays_with_its_token() -> None:
    err = race_of(isend_then_fill, 3, seed=4)
    again = race_of(isend_then_fill, 3, schedule=err.schedule)
    assert str(again) == str(err)


def test_changed_bytes_are_the_ones_written() -> None:
    def fn(rank):
        dist.init_process_group("gloo")
        t = torch.zeros(8, dtype=torch.int32)
        if rank == 0:
            w = dist.isend(t, 1)
            t[2:5] = torch.tensor([1, 256, 1 << 16], dtype=torch.int32)  # bytes 8, 13 and 18 (little-endian)
            w.wait()
        else:
            dist.recv(t, 0)
        dist.destroy_process_group()

    err = race_of(fn, 2)
    assert err.changed == (8, 18)
    assert "bytes 8..18 (elements 2..4, int32)" in str(err)


def test_a_never_waited_send_is_reported_at_the_end_of_the_run() -> None:
    def fn(rank):
        dist.init_process_group("gloo")
        t = torch.ones(3)
        if rank == 0:
            dist.isend(t, 1)  # never waited
            t.add_(1)
        else:
            dist.recv(t, 0)
        dist.destroy_process_group()

    err = race_of(fn, 2, leaks="ignore")
    assert (err.rank, err.op, err.call_site) == (0, "isend", site_of(fn, "never waited"))
    assert "the end of the run" in str(err)


def test_numpy_and_non_contiguous_send_buffers() -> None:
    def fn(rank, kind):
        dist.init_process_group("gloo")
        base = np.zeros((3, 2), dtype=np.float64) if kind == "numpy" else torch.zeros(2, 3)
        t = base if kind == "numpy" else base.t()  # a transposed tensor: not contiguous
        if rank == 0:
            w = dist.isend(t, 1)
            t[1, 1] = 5
            w.wait()
        else:
            dist.recv(t, 0)
        dist.destroy_process_group()

    for kind in ("numpy", "transposed"):
        err = race_of(fn, 2, args=(kind,))
        itemsize = 8 if kind == "numpy" else 4
        assert err.changed[0] // itemsize == 3  # element [1, 1] of a (3, 2) array, in row-major order
        assert (err.rank, err.op) == (0, "isend")


# -- batch_isend_irecv -------------------------------------------------------------------------------------------


def batch_ring(rank, racer, what):
    dist.init_process_group("gloo")
    n = dist.get_world_size()
    out, inp = torch.full((2,), float(rank)), torch.zeros(2)
    ops = [dist.P2POp(dist.isend, out, (rank + 1) % n), dist.P2POp(dist.irecv, inp, (rank - 1) % n)]
    works = dist.batch_isend_irecv(ops)  # the batch
    if rank == racer:
        (out if what == "send" else inp).fill_(9.0)
    for w in works:
        w.wait()
    dist.destroy_process_group()
    return inp.tolist()


@pytest.mark.parametrize("what", ["send", "recv"])
def test_batch_isend_irecv_buffer_written_before_wait(what: str) -> None:
    site = site_of(batch_ring, "the batch")
    for seed in range(6):
        err = race_of(batch_ring, 3, args=(1, what), seed=seed)
        assert (err.rank, err.op, err.call_site) == (1, "isend" if what == "send" else "irecv", site)


def test_batch_isend_irecv_without_a_race_delivers() -> None:
    for seed in range(6):
        res = simdist.simulate(batch_ring, 3, args=(None, "send"), seed=seed, check_buffers=True)
        assert res.values == [[2.0, 2.0], [0.0, 0.0], [1.0, 1.0]]


# -- a receive buffer written before the receive completed -------------------------------------------------------


def irecv_then_write(rank):
    dist.init_process_group("gloo")
    t = torch.zeros(4)
    if rank == 1:
        w = dist.irecv(t, 0)  # the racing receive
        t[3] = -1.0
        w.wait()
    else:
        dist.send(torch.full((4,), 3.0), 1)
    dist.destroy_process_group()


def test_irecv_written_before_wait_raises_under_every_schedule() -> None:
    site = site_of(irecv_then_write, "the racing receive")
    for opts in option_sets():
        err = race_of(irecv_then_write, 2, **opts)
        assert (err.rank, err.op, err.call_site) == (1, "irecv", site)
        assert "elements 3..3, float32" in str(err)


@settings(max_examples=10, deadline=None)
@given(schedule=schedules(max_choices=8, max_option=2))
def test_irecv_written_before_wait_raises_under_drawn_schedules(schedule) -> None:
    err = race_of(irecv_then_write, 2, schedule=list(schedule))
    assert (err.rank, err.op) == (1, "irecv")


def test_a_write_of_the_same_values_is_no_race() -> None:
    """Bytes are compared: writing what the buffer holds changes nothing, under every schedule alike."""

    def fn(rank):
        dist.init_process_group("gloo")
        t = torch.zeros(4)
        if rank == 1:
            w = dist.irecv(t, 0)
            t.zero_()
            w.wait()
        else:
            dist.send(torch.full((4,), 3.0), 1)
        dist.destroy_process_group()
        return t.tolist()

    for seed in range(6):
        assert simdist.simulate(fn, 2, seed=seed, check_buffers=True).values[1] == [3.0] * 4


# -- an operation posted over the buffer of one still in flight ---------------------------------------------------


def receive_over_send(rank):
    """Each rank sends its buffer and receives its peer's into the same buffer, waiting for the send first."""
    dist.init_process_group("gloo")
    buf = torch.full((4,), float(rank))
    sending = dist.isend(buf, 1 - rank)  # the send in flight
    receiving = dist.irecv(buf, 1 - rank)  # the receive into its buffer
    sending.wait()  # (waited first: the buffer was still as it was at the send's post)
    receiving.wait()
    dist.destroy_process_group()
    return buf.tolist()


def test_a_receive_posted_into_the_buffer_of_a_send_in_flight_races_under_every_schedule() -> None:
    """On a network the receive may write the buffer while the send still reads it; the comparison at each wait
    cannot see it (the send is waited for before the receive lands), so the post itself is the race."""
    sent, received = site_of(receive_over_send, "the send in flight"), site_of(receive_over_send, "the receive into")
    for opts in option_sets():
        err = race_of(receive_over_send, 2, **opts)
        assert (err.op, err.call_site, err.changed) == ("isend", sent, (0, 15)), err
        assert f"the irecv at {received} writes to the buffer of an earlier isend at {sent}" in str(err)
    unchecked = {str(simdist.simulate(receive_over_send, 2, **opts).values) for opts in option_sets()}
    assert str([[1.0] * 4, [0.0] * 4]) not in unchecked, unchecked  # unchecked, one rank's values are lost


def test_a_send_posted_from_the_buffer_of_a_receive_in_flight_races() -> None:
    def fn(rank):
        dist.init_process_group("gloo")
        buf = torch.zeros(6)
        receiving = dist.irecv(buf[2:4], 1 - rank)  # the receive in flight
        sending = dist.isend(buf[3:], 1 - rank)  # the send of memory it writes
        receiving.wait()
        sending.wait()
        dist.destroy_process_group()

    with pytest.raises(simdist.BufferRaceError, match="the isend at .* reads the buffer of an earlier irecv") as info:
        simdist.simulate(fn, 2, check_buffers=True, leaks="ignore")
    assert (info.value.op, info.value.changed) == ("irecv", (4, 7))  # buf[3], the second element of buf[2:4]
    assert info.value.call_site.endswith(str(inspect.getsourcelines(fn)[1] + 3))


def test_operations_in_flight_on_disjoint_or_interleaved_parts_of_one_buffer_or_two_sends_of_it_do_not_race() -> None:
    def fn(rank):
        dist.init_process_group("gloo")
        peer = 1 - rank
        got = torch.zeros(8)
        mine = torch.arange(8.0) + 10 * rank
        works = [
            dist.irecv(got[0::2], peer),  # interleaved views of one buffer: no element in common
            dist.irecv(got[1::2], peer),
            dist.isend(mine[0::2].contiguous(), peer),
            dist.isend(mine[1::2].contiguous(), peer),
            dist.isend(mine, peer),  # two sends of one buffer only read it
            dist.isend(mine, peer),
        ]
        twice = [torch.zeros(8), torch.zeros(8)]
        works += [dist.irecv(twice[0], peer), dist.irecv(twice[1], peer)]
        for w in works:
            w.wait()
        dist.destroy_process_group()
        return got.tolist(), twice[0].tolist(), twice[1].tolist()

    for opts in option_sets()[:6]:
        values = simdist.simulate(fn, 2, check_buffers=True, **opts).values
        for rank, (got, first, second) in enumerate(values):
            theirs = [float(i + 10 * (1 - rank)) for i in range(8)]
            assert got == theirs and first == theirs and second == theirs


# -- through torch.distributed (the torch bridge) -----------------------------------------------------------------


def torch_race(rank, world_size, op):
    tdist.init_process_group("gloo", rank=rank, world_size=world_size)
    t = torch.ones(2)
    if rank == (0 if op == "isend" else 1):
        req = tdist.isend(t, dst=1) if op == "isend" else tdist.irecv(t, src=0)  # torch's own call
        t.mul_(3)
        req.wait()
    elif op == "isend":
        tdist.recv(t, src=0)
    else:
        tdist.send(t, dst=1)
    tdist.destroy_process_group()


@pytest.mark.torch_release
@pytest.mark.parametrize("op, rank", [("isend", 0), ("irecv", 1)])
def test_torch_distributed_isend_and_irecv_through_the_bridge(op: str, rank: int) -> None:
    site = site_of(torch_race, "torch's own call")
    for seed in range(4):
        err = race_of(torch_race, 2, args=(2, op), seed=seed)
        assert (err.rank, err.op, err.call_site) == (rank, op, site)


# -- no false alarms ----------------------------------------------------------------------------------------------


def correct_uses(rank):
    """Writes after wait(), reads while in flight, collectives in place, a write once is_completed() said True."""
    dist.init_process_group("gloo")
    n = dist.get_world_size()
    t = torch.full((4,), float(rank))
    got = torch.zeros(4)
    peer = (rank + 1) % n
    s, r = dist.isend(t, peer), dist.irecv(got, (rank - 1) % n)
    total = t.sum().item() + got.sum().item()  # reading the buffers of operations in flight is fine
    other = torch.ones(2)
    dist.all_reduce(other)  # a collective on another buffer while the send is in flight
    s.wait()
    r.wait()
    t.add_(1)  # after wait(): the buffer is the rank's again
    dist.all_reduce(t)  # collectives write their buffers in place
    dist.broadcast(got, src=0)
    s2 = dist.isend(t, peer)
    again = torch.zeros(4)
    r2 = dist.irecv(again, (rank - 1) % n)
    dist.barrier()  # every rank has posted both: each send has met its receive
    assert s2.is_completed() and r2.is_completed()
    t.fill_(-1)  # is_completed() said True
    again.add_(1)
    return total, other.tolist(), got.tolist(), again.tolist()


def test_correct_programs_pass_under_many_schedules() -> None:
    n = 3
    expect_t = float(sum(range(1, n + 1)))  # rank + 1 summed over the ranks, after t.add_(1)
    for opts in option_sets():
        res = simdist.simulate(correct_uses, n, check_buffers=True, **opts)
        for rank, (total, other, got, again) in enumerate(res.values):
            assert total == 4.0 * rank  # read before the receive landed: still zeros
            assert other == [float(n)] * 2
            assert got == [float((0 - 1) % n)] * 4  # rank 0's received values, broadcast
            assert again == [expect_t + 1] * 4


def test_the_check_is_off_by_default_and_on_in_simdist_testing() -> None:
    simdist.simulate(isend_then_fill, 3, seed=1, leaks="ignore")  # unchecked: no error
    with pytest.raises(simdist.BufferRaceError):
        st.run(isend_then_fill, 3, seed=1)
    with pytest.raises(simdist.BufferRaceError):
        st.explore(isend_then_fill, 3, max_runs=3, progress=False)
    assert issubclass(simdist.BufferRaceError, simdist.DistError)


def test_check_buffers_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match=r"check_buffers='yes' must be a bool"):
        simdist.simulate(isend_then_fill, 3, check_buffers="yes")


# -- ranks as processes: the same checks, the same reports ------------------------------------------------------


def never_waited(rank):
    dist.init_process_group("gloo")
    t = torch.ones(3)
    if rank == 0:
        dist.isend(t, 1)  # never waited
        t.add_(1)
    else:
        dist.recv(t, 0)
    dist.destroy_process_group()


def strided_send(rank, kind):
    dist.init_process_group("gloo")
    base = np.zeros((3, 2), dtype=np.float64) if kind == "numpy" else torch.zeros(2, 3)
    t = base if kind == "numpy" else base.t()  # a transposed tensor: not contiguous
    if rank == 0:
        w = dist.isend(t, 1)
        t[1, 1] = 5
        w.wait()
    else:
        dist.recv(t, 0)
    dist.destroy_process_group()


def send_over_receive(rank):
    dist.init_process_group("gloo")
    buf = torch.zeros(6)
    receiving = dist.irecv(buf[2:4], 1 - rank)  # the receive in flight
    sending = dist.isend(buf[3:], 1 - rank)  # the send of memory it writes
    receiving.wait()
    sending.wait()
    dist.destroy_process_group()


def disjoint_views(rank):
    dist.init_process_group("gloo")
    peer = 1 - rank
    got = torch.zeros(8)
    mine = torch.arange(8.0) + 10 * rank
    works = [dist.irecv(got[0::2], peer), dist.irecv(got[1::2], peer)]  # interleaved views: no element in common
    works += [dist.isend(mine[0::2].contiguous(), peer), dist.isend(mine[1::2].contiguous(), peer)]
    works += [dist.isend(mine, peer), dist.isend(mine, peer)]  # two sends of one buffer only read it
    works += [dist.irecv(torch.zeros(8), peer), dist.irecv(torch.zeros(8), peer)]
    for w in works:
        w.wait()
    dist.destroy_process_group()
    return got.tolist()


RACES = [
    (isend_then_fill, 3, (), {"seed": 1}),
    (irecv_then_write, 2, (), {}),
    (receive_over_send, 2, (), {}),
    (send_over_receive, 2, (), {}),
    (never_waited, 2, (), {}),
    (strided_send, 2, ("numpy",), {}),
    (strided_send, 2, ("transposed",), {}),
    (batch_ring, 3, (1, "send"), {"seed": 2}),
    (batch_ring, 3, (1, "recv"), {"seed": 3}),
    (torch_race, 2, (2, "isend"), {}),
    (torch_race, 2, (2, "irecv"), {}),
]


@pytest.mark.parametrize("case", range(len(RACES)), ids=lambda i: f"{RACES[i][0].__name__}{RACES[i][2]}")
def test_a_race_is_reported_the_same_with_ranks_as_processes(case) -> None:
    fn, nprocs, args, opts = RACES[case]
    threads, processes = (
        race_of(fn, nprocs, args=args, leaks="ignore", isolation=mode, **opts) for mode in ("threads", "processes")
    )
    assert str(processes) == str(threads)
    assert (processes.rank, processes.op, processes.call_site, processes.changed) == (
        threads.rank, threads.op, threads.call_site, threads.changed)  # fmt: skip
    assert processes.choices == threads.choices


@pytest.mark.parametrize("fn,args", [(disjoint_views, ()), (batch_ring, (None, "send")), (correct_uses, ())])
def test_programs_without_a_race_give_the_same_values_with_ranks_as_processes(fn, args) -> None:
    for seed in range(3):
        threads, processes = (
            simdist.simulate(
                fn, 2 if fn is not batch_ring else 3, args=args, check_buffers=True, seed=seed, isolation=m
            )
            for m in ("threads", "processes")
        )
        assert processes.values == threads.values and processes.schedule == threads.schedule
