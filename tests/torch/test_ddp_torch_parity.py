"""simdist.DistributedDataParallel against torch's own DistributedDataParallel, step by step.

The same seeded model (an MLP with a BatchNorm1d, so there are buffers to broadcast), the
same data shards (rank r trains on rows r::2 of one seeded batch), SGD, three steps,
world 2, run four ways:

1. torch.nn.parallel.DistributedDataParallel on torch's gloo backend, two real processes
   (``torch.multiprocessing.start_processes``, forkserver); each rank saves its states
   with ``torch.save`` since torch's launcher returns no values;
2. simdist.DistributedDataParallel on the simulator (``simdist.simulate``);
3. simdist.DistributedDataParallel on the socket backend (``simdist.spawn(backend="socket")``);
4. torch's own DistributedDataParallel, unchanged, on the simulator (simdist's torch.distributed bridge).

After every step the parameters (and buffers) must agree across the four and across ranks.
Parametrized over ``gradient_as_bucket_view`` and a tiny ``bucket_cap_mb`` (several
buckets) against the default.
"""

from __future__ import annotations

import os
import socket

import pytest
import torch
from torch import nn

import simdist
import simdist as dist

WORLD = 2
STEPS = 3
BATCH = 16
ATOL, RTOL = 1e-6, 1e-5
pytestmark = pytest.mark.torch_release

SMALL_CAP_MB = 0.0002  # 209 bytes: this model's parameters fall into several buckets

CONFIGS = [
    pytest.param(False, None, id="copy-default_cap"),
    pytest.param(True, None, id="view-default_cap"),
    pytest.param(False, SMALL_CAP_MB, id="copy-small_cap"),
    pytest.param(True, SMALL_CAP_MB, id="view-small_cap"),
]
CONFIG_VALUES = [tuple(c.values) for c in CONFIGS]


# --- the shared training program ------------------------------------------------------------


def make_model() -> nn.Module:
    torch.manual_seed(1234)
    return nn.Sequential(
        nn.Linear(8, 32),
        nn.BatchNorm1d(32),
        nn.ReLU(),
        nn.Linear(32, 32),
        nn.ReLU(),
        nn.Linear(32, 4),
    )


