"""What simulated GPUs answer where GPU stacks ask (simdist/torch_bridge/gpu_memory.py, docs/gpu-scripts.md).

The figures are checked against torch's documented semantics for a real GPU: ``memory_allocated`` is
the bytes of the tensors on the device, each allocation a multiple of the caching allocator's 512-byte
block; the peak holds until ``reset_peak_memory_stats``; reserved memory covers what is allocated;
``mem_get_info`` is (free, total). Device mapping inside backward is checked with the hooks and
``autograd.Function`` that DeepSpeed's ZeRO uses.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

import simdist
from simdist import torch_bridge

pytestmark = [
    pytest.mark.torch_release,
    pytest.mark.timeout(120),
    pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is unavailable"),
]
ON_CPU = {"cuda_as_cpu": True}
LINEAR = (256 * 256 + 256) * 4  # nn.Linear(256, 256): a weight and a bias of float32, both multiples of 512 bytes
BATCH = 64 * 256 * 4


def test_memory_statistics_count_the_ranks_own_tensors_on_each_gpu():
    def program(rank):
        torch.cuda.set_device(rank)
        seen = {"start": torch.cuda.memory_allocated()}
        model = nn.Linear(256, 256).to(rank)
        seen["model"] = torch.cuda.memory_allocated()
        x = torch.randn(64, 256, device="cuda")
        seen["batch"] = torch.cuda.memory_allocated(rank)
        model(x).relu().sum().backward()
        grads = [p.grad for p in model.parameters()]
        seen["grads"] = torch.cuda.memory_allocated()
        del x
        seen["freed"] = torch.cuda.memory_allocated()
        seen["peak"] = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        seen["peak after reset"] = torch.cuda.max_memory_allocated()
        one = torch.zeros(1, device="cuda")
        seen["one float"] = torch.cuda.memory_allocated() - seen["freed"]
        seen["other gpu"] = torch.cuda.memory_allocated(1 - rank)
        seen["reserved"] = torch.cuda.memory_reserved()
        seen["info"] = torch.cuda.mem_get_info()
        seen["stats"] = torch.cuda.memory_stats()
        seen["accelerator"] = torch.accelerator.memory_allocated()
        del grads, one
        return seen

    for seen in simdist.simulate(program, 2, **ON_CPU).values:
        assert seen["start"] == 0 and seen["model"] == LINEAR and seen["batch"] == LINEAR + BATCH
        assert seen["grads"] >= 2 * LINEAR + BATCH  # the gradients are on the GPU too (as is the loss, 512 bytes)
        assert seen["freed"] == seen["grads"] - BATCH
        assert seen["peak"] >= seen["grads"] and seen["peak after reset"] == seen["freed"]
        assert seen["one float"] == 512  # the caching allocator's smallest block
        assert seen["other gpu"] == 0
        total = torch_bridge.gpu_memory.PROPERTIES.total_memory
        assert seen["reserved"] % (2 * 2**20) == 0 and seen["reserved"] >= seen["freed"] + 512
        assert seen["info"] == (total - seen["reserved"], total)
        stats = seen["stats"]
        assert stats["allocated_bytes.all.current"] == seen["freed"] + 512 == seen["accelerator"]
        assert stats["reserved_bytes.all.current"] == seen["reserved"]
        assert stats["active_bytes.all.peak"] >= stats["allocated_bytes.all.current"]
        assert stats["num_alloc_retries"] == 0 and stats["num_ooms"] == 0


def test_a_gpu_states_what_it_is():
    def program(rank):
        props = torch.cuda.get_device_properties(rank)
        return props.name, torch.cuda.get_device_name(rank), props.major, props.minor, props.total_memory, \
            torch.cuda.get_device_capability(), props.multi_processor_count, "total_memory=81920MB" in repr(props)  # fmt: skip

    for rank, (name, named, major, minor, total, capability, sms, shown) in enumerate(
        simdist.simulate(program, 2, **ON_CPU).values
    ):
        assert name == named == f"simdist simulated GPU {rank} (CPU)"
        assert (major, minor) == capability == (9, 0) and total == 80 * 2**30 and sms == 132 and shown


def test_nvtx_ranges_mark_nothing_and_nest():
    def program(rank):
        depths = [torch.cuda.nvtx.range_push("step"), torch.cuda.nvtx.range_push("forward")]
        depths += [torch.cuda.nvtx.range_pop(), torch.cuda.nvtx.range_pop(), torch.cuda.nvtx.range_pop()]
        with torch.cuda.nvtx.range("backward"):
            torch.cuda.nvtx.mark("inside")
        from torch.cuda import nvtx

        nvtx.range_end(nvtx.range_start("a"))
        return depths

    assert simdist.simulate(program, 2, **ON_CPU).values == [[0, 1, 1, 0, -1]] * 2


def test_gpu_devices_map_inside_backward():
    """A tensor made on "cuda" in a gradient hook, a post-accumulate hook (DeepSpeed ZeRO's) or an autograd Function's
    backward: torch's dispatch of ``Tensor.backward`` runs the engine without the rank's device mode."""

    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * torch.full_like(grad, 2.0, device="cuda")

    def program(rank):
        made = []
        p = nn.Parameter(torch.ones(3, device="cuda"))
        p.register_hook(lambda g: made.append(torch.zeros(1, device=f"cuda:{rank}")) or g)
        p.register_post_accumulate_grad_hook(lambda t: made.append(torch.ones(1, device="cuda")))
        Twice.apply(p).sum().backward()
        torch.autograd.backward(Twice.apply(p).sum())
        (grad,) = torch.autograd.grad(Twice.apply(p).sum(), p)
        return len(made), p.grad.tolist(), grad.tolist()

    assert simdist.simulate(program, 2, **ON_CPU).values == [(5, [4.0] * 3, [2.0] * 3)] * 2


def test_the_real_torch_cuda_answers_once_the_run_is_over():
    simdist.simulate(lambda rank: torch.cuda.memory_allocated(), 1, **ON_CPU)
    if not torch.cuda.is_available():
        with pytest.raises((RuntimeError, AssertionError)):
            torch.cuda.get_device_properties(0)
    import sys
    import types

    for name in ("torch.cuda", "torch.cuda.nvtx", "torch.accelerator"):
        assert type(sys.modules[name]) is types.ModuleType, name  # torch's own modules again, not the stand-ins


def test_tensors_on_a_gpu_can_be_swapped_and_their_count_follows_their_data():
    """``torch.utils.swap_tensors`` (``Module.to`` swaps parameters where torch's future flag asks, FSDP2 always)
    refuses a tensor with a weak reference; the memory count holds one per tensor and gives it up for the swap."""

    def program(rank):
        on_gpu, on_cpu = torch.ones(256, device="cuda"), torch.ones(512)
        before = torch.cuda.memory_allocated()
        torch.utils.swap_tensors(on_gpu, on_cpu)  # the GPU's data, now in on_cpu, stays on the GPU
        after = torch.cuda.memory_allocated()
        model = nn.Linear(16, 16)
        torch.__future__.set_swap_module_params_on_conversion(True)
        try:
            model.to("cuda").half()
        finally:
            torch.__future__.set_swap_module_params_on_conversion(False)
        return before, after, on_gpu.numel(), torch.cuda.memory_allocated() - after

    half_linear = 512 + 512  # a 16x16 float16 weight and its bias, each a 512-byte block
    assert simdist.simulate(program, 2, **ON_CPU).values == [(1024, 1024, 512, half_linear)] * 2
