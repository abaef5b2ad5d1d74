"""GPU scripts unchanged on simulated ranks backed by the CPU (simdist/torch_bridge/cuda.py, docs/gpu-scripts.md).

Each rank sees a node of simulated GPUs: torch.cuda and torch.accelerator answer for them, tensors
moved to them stay on the CPU, torch's DDP takes their ids, torch.load maps checkpoints onto them.
The numbers are checked against an independent truth: the same training written for the CPU, on
real gloo processes. The facade belongs to rank threads only and is gone when the run ends.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import simdist
from simdist import torch_bridge

pytestmark = [
    pytest.mark.torch_release,
    pytest.mark.timeout(120),
    pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is unavailable"),
]
ON_CPU = {"cuda_as_cpu": True}  # the same behaviour on machines with a GPU


class TwoLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.act = nn.Tanh()
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(16, 6, generator=g), torch.randn(16, 3, generator=g)


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


# -- a rank's node of GPUs --------------------------------------------------------------------------------------


def test_each_rank_sees_its_node_of_gpus():
    def program(rank):
        before = torch.cuda.current_device()
        torch.cuda.set_device(rank)
        acc = torch.accelerator.current_accelerator()
        return (
            torch.cuda.is_available(),
            torch.cuda.device_count(),
            before,
            torch.cuda.current_device(),
            torch.accelerator.is_available(),
            acc.type,
            torch.accelerator.device_count(),
            torch.accelerator.current_device_index(),
            dist.get_default_backend_for_device(acc),
        )

    assert simdist.simulate(program, 3, **ON_CPU).values == [
        (True, 3, 0, r, True, "cuda", 3, r, "nccl") for r in range(3)
    ]

    def two_per_node(rank):
        torch.accelerator.set_device_index(rank % 2)
        with torch.cuda.device(1 - rank % 2):
            inside = torch.cuda.current_device()
        return torch.cuda.device_count(), inside, torch.cuda.current_device()

    assert simdist.simulate(two_per_node, 4, gpus_per_node=2, **ON_CPU).values == [
        (2, 1, 0),
        (2, 0, 1),
        (2, 1, 0),
        (2, 0, 1),
    ]


def test_gpu_devices_become_the_cpu():
    def program(rank):
        torch.cuda.set_device(rank)
        model = TwoLayer().to(rank)
        also = nn.Linear(2, 2).cuda()
        tensors = [
            torch.ones(2).to(rank),
            torch.ones(2).to(f"cuda:{rank}"),
            torch.ones(2).cuda(),
            torch.ones(2).to(torch.device("cuda", rank), torch.float64),
            torch.zeros(2, device="cuda"),
            torch.randn(2, device=rank),
            torch.ones(2).new_zeros(3, device="cuda:0"),
            torch.ones(2).pin_memory(),
            torch.ones(2).type("torch.cuda.DoubleTensor"),
        ]
        with torch.device("cuda"):
            tensors.append(torch.empty(1))
        torch.set_default_device(f"cuda:{rank}")
        tensors.append(torch.zeros(1))
        torch.set_default_device(None)
        devices = {t.device.type for t in [*tensors, *model.parameters(), *also.parameters()]}
        return devices, tensors[3].dtype, tensors[-3].dtype, tensors[0].is_cuda, tensors[0].get_device()

    assert simdist.simulate(program, 2, **ON_CPU).values == [({"cpu"}, torch.float64, torch.float64, False, -1)] * 2


def test_a_gpu_the_node_lacks_is_a_clear_error():
    def program(rank, what):
        if what == "set_device":
            torch.cuda.set_device(2)
        elif what == "to":
            torch.ones(1).to(5)
        elif what == "device=":
            torch.zeros(1, device="cuda:7")
        elif what == "device_ids":
            DDP(TwoLayer().to(0), device_ids=[3])

    for what, call, value in [
        ("set_device", "torch.cuda.set_device", "2"),
        ("to", "Tensor.to", "5"),
        ("device=", "zeros", "'cuda:7'"),
        ("device_ids", "device_ids", "3"),
    ]:
        with pytest.raises(simdist.RankError) as info:
            simdist.simulate(program, 1, args=(what,), gpus_per_node=2, **ON_CPU)
        message = str(info.value.__cause__)
        assert isinstance(info.value.__cause__, ValueError), what
        assert message.startswith("simdist: ") and call in message and f"got {value}" in message, message
        assert "2 GPU(s), cuda:0 .. cuda:1" in message and "--nproc-per-node" in message, message
    for bad in (0, -1, True, "2", 1.5):
        with pytest.raises(ValueError, match=rf"gpus_per_node={re.escape(repr(bad))} must be a positive int"):
            simdist.simulate(program, 1, args=("none",), gpus_per_node=bad)


def test_unmapped_calls_name_simdist_and_the_call():
    def program(rank, call):
        call()

    calls = {
        "torch.cuda.memory_summary": lambda: torch.cuda.memory_summary(),
        "torch.cuda.CUDAGraph": lambda: torch.cuda.CUDAGraph(),
        "torch.cuda.make_graphed_callables": lambda: torch.cuda.make_graphed_callables(
            nn.Linear(2, 2), (torch.ones(2),)
        ),
        "torch.cuda.FloatTensor": lambda: torch.cuda.FloatTensor(2),
        "torch.accelerator.get_device_capability": lambda: torch.accelerator.get_device_capability(),
    }
    for name, call in calls.items():
        with pytest.raises(simdist.RankError) as info:
            simdist.simulate(program, 1, args=(call,), **ON_CPU)
        cause = info.value.__cause__
        assert isinstance(cause, NotImplementedError), name
        assert str(cause).startswith(f"simdist: {name} is not simulated on CPU ranks"), str(cause)
        assert "docs/gpu-scripts.md" in str(cause)


def test_the_docs_table_lists_every_mapped_name():
    text = (Path(__file__).resolve().parents[2] / "docs" / "gpu-scripts.md").read_text()
    tables = (("torch.cuda", torch_bridge.cuda.CUDA), ("torch.accelerator", torch_bridge.cuda.ACCELERATOR),
              ("torch.cuda.nvtx", torch_bridge.cuda.NVTX))  # fmt: skip
    for module, table in tables:
        for name in table:
            assert f"`{module}.{name}" in text, f"{module}.{name} is mapped but not in docs/gpu-scripts.md"


# -- streams and events: virtual time -----------------------------------------------------------------------


def test_events_time_a_collective_in_virtual_time():
    def program(rank):
        dist.init_process_group("nccl")
        torch.cuda.set_device(rank)
        side = torch.cuda.Stream()
        start, end, idle = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        t = torch.ones(1 << 18, device="cuda")
        start.record()
        with torch.cuda.stream(side):
            assert torch.cuda.current_stream() is side and side.device == torch.device("cuda", rank)
            dist.all_reduce(t)
            done = side.record_event()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.current_stream().wait_event(done)
        t.record_stream(torch.cuda.current_stream())
        end.record()
        idle.record()
        end.synchronize()
        torch.cuda.synchronize()
        default = torch.cuda.current_stream() is torch.cuda.default_stream()
        dist.destroy_process_group()
        return start.elapsed_time(end), end.elapsed_time(idle), done.query(), default, t[0].item()

    first = simdist.simulate(program, 2, **ON_CPU).values
    again = simdist.simulate(program, 2, **ON_CPU).values
    assert first == again  # virtual time: the same in every run
    for elapsed, nothing, done, default, total in first:
        assert elapsed > 0 and nothing == 0.0 and done and default and total == 2.0

    def misuse(rank, how):
        a, b = torch.cuda.Event(enable_timing=how != "timing"), torch.cuda.Event(enable_timing=True)
        a.record()
        if how != "record":
            b.record()
        a.elapsed_time(b)

    for how, text in (("timing", "enable_timing=True"), ("record", "recorded first")):
        with pytest.raises(simdist.RankError, match=re.escape(text)):
            simdist.simulate(misuse, 1, args=(how,), **ON_CPU)


# -- DDP, checkpoints, object collectives, data -----------------------------------------------------------------


def test_torch_load_maps_gpu_checkpoints_onto_the_cpu(tmp_path):
    path = str(tmp_path / "ckpt.pt")

    def program(rank):
        dist.init_process_group("nccl")
        torch.cuda.set_device(rank)
        if rank == 0:
            torch.save({"w": torch.arange(4.0).cuda()}, path)
        dist.barrier()
        forms = [
            f"cuda:{rank}",
            torch.device("cuda", rank),
            {"cuda:0": f"cuda:{rank}"},
            None,
            lambda storage, location: storage.cuda(rank),
            lambda storage, location: storage,
        ]
        loaded = [torch.load(path, map_location=form)["w"] for form in forms]
        try:
            torch.load(path, map_location="cuda:7")
        except ValueError as exc:
            refused = str(exc)
        dist.destroy_process_group()
        return [(t.device.type, t.tolist()) for t in loaded], refused

    for loaded, refused in simdist.simulate(program, 2, **ON_CPU).values:
        assert loaded == [("cpu", [0.0, 1.0, 2.0, 3.0])] * 6
        assert refused.startswith("simdist: torch.load") and "'cuda:7'" in refused
    assert torch.load(path)["w"].device.type == "cpu"  # it was saved from the CPU


def test_torch_ddp_takes_simulated_device_ids():
    def program(rank, ids, output):
        dist.init_process_group("nccl")
        model = DDP(TwoLayer().to(rank), device_ids=ids(rank), output_device=output(rank))
        model(torch.ones(2, 6).cuda()).sum().backward()
        dist.destroy_process_group()
        return model.device_ids, model.module.fc1.weight.grad.device.type

    same = simdist.simulate(program, 2, args=(lambda r: [r], lambda r: r), **ON_CPU).values
    as_devices = simdist.simulate(
        program, 2, args=(lambda r: [torch.device("cuda", r)], lambda r: f"cuda:{r}"), **ON_CPU
    ).values
    assert same == as_devices == [(None, "cpu")] * 2
    with pytest.raises(simdist.RankError, match="device_ids can only be None or contain a single element"):
        simdist.simulate(program, 2, args=(lambda r: [0, 1], lambda r: None), **ON_CPU)


def test_object_collectives_after_init_nccl():
    def program(rank):
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl")
        gathered = [None] * 3
        dist.all_gather_object(gathered, {"rank": rank})
        objects = [f"from {rank}"]
        dist.broadcast_object_list(objects, src=2)
        on_gpu = [rank]
        dist.broadcast_object_list(on_gpu, src=1, device=torch.device("cuda", torch.cuda.current_device()))
        dist.barrier(device_ids=[rank])
        dist.destroy_process_group()
        return gathered, objects, on_gpu

    assert (
        simdist.simulate(program, 3, **ON_CPU).values
        == [([{"rank": 0}, {"rank": 1}, {"rank": 2}], ["from 2"], [1])] * 3
    )


@pytest.mark.timeout(180)
def test_dataloader_pins_memory_on_simulated_gpus():
    def program(rank, workers):
        data = torch.utils.data.TensorDataset(torch.arange(8.0))
        loader = torch.utils.data.DataLoader(data, batch_size=4, pin_memory=True, num_workers=workers)
        return [b.to(rank, non_blocking=True).tolist() for (b,) in loader]

    for workers in (0, 1):
        assert (
            simdist.simulate(program, 2, args=(workers,), **ON_CPU).values
            == [[[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]] * 2
        )


# -- the numbers: a GPU-style script against an independent truth ---------------------------------------------

STEPS = 4


def gpu_style(rank, world_size):
    """The training as a GPU script writes it: set_device, .to(rank), DDP with device ids, nccl."""
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    torch.manual_seed(7)
    model = TwoLayer().to(rank)
    ddp = DDP(model, device_ids=[rank], output_device=rank)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    x, y = batch(rank)
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = F.mse_loss(ddp(x.cuda(non_blocking=True)), y.to(f"cuda:{rank}"))
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize()
    result = state(ddp.module)
    dist.destroy_process_group()
    return result


def cpu_style(rank, ddp_class):
    """The same training written for the CPU (torch's DDP on gloo in real processes, or simdist's DDP)."""
    dist.init_process_group("gloo") if ddp_class is DDP else simdist.init_process_group("gloo")
    torch.manual_seed(7)
    ddp = ddp_class(TwoLayer())
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    x, y = batch(rank)
    for _ in range(STEPS):
        optimizer.zero_grad()
        F.mse_loss(ddp(x), y).backward()
        optimizer.step()
    result = state(ddp.module)
    dist.destroy_process_group() if ddp_class is DDP else simdist.destroy_process_group()
    return result


def simdist_ddp_gpu_style(rank):
    """simdist's own DDP in the GPU style: device_ids of simulated GPUs."""
    simdist.init_process_group("nccl")
    torch.cuda.set_device(rank)
    torch.manual_seed(7)
    ddp = simdist.DistributedDataParallel(TwoLayer().cuda(), device_ids=[rank], output_device=rank)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    x, y = batch(rank)
    for _ in range(STEPS):
        optimizer.zero_grad()
        F.mse_loss(ddp(x.to(rank)), y.to(rank)).backward()
        optimizer.step()
    result = state(ddp.module)
    simdist.destroy_process_group()
    return result


