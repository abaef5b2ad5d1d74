"""Unmodified torch.distributed code on simulated ranks (simdist/torch_bridge/ranks.py).

The seed lesson's programs run with ``import torch.distributed as dist`` exactly as written
(their ``setup`` sets MASTER_ADDR/MASTER_PORT and calls ``init_process_group("gloo", ...)``);
torch's own DistributedDataParallel trains on simulated ranks and matches simdist's; a deadlock
and a mismatch in torch.distributed code are reported with the user's lines; nothing of the
bridge remains once a simulation ends.
"""

from __future__ import annotations

import os
import re

import pytest
import torch
import torch.distributed as dist
from torch import nn

import simdist

pytestmark = [pytest.mark.timeout(120), pytest.mark.torch_release]


# -- the seed lesson's programs, as written there ---------------------------------------------------------


def setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    # Initialize the process group
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def run_broadcast(rank, world_size):
    setup(rank, world_size)
    tensor = torch.zeros(1)
    if rank == 0:
        # Source process creates the data
        tensor += 1
    # Rank 0 broadcasts 'tensor' to all other processes
    dist.broadcast(tensor=tensor, src=0)
    print(f"Rank {rank} has data: {tensor[0]}")
    dist.destroy_process_group()


def run_all_reduce(rank, world_size):
    setup(rank, world_size)
    # Each rank creates data based on its rank
    tensor = torch.tensor([rank + 1], dtype=torch.float32)
    print(f"Rank {rank} initial tensor: {tensor[0]}")
    # Perform all-reduce with SUM operation
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    # Result (sum of 1+2+3+4 = 10) is available on all ranks
    print(f"Rank {rank} final tensor: {tensor[0]}")
    dist.destroy_process_group()


def run_scatter(rank, world_size):
    setup(rank, world_size)
    my_tensor = torch.zeros(1)
    scatter_list = None
    if rank == 0:
        # Source rank prepares the list of tensors to scatter
        scatter_list = [torch.tensor([i + 1.0]) for i in range(world_size)]
        print(f"Rank 0 scatter list: {[t.item() for t in scatter_list]}")
    # Rank 0 scatters the list. Each rank receives one tensor into my_tensor.
    dist.scatter(tensor=my_tensor, scatter_list=scatter_list, src=0)
    print(f"Rank {rank} received tensor: {my_tensor.item()}")
    dist.destroy_process_group()


def run_gather(rank, world_size):
    setup(rank, world_size)
    # Each rank creates its own tensor
    my_tensor = torch.tensor([rank + 1.0])
    gather_list = None
    if rank == 0:
        # Destination rank prepares a list to store gathered tensors
        gather_list = [torch.zeros(1) for _ in range(world_size)]
    # All ranks send their tensor to rank 0
    dist.gather(tensor=my_tensor, gather_list=gather_list, dst=0)
    if rank == 0:
        print(f"Rank 0 gathered list: {[t.item() for t in gather_list]}")
    else:
        print(f"Rank {rank} sent tensor: {my_tensor.item()}")
    dist.destroy_process_group()


def run_async_all_reduce(rank, world_size):
    setup(rank, world_size)
    tensor = torch.ones(1) * rank
    # Initiate non-blocking all-reduce
    work_handle = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, async_op=True)
    # Wait for the all_reduce operation to complete
    work_handle.wait()
    # Now 'tensor' contains the reduced result
    print(f"Rank {rank} async all_reduce result: {tensor[0]}")
    dist.destroy_process_group()


def run_p2p(rank, world_size):
    setup(rank, world_size)
    tensor = torch.zeros(1)
    if rank == 0:
        tensor += 1
        dist.send(tensor=tensor, dst=1)
    elif rank == 1:
        dist.recv(tensor=tensor, src=0)
    print(f"Rank {rank} has data {tensor[0]}")
    dist.destroy_process_group()


# the API reference's example (seed 003), as written there: NCCL, tcp:// and a tensor moved to GPU `rank`


def setup_nccl(rank, world_size):
    """Initialize the distributed environment."""
    dist.init_process_group(backend="nccl", init_method="tcp://127.0.0.1:29500", world_size=world_size, rank=rank)


def cleanup():
    dist.destroy_process_group()


def demo_basic(rank, world_size):
    setup_nccl(rank, world_size)

    # Create a tensor
    tensor = torch.ones(2, 2).to(rank)

    # All-reduce operation
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    print(f"Rank {rank}: {tensor}")

    cleanup()


def test_the_api_references_nccl_example_runs_unchanged(capsys):
    simdist.spawn(demo_basic, args=(2,), nprocs=2, backend="sim")
    out = capsys.readouterr().out
    for rank in range(2):
        assert f"Rank {rank}: tensor([[2., 2.],\n        [2., 2.]])" in out, out


