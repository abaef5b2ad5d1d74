"""Point-to-point: send/recv, isend/irecv, any-source receives, tags, FIFO order,
batch_isend_irecv, subgroups and the simulator's eager limit.

Tests parametrized by ``backend`` run the same program on the simulator and on real
socket processes (tests/support/every_backend.py); the eager limit and deadlock reports are the
simulator's own.
"""

from __future__ import annotations

import faulthandler
import warnings

import numpy as np
import pytest
import torch
from reference import ARRAY_TYPES, assert_same, build, junk, to_np, values

import simdist as dist
from every_backend import BACKENDS, run_body, seeds

SEEDS = range(12)
RUNS = [("sim", seed) for seed in SEEDS] + [("socket", 0)]  # (backend, seed): a seed chooses nothing on socket


def simulate(body, nprocs, backend="sim", **options):
    """Run ``body(rank)`` between init and destroy on ``nprocs`` ranks of ``backend``; return the values."""
    options.setdefault("leaks", "error")
    return run_body(body, nprocs, backend, **options)


def payload(kind: str, dtype: str, src: int, dst: int, shape=(2, 3)) -> np.ndarray:
    return values(np.random.default_rng([src, dst, len(dtype)]), dtype, shape)


# -- send / recv -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "dtype"), ARRAY_TYPES, ids=[f"{k}-{d}" for k, d in ARRAY_TYPES])
@pytest.mark.parametrize("backend", BACKENDS)
def test_send_recv_between_every_pair(kind: str, dtype: str, backend: str) -> None:
    """Every rank sends a different array to every other rank; blocking send and recv, no deadlock."""
    n = 4

    def body(rank):
        got = {}
        for step in range(1, n):  # step s: send to rank + s, receive from rank - s (lower rank sends first)
            dst, src = (rank + step) % n, (rank - step) % n
            out = junk(kind, dtype, (2, 3))
            x = build(kind, dtype, payload(kind, dtype, rank, dst))
            if rank < dst:
                dist.send(x, dst)
                who = dist.recv(out, src)
            else:
                who = dist.recv(out, src)
                dist.send(x, dst)
            assert who == src
            assert_same(x, payload(kind, dtype, rank, dst), "a sent tensor changed")
            got[src] = to_np(out)
        return got

    for seed in seeds(backend, (0, 1)):
        for rank, got in enumerate(simulate(body, n, backend, seed=seed)):
            assert sorted(got) == [r for r in range(n) if r != rank]
            for src, arr in got.items():
                assert_same(arr, payload(kind, dtype, src, rank), f"rank {rank} from {src}")