@pytest.mark.timeout(240)
def test_gpu_script_on_simulated_ranks_equals_cpu_training_on_gloo_processes():
    truth = simdist.spawn(cpu_style, args=(DDP,), nprocs=2, backend="gloo")
    simulated = simdist.spawn(gpu_style, args=(2,), nprocs=2, backend="sim", **ON_CPU)
    own = simdist.spawn(simdist_ddp_gpu_style, nprocs=2, backend="sim", **ON_CPU)
    torch.manual_seed(7)
    assert not torch.allclose(TwoLayer().fc1.weight, truth[0]["fc1.weight"])  # training moved the weights
    for rank in range(2):
        for name, value in truth[rank].items():
            assert torch.allclose(simulated[rank][name], value, atol=1e-6), (rank, name)
            assert torch.allclose(own[rank][name], value, atol=1e-6), (rank, name)
            assert torch.equal(truth[rank][name], truth[0][name])  # the ranks agree


# -- per thread, and undone --------------------------------------------------------------------------------------


def test_simulated_gpus_belong_to_rank_threads_and_are_gone_after_the_run():
    from torch.distributed.device_mesh import DeviceMesh
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data._utils import pin_memory

    real = (
        torch.cuda,
        torch.accelerator,
        DistributedDataParallel.__init__,
        torch.UntypedStorage.cuda,
        pin_memory._pin_memory_loop,
        torch.multiprocessing.spawn,
        DeviceMesh.__init__,
        torch.amp.autocast_mode.autocast.__init__,
    )
    real_count = torch.cuda.device_count()
    seen = {}

    def program(rank):
        def other_thread():
            seen["thread"] = (
                torch.cuda.device_count(),
                torch.cuda.is_available(),
                torch.accelerator.current_accelerator(),
            )

        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
        seen[rank] = torch.cuda.device_count()
        return torch.cuda.device_count  # a reference taken on a rank

    taken = simdist.simulate(program, 2, **ON_CPU).values[0]
    assert seen == {
        0: 2,
        1: 2,
        "thread": (2, True, torch.device("cuda")),  # a thread a rank starts sees its rank's GPUs
    }
    assert (
        torch.cuda,
        torch.accelerator,
        DistributedDataParallel.__init__,
        torch.UntypedStorage.cuda,
        pin_memory._pin_memory_loop,
        torch.multiprocessing.spawn,
        DeviceMesh.__init__,
        torch.amp.autocast_mode.autocast.__init__,
    ) == real
    assert sys.modules["torch.cuda"] is torch.cuda and type(torch.cuda).__name__ == "module"
    assert taken() == real_count  # the rank's reference is torch's own function here
    assert torch.ones(1).to("cpu").device.type == "cpu" and not torch.overrides._get_current_function_mode()
    if not torch.cuda.is_available():
        with pytest.raises(Exception) as info:
            torch.ones(1).to("cuda")
        assert "simdist" not in str(info.value)