def make_shard(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(99)
    x = torch.randn(BATCH, 8, generator=g)
    y = torch.randn(BATCH, 4, generator=g)
    return x[rank::WORLD].contiguous(), y[rank::WORLD].contiguous()


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def train(ddp_class, rank: int, view: bool, cap_mb: float | None) -> list[dict[str, torch.Tensor]]:
    """Three SGD steps under ``ddp_class``; the module's state after construction and after each step."""
    model = make_model()
    if rank == 1:  # construction must broadcast rank 0's parameters and buffers
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    kwargs = {"gradient_as_bucket_view": view}
    if cap_mb is not None:
        kwargs["bucket_cap_mb"] = cap_mb
    ddp = ddp_class(model, **kwargs)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    x, y = make_shard(rank)
    states = [snapshot(model)]
    for _ in range(STEPS):
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        states.append(snapshot(model))
    return states


# --- the three runs ------------------------------------------------------------------------
# Starting two processes that import torch takes seconds, so each real-process run trains
# every configuration in turn (a fresh model and DDP wrapper each) and the runs are shared
# by the parametrized cases (module-scoped fixtures); the simulator runs per case.


def train_all(ddp_class, rank: int) -> dict:
    return {(view, cap_mb): train(ddp_class, rank, view, cap_mb) for view, cap_mb in CONFIG_VALUES}


def simdist_rank(rank: int, view: bool, cap_mb: float | None):
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        return train(simdist.DistributedDataParallel, rank, view, cap_mb)
    finally:
        dist.destroy_process_group()


def simdist_rank_all(rank: int) -> dict:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        return train_all(simdist.DistributedDataParallel, rank)
    finally:
        dist.destroy_process_group()


def torch_ddp_on_simulated_rank(rank: int, view: bool, cap_mb: float | None):
    """torch's own DDP, unchanged, on a simulated rank (simdist's torch.distributed bridge)."""
    import torch.distributed as tdist

    tdist.init_process_group("gloo")
    try:
        return train(torch.nn.parallel.DistributedDataParallel, rank, view, cap_mb)
    finally:
        tdist.destroy_process_group()


def torch_rank_all(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as tdist

    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        runs = train_all(torch.nn.parallel.DistributedDataParallel, rank)
    finally:
        tdist.destroy_process_group()
    torch.save(runs, os.path.join(out_dir, f"rank{rank}.pt"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def per_config(per_rank: list) -> dict:
    """[rank] -> {config: states} as {config: [rank] -> states}."""
    return {cfg: [per_rank[r][cfg] for r in range(WORLD)] for cfg in CONFIG_VALUES}


@pytest.fixture(scope="module")
def torch_runs(tmp_path_factory) -> dict:
    """torch DDP on gloo, two forkserver processes, every configuration."""
    import torch.multiprocessing as tmp

    out = tmp_path_factory.mktemp("torch_ddp")
    tmp.start_processes(torch_rank_all, args=(_free_port(), str(out)), nprocs=WORLD, start_method="forkserver")
    return per_config([torch.load(out / f"rank{r}.pt") for r in range(WORLD)])


@pytest.fixture(scope="module")
def socket_runs() -> dict:
    """simdist DDP on the socket backend, two processes, every configuration."""
    return per_config(simdist.spawn(simdist_rank_all, nprocs=WORLD, backend="socket"))


# --- comparison ------------------------------------------------------------------------------


def assert_same(a: list, b: list, what: str) -> None:
    """Two runs' per-rank, per-step states agree within tolerance."""
    assert len(a) == len(b) == WORLD, what
    for rank in range(WORLD):
        assert len(a[rank]) == len(b[rank]) == STEPS + 1, what
        for step, (sa, sb) in enumerate(zip(a[rank], b[rank])):
            assert sa.keys() == sb.keys(), what
            for name in sa:
                ta, tb = sa[name], sb[name]
                assert ta.dtype == tb.dtype and ta.shape == tb.shape, f"{what}: rank {rank} step {step} {name}"
                if ta.is_floating_point():
                    ok = torch.allclose(ta, tb, atol=ATOL, rtol=RTOL)
                else:
                    ok = torch.equal(ta, tb)
                assert ok, (
                    f"{what}: rank {rank} after step {step}, {name} differs by "
                    f"{(ta.double() - tb.double()).abs().max().item():.3g}"
                )


def assert_ranks_agree(run: list, what: str) -> None:
    """Parameters are the same on every rank after every step (buffers are rank-local in train mode)."""
    params = {n for n, _ in make_model().named_parameters()}
    for step in range(STEPS + 1):
        for name in params:
            for rank in range(1, WORLD):
                assert torch.allclose(run[0][step][name], run[rank][step][name], atol=ATOL, rtol=RTOL), (
                    f"{what}: {name} differs between rank 0 and rank {rank} after step {step}"
                )


@pytest.mark.timeout(180)
@pytest.mark.parametrize("view, cap_mb", CONFIGS)
def test_parity_with_torch_ddp(torch_runs, socket_runs, view, cap_mb):
    ref = torch_runs[(view, cap_mb)]
    sim = simdist.simulate(simdist_rank, WORLD, args=(view, cap_mb), leaks="ignore").values
    sock = socket_runs[(view, cap_mb)]

    assert_ranks_agree(ref, "torch DDP on gloo")
    # the model moved: a test that compares three unchanged models proves nothing
    assert not torch.allclose(ref[0][0]["0.weight"], ref[0][-1]["0.weight"])
    assert_same(sim, ref, "simdist DDP on the simulator vs torch DDP on gloo")
    assert_same(sock, ref, "simdist DDP on the socket backend vs torch DDP on gloo")
    bridged = simdist.simulate(torch_ddp_on_simulated_rank, WORLD, args=(view, cap_mb), leaks="ignore").values
    assert_same(bridged, ref, "torch DDP on the simulator vs torch DDP on gloo")
    assert_ranks_agree(sim, "simdist DDP on the simulator")
    assert_ranks_agree(sock, "simdist DDP on the socket backend")


@pytest.mark.timeout(180)
def test_small_cap_makes_several_buckets():
    """The small-cap cases really exercise several buckets (and the default one bucket) on simdist's side."""

    def rank_fn(rank):
        dist.init_process_group("gloo")
        try:
            small = simdist.DistributedDataParallel(make_model(), bucket_cap_mb=SMALL_CAP_MB)
            default = simdist.DistributedDataParallel(make_model())
            return len(small._buckets), len(default._buckets)
        finally:
            dist.destroy_process_group()

    values = simdist.simulate(rank_fn, WORLD, leaks="ignore").values
    for small, default in values:
        assert small >= 3
        assert default == 1