@pytest.mark.parametrize("layout", ["transposed", "strided"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_non_contiguous_send_and_recv_buffers(layout: str, backend: str) -> None:
    vals = np.arange(12.0).reshape(3, 4)

    def body(rank):
        if rank == 0:
            dist.send(build("torch", "float32", vals, layout), dst=1)
            dist.send(build("numpy", "int64", vals.astype(np.int64), layout), dst=1)
            return None
        a, b = junk("torch", "float32", (3, 4), layout), junk("numpy", "int64", (3, 4), layout)
        dist.recv(a, src=0)
        dist.recv(b, src=0)
        return to_np(a), to_np(b)

    a, b = simulate(body, 2, backend)[1]
    assert_same(a, vals, "torch")
    assert_same(b, vals.astype(np.int64), "numpy")


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_element_and_scalar_messages(backend: str) -> None:
    def body(rank):
        if rank == 0:
            dist.send(torch.zeros(0), dst=1)
            dist.send(torch.tensor(3.5), dst=1)
            return None
        e, s = torch.ones(0), torch.zeros(())
        return dist.recv(e, src=0), dist.recv(s, src=0), e.shape, s.item()

    assert simulate(body, 2, backend)[1] == (0, 0, torch.Size([0]), 3.5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_recv_returns_the_senders_global_rank(backend: str) -> None:
    def body(rank):
        if rank == 0:
            out = []
            for src in (2, 1):
                t = torch.zeros(1)
                out.append((dist.recv(t, src=src), t.item()))
            return out
        dist.send(torch.tensor([10.0 * rank]), dst=0)
        return None

    assert simulate(body, 3, backend)[0] == [(2, 20.0), (1, 10.0)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_recv_into_tensor_requiring_grad(backend: str) -> None:
    def body(rank):
        t = torch.zeros(2, requires_grad=True)
        if rank == 0:
            dist.send(torch.tensor([1.0, 2.0], requires_grad=True), dst=1)
            return None
        dist.recv(t, src=0)
        return t.detach().tolist(), t.requires_grad

    assert simulate(body, 2, backend)[1] == ([1.0, 2.0], True)


# -- isend / irecv ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("backend", "seed"), RUNS)
def test_isend_irecv_complete_on_wait(backend: str, seed: int) -> None:
    n = 3

    def body(rank):
        outs = [torch.zeros(2, dtype=torch.int32) for _ in range(n)]
        xs = [torch.tensor([rank, dst], dtype=torch.int32) for dst in range(n)]
        works = []
        for peer in range(n):
            if peer != rank:
                works.append(dist.irecv(outs[peer], src=peer))
                works.append(dist.isend(xs[peer], dst=peer))
        assert all(isinstance(w, dist.Work) for w in works)
        for w in works:
            assert w.wait() is True
            assert w.is_completed()
        assert all(x.tolist() == [rank, d] for d, x in enumerate(xs)), "isend changed its tensor"
        return [o.tolist() for o in outs]

    for rank, outs in enumerate(simulate(body, n, backend, seed=seed)):
        for peer in range(n):
            assert outs[peer] == ([peer, rank] if peer != rank else [0, 0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_irecv_is_not_complete_before_its_send(backend: str) -> None:
    def body(rank):
        if rank == 1:
            t = torch.zeros(1)
            w = dist.irecv(t, src=0)
            before = w.is_completed()
            dist.send(torch.ones(1), dst=0)  # rank 0 only sends after receiving this
            w.wait()
            return before, w.is_completed(), t.item()
        dist.recv(torch.zeros(1), src=1)
        dist.send(torch.tensor([5.0]), dst=1)
        return None

    for seed in seeds(backend, SEEDS):
        assert simulate(body, 2, backend, seed=seed)[1] == (False, True, 5.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_irecv_any_source_work_reports_the_sender(backend: str) -> None:
    def body(rank):
        if rank == 0:
            t = torch.zeros(1)
            w = dist.irecv(t)
            w.wait()
            return w.source_rank(), t.item()
        if rank == 2:
            dist.send(torch.tensor([2.0]), dst=0)
        return None

    assert simulate(body, 3, backend)[0] == (2, 2.0)


# -- any source ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_recv_any_source_returns_each_sender_once_and_order_is_a_scheduler_choice(backend: str) -> None:
    n = 4

    def body(rank):
        if rank == 0:
            got = []
            for _ in range(n - 1):
                t = torch.zeros(1, dtype=torch.int64)
                src = dist.recv(t)
                got.append((src, t.item()))
            return got
        dist.send(torch.tensor([100 + rank]), dst=0)
        return None

    orders = set()
    for seed in seeds(backend, range(20)):
        got = simulate(body, n, backend, seed=seed)[0]
        assert sorted(got) == [(r, 100 + r) for r in range(1, n)]
        orders.add(tuple(src for src, _ in got))
    if backend == "sim":
        assert len(orders) > 1, "any-source matching never varied across 20 seeds"


@pytest.mark.parametrize("backend", BACKENDS)
def test_any_source_on_a_subgroup_returns_global_ranks(backend: str) -> None:
    def body(rank):
        g = dist.new_group([0, 2, 3])
        if rank == 0:
            got = []
            for _ in range(2):
                t = torch.zeros(1)
                got.append((dist.recv(t, group=g), t.item()))
            return sorted(got)
        if rank in (2, 3):
            dist.send(torch.tensor([float(rank)]), dst=0, group=g)
        return None

    assert simulate(body, 4, backend)[0] == [(2, 2.0), (3, 3.0)]


# -- tags and order -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("backend", "seed"), RUNS)
def test_tags_keep_messages_apart(backend: str, seed: int) -> None:
    def body(rank):
        if rank == 0:
            works = [dist.isend(torch.tensor([float(tag)]), dst=1, tag=tag) for tag in (1, 2, 3)]
            for w in works:
                w.wait()
            return None
        out = {}
        for tag in (3, 1, 2):  # the reverse of the send order
            t = torch.zeros(1)
            assert dist.recv(t, src=0, tag=tag) == 0
            out[tag] = t.item()
        t = torch.zeros(1)
        return out

    assert simulate(body, 2, backend, seed=seed)[1] == {1: 1.0, 2: 2.0, 3: 3.0}


def test_tag_mismatch_deadlocks() -> None:
    def body(rank):
        if rank == 0:
            dist.send(torch.zeros(1), dst=1, tag=1)
        else:
            dist.recv(torch.zeros(1), src=0, tag=2)

    with pytest.raises(dist.DeadlockError) as info:
        simulate(body, 2)
    assert "tag=1" in str(info.value) and "tag=2" in str(info.value)


@pytest.mark.parametrize(("backend", "seed"), RUNS)
def test_fifo_between_a_pair_on_one_tag(backend: str, seed: int) -> None:
    k = 6

    def body(rank):
        if rank == 0:
            works = [dist.isend(torch.tensor([i]), dst=1) for i in range(k)]
            for w in reversed(works):
                w.wait()
            return None
        if rank == 1:
            outs = [torch.full((1,), -1) for _ in range(k)]
            works = [dist.irecv(o, src=0) for o in outs[:3]]
            for o in outs[3:]:
                dist.recv(o, src=0)
            for w in works:
                w.wait()
            return [o.item() for o in outs]
        return None

    assert simulate(body, 3, backend, seed=seed)[1] == list(range(k))


@pytest.mark.parametrize("backend", BACKENDS)
def test_fifo_with_any_source_from_one_sender(backend: str) -> None:
    def body(rank):
        if rank == 0:
            for i in range(4):
                dist.isend(torch.tensor([i]), dst=1).wait()
            return None
        outs = []
        for _ in range(4):
            t = torch.zeros(1, dtype=torch.int64)
            dist.recv(t)
            outs.append(t.item())
        return outs

    assert simulate(body, 2, backend, eager_limit=1024)[1] == [0, 1, 2, 3]


# -- batch_isend_irecv ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 5, 8])
@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_isend_irecv_ring_exchange(n: int, backend: str) -> None:
    def body(rank):
        right, left = (rank + 1) % n, (rank - 1) % n
        from_left, from_right = torch.zeros(2), torch.zeros(2)
        ops = [
            dist.P2POp(dist.isend, torch.tensor([rank, 0.0]), right),
            dist.P2POp(dist.irecv, from_left, left),
            dist.P2POp(dist.isend, torch.tensor([rank, 1.0]), left, tag=1),
            dist.P2POp(dist.irecv, from_right, right, tag=1),
        ]
        works = dist.batch_isend_irecv(ops)
        assert len(works) == 4
        for w in works:
            w.wait()
        return from_left.tolist(), from_right.tolist()

    for seed in seeds(backend, (0, 1, 2)):
        for rank, (fl, fr) in enumerate(simulate(body, n, backend, seed=seed)):
            assert fl == [(rank - 1) % n, 0.0]
            assert fr == [(rank + 1) % n, 1.0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_isend_irecv_on_a_subgroup_with_group_peer(backend: str) -> None:
    def body(rank):
        g = dist.new_group([1, 2, 4])
        if g is dist.GroupMember.NON_GROUP_MEMBER:
            return None
        me, n = dist.get_rank(g), 3
        out = torch.zeros(1)
        ops = [
            dist.P2POp(dist.isend, torch.tensor([float(rank)]), group=g, group_peer=(me + 1) % n),
            dist.P2POp(dist.irecv, out, group=g, group_peer=(me - 1) % n),
        ]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        return out.item()

    assert simulate(body, 5, backend) == [None, 4.0, 1.0, None, 2.0]


# -- subgroups -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_p2p_on_a_subgroup_uses_global_ranks(backend: str) -> None:
    def body(rank):
        g = dist.new_group([4, 1, 3])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if rank in (0, 2):  # outside the group: no-ops
                assert dist.send(torch.zeros(1), dst=1, group=g) is None
                assert dist.recv(torch.zeros(1), src=1, group=g) == -1
                assert dist.isend(torch.zeros(1), dst=1, group=g) is None
                return None
        if rank == 1:
            dist.send(torch.tensor([1.0]), dst=4, group=g)  # global rank 4
            dist.send(torch.tensor([2.0]), group=g, group_dst=1)  # group rank 1 = global 3
            return None
        t = torch.zeros(1)
        src = dist.recv(t, src=1, group=g) if rank == 4 else dist.recv(t, group=g, group_src=0)
        return src, t.item()

    assert simulate(body, 5, backend) == [None, None, None, (1, 2.0), (1, 1.0)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_subgroup_traffic_is_separate_from_world_traffic(backend: str) -> None:
    """Same pair, same tag: one message on the world, one on a subgroup; each receive gets its own."""

    def body(rank):
        g = dist.new_group([0, 1])
        if rank == 0:
            w1 = dist.isend(torch.tensor([1.0]), dst=1)
            w2 = dist.isend(torch.tensor([2.0]), dst=1, group=g)
            w1.wait()
            w2.wait()
            return None
        a, b = torch.zeros(1), torch.zeros(1)
        dist.recv(b, src=0, group=g)
        dist.recv(a, src=0)
        return a.item(), b.item()

    assert simulate(body, 2, backend)[1] == (1.0, 2.0)


# -- the eager limit -------------------------------------------------------------------------------------------------


def _head_to_head(rank):
    out = torch.zeros(4)  # 16 bytes
    dist.send(torch.full((4,), float(rank)), dst=1 - rank)
    dist.recv(out, src=1 - rank)
    return out.tolist()


@pytest.mark.parametrize("eager_limit", [0, 15])
def test_head_to_head_sends_deadlock_below_the_eager_limit(eager_limit: int) -> None:
    with pytest.raises(dist.DeadlockError) as info:
        simulate(_head_to_head, 2, eager_limit=eager_limit, leaks="ignore")
    err = info.value
    text = str(err)
    assert "rank 0 is blocked in send(dst=1" in text and "rank 1 is blocked in send(dst=0" in text
    assert "test_api_p2p.py" in text  # the user's call site
    assert sorted(err.cycle) == [0, 1]
    assert set(err.graph.edges) >= {(0, 1), (1, 0)}
    assert err.schedule and err.schedule in text
    assert isinstance(err, dist.DistError)


@pytest.mark.parametrize("eager_limit", [16, 1 << 20])
def test_head_to_head_sends_complete_within_the_eager_limit(eager_limit: int) -> None:
    assert simulate(_head_to_head, 2, eager_limit=eager_limit) == [[1.0] * 4, [0.0] * 4]


@pytest.mark.parametrize("backend", BACKENDS)
def test_eager_send_buffers_its_data(backend: str) -> None:
    """A buffered send may return at once; changing the tensor afterwards does not change the message."""

    def body(rank):
        if rank == 0:
            t = torch.tensor([1.0])
            dist.send(t, dst=1)
            t.fill_(99.0)
            dist.send(torch.zeros(1), dst=1)  # a second message, so rank 1 receives after the change
            return None
        a, b = torch.zeros(1), torch.zeros(1)
        dist.recv(a, src=0)
        dist.recv(b, src=0)
        return a.item()

    for seed in seeds(backend, SEEDS):
        assert simulate(body, 2, backend, eager_limit=64, seed=seed)[1] == 1.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_message_size_mismatch_is_an_error(backend: str) -> None:
    def body(rank):
        if backend == "gloo":  # gloo aborts the receiving process (forked): no stack dump in the test log
            faulthandler.disable()
        if rank == 0:
            dist.send(torch.zeros(3), dst=1)
        else:
            dist.recv(torch.zeros(2), src=0)

    # torch's gloo ends the receiving process on a size mismatch (its own "Received data size
    # doesn't match expected size"): the run still fails, as a rank that died or lost its peer.
    match = None if backend == "gloo" else "size mismatch"
    with pytest.raises(dist.DistError, match=match):
        simulate(body, 2, backend, leaks="ignore")


@pytest.mark.parametrize("backend", BACKENDS)
def test_rank_outside_group_warning_points_at_the_caller(backend: str) -> None:
    def body(rank):
        g = dist.new_group([0])
        if rank == 1:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                dist.send(torch.zeros(1), dst=0, group=g)
                dist.all_reduce(torch.zeros(1), group=g)
            return [w.filename for w in caught]
        return None

    files = simulate(body, 2, backend)[1]
    assert len(files) == 2 and all(f.endswith("test_api_p2p.py") for f in files), files