def test_torch_spawn_on_a_simulated_rank_is_refused():
    def child(i):
        pass

    def program(rank):
        torch.multiprocessing.spawn(child, nprocs=2)

    with pytest.raises(simdist.RankError) as info:
        simdist.simulate(program, 2, **ON_CPU)
    message = str(info.value.__cause__)
    assert message.startswith("simdist: torch.multiprocessing.spawn was called on simulated rank")
    assert "simdist run --backend sim --launch spawn" in message


def test_what_a_rank_sets_in_its_environment_stays_its_own(monkeypatch):
    monkeypatch.setenv("SIMDIST_TEST_BEFORE", "caller")
    monkeypatch.delenv("MASTER_PORT", raising=False)

    def program(rank):  # the DDP tutorial's setup() writes os.environ on every rank
        before = os.environ.get("SIMDIST_TEST_BEFORE")
        os.environ["MASTER_PORT"] = str(12355 + rank)
        dist.init_process_group("gloo")
        dist.barrier()
        mine = os.environ["MASTER_PORT"]
        dist.destroy_process_group()
        return before, mine

    assert simdist.simulate(program, 2).values == [("caller", "12355"), ("caller", "12356")]
    assert "MASTER_PORT" not in os.environ
    assert type(os.environ).__name__ == "_Environ"


def cpu_device_means_the_current_gpu(rank):
    torch.cuda.set_device(rank)
    t = torch.ones(2).cuda()
    torch.cuda.synchronize(t.device)  # the tensor reports the CPU: the current simulated GPU is meant
    with torch.cuda.device(t.device):
        inside = torch.cuda.current_device()
    return str(t.device), inside


def test_a_simulated_gpu_tensors_cpu_device_names_the_current_gpu():
    assert simdist.simulate(cpu_device_means_the_current_gpu, 2, **ON_CPU).values == [("cpu", 0), ("cpu", 1)]