SEEDS = [  # (program, the lines rank r prints)
    (run_broadcast, lambda r: [f"Rank {r} has data: 1.0"]),
    (run_all_reduce, lambda r: [f"Rank {r} initial tensor: {r + 1}.0", f"Rank {r} final tensor: 10.0"]),
    (
        run_scatter,
        lambda r: (
            [f"Rank {r} received tensor: {r + 1}.0"] + (["Rank 0 scatter list: [1.0, 2.0, 3.0, 4.0]"] if r == 0 else [])
        ),
    ),
    (
        run_gather,
        lambda r: ["Rank 0 gathered list: [1.0, 2.0, 3.0, 4.0]"] if r == 0 else [f"Rank {r} sent tensor: {r + 1}.0"],
    ),
    (run_async_all_reduce, lambda r: [f"Rank {r} async all_reduce result: 6.0"]),
]


@pytest.mark.parametrize(("program", "lines"), SEEDS, ids=[p.__name__ for p, _ in SEEDS])
def test_seed_programs_run_unchanged_on_simulated_ranks(program, lines, capsys):
    simdist.spawn(program, args=(4,), nprocs=4, backend="sim")
    out = capsys.readouterr().out.splitlines()
    for r in range(4):
        for line in lines(r):
            assert line in out, (line, out)


def test_point_to_point_in_torch_code(capsys):
    simdist.spawn(run_p2p, args=(2,), nprocs=2, backend="sim")
    out = capsys.readouterr().out
    assert "Rank 0 has data 1.0" in out and "Rank 1 has data 1.0" in out


