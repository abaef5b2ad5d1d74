"""FSDP2, DTensor, tensor parallelism, functional collectives and pipelining on simulated ranks, against gloo.

Each program below is torch's own API used as its tutorials use it (``fully_shard``, DDP's
``join()`` with uneven inputs,
``init_device_mesh`` in 1-D and 2-D, ``distribute_tensor``, ``parallelize_module`` with
``ColwiseParallel``/``RowwiseParallel``, ``torch.distributed._functional_collectives``,
``torch.distributed.pipelining`` with GPipe and 1F1B). It runs twice: on torch's gloo backend
in real processes (one job per world size runs every program, since starting processes that
import torch takes seconds), and on simulated ranks through simdist's torch bridge, with
every check on. Losses, gradients and tensors must agree.
"""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
from torch import nn

import simdist

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.torch_release,
    pytest.mark.filterwarnings("ignore::FutureWarning"),  # torch's own deprecations, on gloo as well
    pytest.mark.filterwarnings("ignore:FSDP2-wrapped module"),
]

ATOL, RTOL = 1e-5, 1e-4
STEPS = 3


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))


def _batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10 + rank)
    return torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)


def _train(model: nn.Module, rank: int, same_data: bool = False) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _batch(0 if same_data else rank)
    losses = []
    for _ in range(STEPS):
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _full(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter as a whole tensor (DTensors gathered: a collective every rank calls)."""
    return {
        n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for n, p in model.named_parameters()
    }


# -- the programs: fn(rank, world) -> results, with the default group initialized -------------------------


def fsdp2(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    model = _mlp()
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    losses = _train(model, rank)
    return {"losses": losses, **_full(model)}


def dtensor(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(1)
    a, b = torch.randn(8, 4), torch.randn(4, 8)
    rows = distribute_tensor(a, mesh, [Shard(0)])
    cols = distribute_tensor(b, mesh, [Shard(1)])
    out = {
        "rows_local": rows.to_local().clone(),
        "product": (rows @ cols.redistribute(mesh, [Replicate()])).full_tensor(),
        "row_sums": rows.sum(dim=1).full_tensor(),
        "total": rows.sum().full_tensor(),
        "replicated": cols.redistribute(mesh, [Replicate()]).to_local().clone(),
    }
    if world == 4:
        grid = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        tiles = distribute_tensor(a, grid, [Shard(0), Shard(1)])
        out["tile"] = tiles.to_local().clone()
        out["tiles_total"] = tiles.sum().full_tensor()
        out["tp_rows"] = tiles.redistribute(grid, [Shard(0), Replicate()]).to_local().clone()
        out["tp_group"] = dist.get_process_group_ranks(grid["tp"].get_group())
    return out


def tensor_parallel(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world,))
    model = parallelize_module(_mlp(), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    losses = _train(model, rank, same_data=True)  # tensor parallelism: every rank sees the same batch
    return {"losses": losses, **_full(model)}


def fsdp_tp_2d(rank: int, world: int) -> dict:
    """FSDP2 over "dp" and tensor parallelism over "tp" of a 2-D mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    grid = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
    model = parallelize_module(_mlp(), grid["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=grid["dp"])
    losses = _train(model, grid["dp"].get_local_rank())
    return {"losses": losses, **_full(model)}


def functional(rank: int, world: int) -> dict:
    import torch.distributed._functional_collectives as fc

    group = dist.group.WORLD
    x = torch.arange(2.0 * world) + 100 * rank
    out = {
        "all_reduce": fc.all_reduce(x, "sum", group),
        "all_gather": fc.all_gather_tensor(x, 0, group),
        "reduce_scatter": fc.reduce_scatter_tensor(x, "sum", 0, group),
        "all_to_all": fc.all_to_all_single(x, None, None, group),
        "broadcast": fc.broadcast(x, 1, group),
        "waited": fc.wait_tensor(fc.all_reduce(x * 2, "max", group)),
    }
    return {k: v.clone() for k, v in out.items()}  # an op on the async result waits and gives a plain tensor


def _pipeline(rank: int, world: int, schedule_class: type) -> dict:
    from torch.distributed.pipelining import PipelineStage

    torch.manual_seed(0)
    stages = [nn.Linear(8, 8) for _ in range(world)]
    stage = PipelineStage(stages[rank], rank, world, torch.device("cpu"))
    schedule = schedule_class(stage, n_microbatches=4, loss_fn=nn.functional.mse_loss)
    x, y = _batch(0)
    x, y = x.repeat(2, 1), y.repeat(2, 1)
    losses: list = []
    if rank == 0:
        schedule.step(x)
    elif rank == world - 1:
        schedule.step(target=y, losses=losses)
    else:
        schedule.step()
    return {
        "losses": [loss.item() for loss in losses],
        **{f"grad.{n}": p.grad.clone() for n, p in stages[rank].named_parameters()},
    }


def ddp_join(rank: int, world: int) -> dict:
    """torch's DDP with uneven inputs: rank r trains 2 + r steps inside ``join()``, for both divide rules."""
    out = {}
    for initial in (True, False):
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(nn.Linear(8, 2))
        x, _ = _batch(rank)
        with model.join(divide_by_initial_world_size=initial):
            for _ in range(2 + rank):
                model(x).sum().backward()
        out[f"grad.divide_by_initial_{initial}"] = model.module.weight.grad.clone()
    return out


def pipeline_gpipe(rank: int, world: int) -> dict:
    from torch.distributed.pipelining import ScheduleGPipe

    return _pipeline(rank, world, ScheduleGPipe)


def pipeline_1f1b(rank: int, world: int) -> dict:
    from torch.distributed.pipelining import Schedule1F1B

    return _pipeline(rank, world, Schedule1F1B)


PROGRAMS = {
    f.__name__: f
    for f in (fsdp2, dtensor, tensor_parallel, fsdp_tp_2d, functional, ddp_join, pipeline_gpipe, pipeline_1f1b)
}
CASES = [(name, world) for name in PROGRAMS for world in (2, 4) if not (name == "fsdp_tp_2d" and world == 2)]


def run_all(rank: int, world: int) -> dict:
    return {name: PROGRAMS[name](rank, world) for name, w in CASES if w == world}


# -- the two ways to run them ----------------------------------------------------------------------------------


def gloo_rank(rank: int, world: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        results = run_all(rank, world)
    finally:
        dist.destroy_process_group()
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))


def simulated_rank(rank: int, name: str, world: int) -> dict:
    dist.init_process_group("gloo")
    try:
        return PROGRAMS[name](rank, world)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def gloo_results(tmp_path_factory) -> dict:
    """{world: [rank] -> {program: results}} from torch's gloo backend in real processes."""
    import torch.multiprocessing as tmp

    results = {}
    for world in (2, 4):
        out = tmp_path_factory.mktemp(f"gloo{world}")
        tmp.start_processes(gloo_rank, args=(world, _free_port(), str(out)), nprocs=world, start_method="forkserver")
        results[world] = [torch.load(out / f"rank{r}.pt") for r in range(world)]
    return results


def _same(a, b, where: str) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert a.shape == b.shape and a.dtype == b.dtype, where
        assert torch.allclose(a, b, atol=ATOL, rtol=RTOL), f"{where} differs by {(a - b).abs().max().item():.3g}"
    elif isinstance(a, float):
        assert a == pytest.approx(b, abs=ATOL, rel=RTOL), where
    else:
        assert a == b, where


@pytest.mark.parametrize(("name", "world"), CASES, ids=[f"{n}-world{w}" for n, w in CASES])
def test_same_results_as_gloo(gloo_results, name, world):
    reference = [gloo_results[world][r][name] for r in range(world)]
    # torch's join() starts all-reduces it never waits for (as it may on gloo): those are not leaks here
    res = simdist.simulate(
        simulated_rank, world, args=(name, world), timeout=120, leaks="ignore" if name == "ddp_join" else "error"
    )
    _same(res.values, reference, f"{name} at world {world}")
    assert any(e.kind == "message" for e in res.trace.events)  # the data went through the simulator


def test_training_programs_train():
    """The comparison above is not between programs that do nothing: losses fall, ranks agree."""
    for name in ("fsdp2", "tensor_parallel"):
        values = simdist.simulate(simulated_rank, 2, args=(name, 2)).values
        assert values[0]["losses"][-1] < values[0]["losses"][0], name
        _same(
            {k: v for k, v in values[0].items() if k != "losses"},
            {k: v for k, v in values[1].items() if k != "losses"},
            f"{name}: parameters agree across ranks",
        )
