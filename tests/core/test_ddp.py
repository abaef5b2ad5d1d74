"""simdist.DistributedDataParallel: torch's constructor and behaviour, on the simulator and on socket.

Equivalence: N ranks training on shards reach the parameters of one process training on
the whole batch. Also buckets (as torch assigns them), no_sync, unused parameters, join,
comm hooks, buffers, the model check, and the overlap of bucket all-reduces with backward
in the simulator's trace. Parity with torch's own DDP on gloo: tests/torch/test_ddp_torch_parity.py.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from every_backend import BACKENDS, run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import simdist
import simdist as dist
from simdist._ddp import FIRST_BUCKET_BYTES, bucket_assignment
from simdist.ddp_comm_hooks import allreduce_hook, bf16_compress_hook, fp16_compress_hook

pytestmark = pytest.mark.timeout(120)
BATCH = 840  # divisible by every world size from 1 to 8


def mlp(widths: tuple, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


def data(widths: tuple, seed: int, n: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + 1)
    return torch.randn(n, widths[0], generator=g), torch.randn(n, widths[-1], generator=g)


def train_alone(widths: tuple, seed: int, steps: int) -> list[torch.Tensor]:
    """Parameters after ``steps`` of SGD on the whole batch in one process."""
    model = mlp(widths, seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = data(widths, seed)
    for _ in range(steps):
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def train_ddp(rank: int, world: int, widths: tuple, seed: int, steps: int, ddp_kwargs: dict) -> list[torch.Tensor]:
    """Parameters after ``steps`` of SGD under DDP, rank ``rank`` on its contiguous shard of the batch."""
    dist.init_process_group("gloo")
    torch.manual_seed(1000 + rank)  # a different initialization on each rank: DDP must broadcast rank 0's
    model = mlp(widths, seed if rank == 0 else seed + 1 + rank)
    ddp = dist.DistributedDataParallel(model, **ddp_kwargs)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    x, y = data(widths, seed)
    n = BATCH // world
    for _ in range(steps):
        nn.functional.mse_loss(ddp(x[rank * n : (rank + 1) * n]), y[rank * n : (rank + 1) * n]).backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()
    return [p.detach().clone() for p in model.parameters()]


def assert_close(got: list, want: list, what: str) -> None:
    assert len(got) == len(want), what
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), f"{what}: parameter {i} differs by {(a - b).abs().max()}"


# -- torch's interface ---------------------------------------------------------------------------------


def test_constructor_takes_torchs_parameters_in_torchs_order():
    ours = list(inspect.signature(dist.DistributedDataParallel.__init__).parameters)
    theirs = list(inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__).parameters)
    assert ours == theirs


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(
        st.tuples(st.integers(1, 3000), st.sampled_from([torch.float32, torch.float64, torch.float16])),
        min_size=1,
        max_size=12,
    ),
    limits=st.lists(st.integers(1, 20_000), min_size=1, max_size=3),
)
def test_bucket_assignment_is_torchs(sizes, limits):
    params = [torch.zeros(n, dtype=d) for n, d in sizes]
    theirs, _ = torch.distributed._compute_bucket_assignment_by_size(params, limits, [False] * len(params))
    assert bucket_assignment(params, limits) == [list(b) for b in theirs]


def _bucket_names(rank, kwargs):
    dist.init_process_group("gloo")
    model = nn.Sequential(nn.Linear(512, 512), nn.Linear(512, 512), nn.Linear(512, 8))  # ~1 MiB per weight
    ddp = dist.DistributedDataParallel(model, **kwargs)
    names = {p: n for n, p in model.named_parameters()}
    out = [[names[p] for p in b.params] for b in ddp._buckets]
    dist.destroy_process_group()
    return out


def test_buckets_follow_reverse_registration_order_with_a_small_first_bucket():
    (buckets,) = dist.simulate(_bucket_names, 1, args=({},)).values
    assert FIRST_BUCKET_BYTES == 1 << 20
    # reverse order; the first bucket closes once it holds 1 MiB, the rest go into 25 MiB buckets
    assert buckets == [["2.bias", "2.weight", "1.bias", "1.weight"], ["0.bias", "0.weight"]]
    (capped,) = dist.simulate(_bucket_names, 1, args=({"bucket_cap_mb": 0.5},)).values
    assert capped == [["2.bias", "2.weight", "1.bias", "1.weight"], ["0.bias", "0.weight"]]
    (tiny,) = dist.simulate(_bucket_names, 1, args=({"bucket_cap_mb": 1e-6},)).values
    assert tiny == [[n] for n in ["2.bias", "2.weight", "1.bias", "1.weight", "0.bias", "0.weight"]]


def _state_dict_keys(rank):
    dist.init_process_group("gloo")
    keys = list(dist.DistributedDataParallel(nn.Linear(2, 2)).state_dict())
    dist.destroy_process_group()
    return keys


def test_state_dict_keys_are_prefixed_with_module():
    assert dist.simulate(_state_dict_keys, 2).values == [["module.weight", "module.bias"]] * 2


# -- equivalence with one process ------------------------------------------------------------------------


@pytest.mark.timeout(300)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    world=st.integers(1, 8),
    widths=st.lists(st.integers(1, 9), min_size=2, max_size=4).map(tuple),
    bucket_cap_mb=st.sampled_from([None, 1e-5, 1e-4, 1e-3]),
    view=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_training_on_shards_equals_training_on_the_whole_batch(world, widths, bucket_cap_mb, view, seed):
    kwargs = {"bucket_cap_mb": bucket_cap_mb, "gradient_as_bucket_view": view}
    want = train_alone(widths, seed, steps=3)
    for rank, got in enumerate(dist.simulate(train_ddp, world, args=(world, widths, seed, 3, kwargs)).values):
        assert_close(got, want, f"world {world} rank {rank}")


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("view", [False, True])
def test_training_on_socket_processes_equals_training_on_the_whole_batch(world, view):
    widths, seed = (5, 7, 3), 4
    kwargs = {"bucket_cap_mb": 1e-4, "gradient_as_bucket_view": view}
    want = train_alone(widths, seed, steps=3)
    for rank, got in enumerate(run(train_ddp, world, "socket", args=(world, widths, seed, 3, kwargs))):
        assert_close(got, want, f"socket rank {rank}")


def _no_sync(rank, world, backend_view):
    dist.init_process_group("gloo")
    widths, seed = (4, 6, 2), 3
    model = mlp(widths, seed)
    ddp = dist.DistributedDataParallel(model, bucket_cap_mb=1e-4, gradient_as_bucket_view=backend_view)
    x, y = data(widths, seed)
    n = BATCH // world
    xs, ys = x[rank * n : (rank + 1) * n], y[rank * n : (rank + 1) * n]
    half = n // 2
    with ddp.no_sync():  # first micro-batch: local accumulation only
        local = None
        nn.functional.mse_loss(ddp(xs[:half]), ys[:half], reduction="sum").backward()
        local = [p.grad.clone() for p in model.parameters()]
    nn.functional.mse_loss(ddp(xs[half:]), ys[half:], reduction="sum").backward()
    grads = [p.grad.clone() for p in model.parameters()]
    dist.destroy_process_group()
    return local, grads


@pytest.mark.parametrize("view", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
def test_no_sync_accumulates_locally_then_averages_like_one_big_batch(backend, view):
    world = 2
    results = run(_no_sync, world, backend, args=(world, view))
    model = mlp((4, 6, 2), 3)
    x, y = data((4, 6, 2), 3)
    nn.functional.mse_loss(model(x), y, reduction="sum").backward()
    want = [p.grad / world for p in model.parameters()]  # the sum over all rows, averaged over the ranks
    local0, local1 = results[0][0], results[1][0]
    assert not all(torch.allclose(a, b) for a, b in zip(local0, local1)), "no_sync communicated"
    for rank, (_, grads) in enumerate(results):
        assert_close(grads, want, f"rank {rank}")


# -- overlap in the trace ------------------------------------------------------------------------------------


def test_trace_shows_a_bucket_all_reduce_starting_before_backward_ends():
    kwargs = {"bucket_cap_mb": 1e-4}
    res = dist.simulate(train_ddp, 2, args=(2, (8, 16, 16, 4), 0, 1, kwargs))
    for rank in range(2):
        backward = [e for e in res.trace if e.rank == rank and e.kind == "compute" and e.op == "backward"]
        buckets = [
            e
            for e in res.trace
            if e.rank == rank and e.kind == "collective" and e.op == "all_reduce" and e.t_start >= backward[0].t_start
        ]
        assert backward and len(buckets) >= 2
        end = max(e.t_end for e in backward)
        assert min(e.t_start for e in buckets) < end, "no bucket all-reduce started before the backward pass ended"


# -- unused parameters ---------------------------------------------------------------------------------------


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body, self.used, self.unused = nn.Linear(3, 4), nn.Linear(4, 2), nn.Linear(4, 2)

    def forward(self, x):
        return self.used(self.body(x))


def _unused(rank, find_unused):
    dist.init_process_group("gloo")
    model = TwoHeads()
    ddp = dist.DistributedDataParallel(model, bucket_cap_mb=1e-5, find_unused_parameters=find_unused)
    x = torch.full((2, 3), float(rank + 1))
    out = []
    for _ in range(2):
        ddp(x).sum().backward()
        out.append((model.unused.weight.grad, model.used.weight.grad.clone()))
    dist.destroy_process_group()
    return out


def test_unused_parameters_without_find_unused_raise_torchs_error_at_the_next_forward():
    with pytest.raises(dist.RankError) as info:
        dist.simulate(_unused, 2, args=(False,))
    text = str(info.value)
    assert "Expected to have finished reduction in the prior iteration" in text
    assert "find_unused_parameters=True" in text and "unused.weight" in text


@pytest.mark.parametrize("backend", BACKENDS)
def test_find_unused_parameters_marks_them_ready_and_leaves_their_grad_alone(backend):
    for rank_steps in run(_unused, 2, backend, args=(True,)):
        for unused_grad, used_grad in rank_steps:
            assert unused_grad is None
    a, b = run(_unused, 2, backend, args=(True,))
    assert torch.equal(a[0][1], b[0][1])  # the used head's gradient is averaged


# -- join: uneven inputs -----------------------------------------------------------------------------------------


def _uneven(rank, world, by_initial):
    dist.init_process_group("gloo")
    widths, seed = (3, 5, 2), 11
    model = mlp(widths, seed)
    ddp = dist.DistributedDataParallel(model, bucket_cap_mb=1e-4)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    x, y = data(widths, seed)
    with ddp.join(divide_by_initial_world_size=by_initial):
        for i in range(rank + 1):  # rank r has r + 1 batches
            nn.functional.mse_loss(ddp(x[4 * i : 4 * i + 4]), y[4 * i : 4 * i + 4]).backward()
            opt.step()
            opt.zero_grad()
    dist.destroy_process_group()
    return [p.detach().clone() for p in model.parameters()]


def _uneven_reference(world, by_initial):
    """Step i averages the gradients of the ranks that still have a batch (over the world or over them)."""
    widths, seed = (3, 5, 2), 11
    model = mlp(widths, seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = data(widths, seed)
    for i in range(world):
        active = [r for r in range(world) if i <= r]
        total = [torch.zeros_like(p) for p in model.parameters()]
        for _ in active:
            nn.functional.mse_loss(model(x[4 * i : 4 * i + 4]), y[4 * i : 4 * i + 4]).backward()
            for t, p in zip(total, model.parameters()):
                t += p.grad
                p.grad = None
        for t, p in zip(total, model.parameters()):
            p.grad = t / (world if by_initial else len(active))
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("by_initial", [True, False])
@pytest.mark.parametrize("backend", BACKENDS)
def test_join_trains_on_uneven_inputs_without_hanging(backend, by_initial):
    world = 3
    want = _uneven_reference(world, by_initial)
    for rank, got in enumerate(run(_uneven, world, backend, args=(world, by_initial))):
        assert_close(got, want, f"rank {rank}")


def _uneven_without_join(rank):
    dist.init_process_group("gloo")
    ddp = dist.DistributedDataParallel(nn.Linear(2, 1))
    for _ in range(rank + 1):
        ddp(torch.ones(1, 2)).sum().backward()
    dist.destroy_process_group()


def test_uneven_inputs_without_join_are_a_deadlock_report_not_a_hang():
    with pytest.raises(dist.DeadlockError) as info:
        dist.simulate(_uneven_without_join, 2)
    line = (
        inspect.getsource(_uneven_without_join).splitlines().index("        ddp(torch.ones(1, 2)).sum().backward()")
        + _uneven_without_join.__code__.co_firstlineno
    )
    assert f"test_ddp.py:{line}" in str(info.value), "the report must name the user's backward() line"
    assert "torch/autograd" not in str(info.value)


# -- comm hooks ----------------------------------------------------------------------------------------------------


def _hooked(rank, world, hook_name):
    dist.init_process_group("gloo")
    widths, seed = (4, 8, 3), 5
    model = mlp(widths, seed)
    ddp = dist.DistributedDataParallel(model, bucket_cap_mb=1e-4)
    hooks = {"allreduce": allreduce_hook, "fp16": fp16_compress_hook, "bf16": bf16_compress_hook}
    if hook_name is not None:
        ddp.register_comm_hook(None, hooks[hook_name])
        with pytest.raises(RuntimeError, match="only be called once"):
            ddp.register_comm_hook(None, hooks[hook_name])
    x, y = data(widths, seed)
    n = BATCH // world
    nn.functional.mse_loss(ddp(x[rank * n : (rank + 1) * n]), y[rank * n : (rank + 1) * n]).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    dist.destroy_process_group()
    return grads


@pytest.mark.parametrize(("hook", "tol"), [("allreduce", 0.0), ("fp16", 1e-2), ("bf16", 5e-2)])
@pytest.mark.parametrize("backend", BACKENDS)
def test_builtin_comm_hooks_average_the_gradients(backend, hook, tol):
    world = 2
    plain = run(_hooked, world, "sim", args=(world, None))
    for rank, grads in enumerate(run(_hooked, world, backend, args=(world, hook))):
        for a, b in zip(grads, plain[rank]):
            assert torch.allclose(a, b, atol=tol + 1e-7, rtol=tol), (hook, rank, (a - b).abs().max())


def _custom_hook(rank):
    dist.init_process_group("gloo")
    seen = []

    def hook(state, bucket):
        seen.append((bucket.index(), bucket.is_last(), len(bucket.gradients()), state))
        fut = dist.Future()
        fut.set_result(bucket.buffer().zero_())  # a hook decides everything: here, zero gradients
        return fut

    model = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
    ddp = dist.DistributedDataParallel(model, bucket_cap_mb=1e-5)
    ddp.register_comm_hook("my state", hook)
    ddp(torch.ones(1, 2)).sum().backward()
    zero = all(bool((p.grad == 0).all()) for p in model.parameters())
    dist.destroy_process_group()
    return seen, zero


def test_a_custom_hook_gets_each_bucket_in_order_and_its_result_becomes_the_gradient():
    seen, zero = dist.simulate(_custom_hook, 2).values[0]
    # 10-byte buckets, reverse order: [1.bias (4 B), 1.weight (12 B)], [0.bias (12 B)], [0.weight (24 B)]
    assert [s[:3] for s in seen] == [(0, False, 2), (1, False, 1), (2, True, 1)]
    assert all(s[3] == "my state" for s in seen) and zero


# -- construction: model check, state sync, buffers, bad arguments ---------------------------------------------


def _mismatched(rank):
    dist.init_process_group("gloo")
    dist.DistributedDataParallel(nn.Linear(2, 3 if rank == 1 else 4))


def test_a_model_that_differs_between_ranks_is_a_clear_error_not_a_hang():
    with pytest.raises(dist.RankError) as info:
        dist.simulate(_mismatched, 2)
    assert isinstance(info.value.__cause__, ValueError)
    assert "'weight'" in str(info.value) and "(3, 2)" in str(info.value) and "(4, 2)" in str(info.value)


class WithBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(1, 1)
        self.register_buffer("offset", torch.zeros(1))

    def forward(self, x):
        return self.lin(x) + self.offset


def _buffers(rank, broadcast_buffers):
    dist.init_process_group("gloo")
    model = WithBuffer()
    ddp = dist.DistributedDataParallel(model, broadcast_buffers=broadcast_buffers)
    model.offset.fill_(10.0 * (rank + 1))  # each rank changes its buffer after construction
    with torch.no_grad():
        ddp(torch.zeros(1, 1))
    dist.destroy_process_group()
    return model.offset.item()


@pytest.mark.parametrize("backend", BACKENDS)
def test_buffers_are_broadcast_from_rank_0_before_each_forward(backend):
    assert run(_buffers, 3, backend, args=(True,)) == [10.0, 10.0, 10.0]
    assert run(_buffers, 3, backend, args=(False,)) == [10.0, 20.0, 30.0]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"bucket_cap_mb": 0}, ValueError, r"bucket_cap_mb=0"),
        ({"bucket_cap_mb": "25"}, ValueError, r"bucket_cap_mb='25'"),
        ({"device_ids": [0]}, ValueError, r"device_ids=\[0\].*cpu"),
        ({"mixed_precision": object()}, NotImplementedError, r"mixed_precision"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, error, match):
    def fn(rank):
        dist.init_process_group("gloo")
        dist.DistributedDataParallel(nn.Linear(1, 1), **kwargs)

    with pytest.raises(dist.RankError) as info:
        dist.simulate(fn, 1, cuda_as_cpu=False)  # with simulated GPUs, device_ids=[0] names the CPU module's GPU
    assert isinstance(info.value.__cause__, error)
    assert __import__("re").search(match, str(info.value.__cause__))

    def not_a_module(rank):
        dist.init_process_group("gloo")
        dist.DistributedDataParallel(lambda x: x)

    with pytest.raises(dist.RankError, match="module must be a torch.nn.Module"):
        dist.simulate(not_a_module, 1)


def test_public_names():
    assert simdist.DistributedDataParallel is dist.DistributedDataParallel
    assert callable(simdist.GradBucket.buffer) and callable(simdist.Future.then)