# -- torch's DistributedDataParallel on simulated ranks ------------------------------------------------


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def _data(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(5, 6, generator=g), torch.randn(5, 3, generator=g)


def train_torch_ddp(rank, steps):
    dist.init_process_group("nccl")  # any backend name: the simulator's ranks
    model = nn.parallel.DistributedDataParallel(_model(), bucket_cap_mb=1e-4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _data(rank)
    history = []
    for _ in range(steps):
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        history.append([p.detach().clone() for p in model.parameters()])
    dist.destroy_process_group()
    return history


def train_simdist_ddp(rank, steps):
    simdist.init_process_group("gloo")
    model = simdist.DistributedDataParallel(_model(), bucket_cap_mb=1e-4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _data(rank)
    history = []
    for _ in range(steps):
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        history.append([p.detach().clone() for p in model.parameters()])
    simdist.destroy_process_group()
    return history


def test_torch_ddp_on_simulated_ranks_matches_simdist_ddp_step_by_step():
    theirs = simdist.simulate(train_torch_ddp, 3, args=(3,)).values
    ours = simdist.simulate(train_simdist_ddp, 3, args=(3,)).values
    for rank in range(3):
        for step in range(3):
            for a, b in zip(theirs[rank][step], ours[rank][step]):
                assert torch.allclose(a, b, atol=1e-6), (rank, step)
    assert all(torch.equal(a, b) for a, b in zip(theirs[0][-1], theirs[2][-1]))  # replicas stay equal


def test_torch_ddp_runs_are_replayable():
    a = simdist.simulate(train_torch_ddp, 2, args=(2,), seed=5)
    b = simdist.simulate(train_torch_ddp, 2, args=(2,), schedule=a.schedule)
    assert a.trace.to_json() == b.trace.to_json()


# -- checks with the user's lines ---------------------------------------------------------------------------


def head_to_head(rank):
    dist.init_process_group("gloo")
    t = torch.zeros(2)
    dist.send(t, dst=1 - rank)
    dist.recv(t, src=1 - rank)


def test_a_deadlock_in_torch_code_names_the_users_lines():
    with pytest.raises(simdist.DeadlockError) as info:
        simdist.simulate(head_to_head, 2, leaks="ignore")
    text = str(info.value)
    assert re.search(r"rank 0 is blocked in send\(dst=1.*test_torch_bridge\.py:\d+", text), text
    assert "torch/distributed" not in text


def mismatched(rank):
    dist.init_process_group("gloo")
    t = torch.zeros(3)
    if rank == 0:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=0)


def test_a_mismatch_in_torch_code_names_both_lines():
    with pytest.raises(simdist.CollectiveMismatchError) as info:
        simdist.simulate(mismatched, 2, leaks="ignore")
    text = str(info.value)
    assert "all_reduce" in text and "broadcast" in text and text.count("test_torch_bridge.py:") >= 2


# -- nothing remains outside a simulation -----------------------------------------------------------------------


def test_torch_distributed_is_untouched_outside_a_simulation():
    from torch.distributed import distributed_c10d as c10d

    init, world = dist.init_process_group, c10d._world
    simdist.simulate(run_all_reduce, 2, args=(2,))
    assert dist.init_process_group is init and c10d._world is world
    assert not dist.is_initialized()


TORCHRUN_SCRIPT = """
import os
import torch
import torch.distributed as dist

dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 1))
model(torch.ones(2, 3) * (rank + 1)).sum().backward()
t = torch.tensor([float(rank)])
dist.all_reduce(t)
print(f"rank {rank} of {dist.get_world_size()} local {os.environ['LOCAL_RANK']}: "
      f"sum {t.item()} grad {model.module.weight.grad[0, 0].item()}")
dist.destroy_process_group()
"""


def test_simdist_run_runs_a_torchrun_script_unchanged_on_the_simulator(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_SCRIPT)
    proc = subprocess.run(
        [sys.executable, "-m", "simdist.run", "--backend", "sim", "--nproc-per-node", "3", str(script)],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    for r in range(3):  # the sum of ranks, and the gradient averaged over ranks: (2 + 4 + 6) / 3
        assert f"rank {r} of 3 local {r}: sum 3.0 grad 4.0" in proc.stdout, proc.stdout


def any_source(rank):
    dist.init_process_group("gloo")
    if rank == 0:
        got = []
        for _ in range(2):
            t = torch.zeros(1)
            got.append((dist.recv(t), t.item()))  # src=None: torch asks the work who sent
        result = sorted(got)
    else:
        dist.send(torch.tensor([10.0 * rank]), dst=0)
        result = None
    dist.destroy_process_group()
    return result


def test_recv_from_any_source_reports_the_sender():
    for seed in range(4):
        assert simdist.simulate(any_source, 3, seed=seed).values[0] == [(1, 10.0), (2, 20.0)]


class _TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body, self.used, self.unused = nn.Linear(4, 4), nn.Linear(4, 1), nn.Linear(4, 1)

    def forward(self, x):
        return self.used(self.body(x))


def torch_ddp_features(rank):
    """torch's own DDP on a simulated rank: no_sync, find_unused_parameters, static_graph, a comm hook."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.utils.data import DistributedSampler

    dist.init_process_group("gloo")
    x = torch.ones(2, 4) * (rank + 1)
    out = {"sampler": list(DistributedSampler(range(10), shuffle=False))}
    model = nn.parallel.DistributedDataParallel(_TwoHeads(), find_unused_parameters=True)
    with model.no_sync():
        model(x).sum().backward()
    out["local"] = model.module.used.weight.grad.clone()
    model.module.zero_grad()
    model(x).sum().backward()
    out["synced"] = model.module.used.weight.grad.clone()
    out["unused"] = model.module.unused.weight.grad
    hooked = nn.parallel.DistributedDataParallel(nn.Linear(4, 1), static_graph=True)
    hooked.register_comm_hook(None, default_hooks.allreduce_hook)
    for _ in range(2):
        hooked.module.zero_grad()
        hooked(x).sum().backward()
    out["hooked"] = hooked.module.weight.grad.clone()
    dist.destroy_process_group()
    return out


def test_torch_ddp_features_on_simulated_ranks():
    values = simdist.simulate(torch_ddp_features, 2).values
    assert [v["sampler"] for v in values] == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]
    assert not torch.equal(values[0]["local"], values[1]["local"])  # no_sync: no communication
    assert torch.allclose(values[0]["synced"], (values[0]["local"] + values[1]["local"]) / 2)
    assert torch.equal(values[0]["synced"], values[1]["synced"])
    assert values[0]["unused"] is None and values[1]["unused"] is None
    assert torch.allclose(values[0]["hooked"], torch.full((1, 4), 3.0)) and torch.equal(*[v["hooked"] for v in values])


def functional(rank):
    import torch.distributed._functional_collectives as fc

    dist.init_process_group("gloo")
    summed = fc.all_reduce(torch.ones(2) * rank, "sum", dist.group.WORLD)
    if hasattr(fc, "all_gather_single"):  # torch 2.13 and newer
        gathered = fc.all_gather_single(torch.tensor([float(rank)]), 0, dist.group.WORLD)
    else:
        gathered = fc.all_gather_tensor(torch.tensor([float(rank)]), 0, dist.group.WORLD)
    result = (summed.tolist(), gathered.tolist())
    dist.destroy_process_group()
    return result


def test_functional_collectives_reach_the_simulator():
    assert simdist.simulate(functional, 3).values == [([3.0, 3.0], [0.0, 1.0, 2.0])] * 3
