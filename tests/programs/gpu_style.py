"""Training programs written for GPUs, with the calls of nanoGPT and of pytorch/examples' FSDP2 and tensor
parallelism examples, that also run on CPUs.

Plain ``torch.distributed`` (no simdist), launched as torchrun launches (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``): with an accelerator each rank takes ``cuda:LOCAL_RANK`` and NCCL, without one the CPU and
gloo. Under ``simdist run --backend sim`` on a machine without CUDA the ranks see simulated GPUs and take
the GPU path; under ``simdist run --backend gloo`` they take the CPU path; their results must agree.

    python gpu_style.py OUT_DIR [PROGRAM ...]

Each rank saves ``{program: results}`` to ``OUT_DIR/rank{RANK}.pt`` (losses, and parameters as whole
tensors). Programs (all by default): ``nanogpt`` (DDP, bfloat16 autocast, gradient accumulation with
``require_backward_grad_sync``, fused AdamW, gradient clipping, a checkpoint round trip), ``nanogpt_fp16``
(float16 autocast with a ``GradScaler``), ``fsdp2`` (a model built on the meta device, ``fully_shard``
per layer with bfloat16 parameters, ``to_empty`` on the device, explicit prefetching, Adam),
``tensor_parallel`` and ``sequence_parallel`` (``parallelize_module`` on a ``cuda`` device mesh), ``fsdp_tp``
(FSDP2 over ``dp`` and tensor parallelism over ``tp`` of a 2-D mesh; world 4).
"""

from __future__ import annotations

import math
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

STEPS = 3
VOCAB, BLOCK, EMBED, HEADS = 64, 16, 32, 4


def setup() -> torch.device:
    """The device and backend as pytorch/examples' FSDP2 example picks them."""
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.accelerator.is_available():
        device = torch.device(torch.accelerator.current_accelerator().type, local_rank)
        torch.accelerator.set_device_index(local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend=dist.get_default_backend_for_device(device))
    return device


def whole(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter as a whole float32 CPU tensor (DTensors gathered: every rank calls it)."""
    out = {}
    for name, p in model.named_parameters():
        p = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[name] = p.detach().float().cpu().clone()
    return out


# -- nanoGPT's calls ----------------------------------------------------------------------------------------


class Block(nn.Module):
    """A causal self-attention and an MLP, as nanoGPT's (flash attention through scaled_dot_product_attention)."""

    def __init__(self) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(EMBED), nn.LayerNorm(EMBED)
        self.c_attn, self.c_proj = nn.Linear(EMBED, 3 * EMBED), nn.Linear(EMBED, EMBED)
        self.mlp = nn.Sequential(nn.Linear(EMBED, 4 * EMBED), nn.GELU(), nn.Linear(4 * EMBED, EMBED))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(EMBED, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp(self.ln_2(x))


class TinyGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, EMBED), nn.Embedding(BLOCK, EMBED)
        self.block, self.ln_f = Block(), nn.LayerNorm(EMBED)
        self.lm_head = nn.Linear(EMBED, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.ln_f(self.block(self.wte(idx) + self.wpe(pos)))
        return F.cross_entropy(self.lm_head(x).view(-1, VOCAB), targets.view(-1))


def nanogpt(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    device_type = "cuda" if "cuda" in str(device) else "cpu"
    torch.manual_seed(1337)
    model = TinyGPT().to(device)
    scaler = torch.amp.GradScaler(device_type, enabled=dtype == torch.float16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), fused=True)
    model = DDP(model, device_ids=[device.index] if device_type == "cuda" else None)
    ctx = torch.amp.autocast(device_type=device_type, dtype=dtype)
    data = torch.randint(VOCAB, (4096,), generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1337 + rank)

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(len(data) - BLOCK, (4,), generator=g)
        x = torch.stack([data[i : i + BLOCK] for i in ix])
        y = torch.stack([data[i + 1 : i + 1 + BLOCK] for i in ix])
        if device_type == "cuda":
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x.to(device), y.to(device)

    accumulation, losses = 2, []
    for _ in range(STEPS):
        for micro_step in range(accumulation):
            model.require_backward_grad_sync = micro_step == accumulation - 1
            x, y = get_batch()
            with ctx:
                loss = model(x, y) / accumulation
            scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item() * accumulation)
    # a checkpoint's round trip, loaded onto the rank's device as nanoGPT resumes
    path = os.path.join(os.environ["GPU_STYLE_OUT"], f"ckpt{rank}.pt")
    torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}, path)
    state = torch.load(path, map_location=device)
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return {"losses": losses, "world": world, **whole(model.module)}


def nanogpt_fp16(device: torch.device) -> dict:
    return nanogpt(device, torch.float16)


# -- pytorch/examples distributed/FSDP2's calls -----------------------------------------------------------


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(EMBED)
        self.ffn = nn.Sequential(nn.Linear(EMBED, 2 * EMBED), nn.GELU(), nn.Linear(2 * EMBED, EMBED))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ffn(self.norm(x))


class Stack(nn.Module):
    def __init__(self, n: int = 3) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, EMBED)
        self.layers = nn.ModuleList(Layer() for _ in range(n))
        self.out = nn.Linear(EMBED, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        for layer in self.layers:
            x = layer(x)
        return self.out(x)


def _init_weights(model: nn.Module) -> None:
    """Deterministic values whatever the sharding: each parameter filled from its name and shape."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            full = torch.linspace(-1, 1, math.prod(p.shape)).reshape(p.shape) * (0.2 + len(name) % 5 * 0.1)
            if hasattr(p, "full_tensor"):  # a DTensor: this rank's shard of the whole
                from torch.distributed.tensor import distribute_tensor

                p.to_local().copy_(distribute_tensor(full.to(p.dtype), p.device_mesh, p.placements).to_local())
            else:
                p.copy_(full)


def fsdp2(device: torch.device) -> dict:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    with torch.device("meta"):
        model = Stack()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    layers = list(model.layers)
    for i, layer in enumerate(layers[:-1]):
        layer.set_modules_to_forward_prefetch([layers[i + 1]])
    for i, layer in enumerate(layers[1:], start=1):
        layer.set_modules_to_backward_prefetch([layers[i - 1]])
    model.to_empty(device=device)
    _init_weights(model)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    g, losses = torch.Generator().manual_seed(dist.get_rank()), []
    for _ in range(STEPS):
        model.unshard()
        x = torch.randint(0, VOCAB, (4, BLOCK), generator=g).to(device)
        loss = model(x).float().pow(2).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optim.step()
        optim.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, **whole(model)}


# -- pytorch/examples distributed/tensor_parallelism's calls ---------------------------------------------------


class ToyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.in_proj, self.relu, self.out_proj = nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.relu(self.in_proj(x)))


def _tp_train(model: nn.Module, device_type: str, seed_offset: int = 0) -> list[float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.25, foreach=True)
    losses = []
    for i in range(STEPS):
        torch.manual_seed(i + seed_offset)  # the same input on every rank of a tensor-parallel group
        inp = torch.rand(20, 10, device=device_type)
        output = model(inp)
        output.sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(output.sum().item())
    return losses


def tensor_parallel(device: torch.device) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    device_type = torch.accelerator.current_accelerator().type if torch.accelerator.is_available() else "cpu"
    mesh = init_device_mesh(device_type=device_type, mesh_shape=(dist.get_world_size(),))
    torch.manual_seed(0)
    model = parallelize_module(
        ToyModel().to(device_type), mesh, {"in_proj": ColwiseParallel(), "out_proj": RowwiseParallel()}
    )
    return {"losses": _tp_train(model, device_type), **whole(model)}


def sequence_parallel(device: torch.device) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    device_type = torch.accelerator.current_accelerator().type if torch.accelerator.is_available() else "cpu"
    mesh = init_device_mesh(device_type=device_type, mesh_shape=(dist.get_world_size(),))
    torch.manual_seed(0)
    plan = {
        "in_proj": ColwiseParallel(input_layouts=Shard(0)),
        "out_proj": RowwiseParallel(output_layouts=Shard(0)),
    }
    model = parallelize_module(ToyModel().to(device_type), mesh, plan)
    return {"losses": _tp_train(model, device_type), **whole(model)}


def fsdp_tp(device: torch.device) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    device_type = torch.accelerator.current_accelerator().type if torch.accelerator.is_available() else "cpu"
    grid = init_device_mesh(device_type, (dist.get_world_size() // 2, 2), mesh_dim_names=("dp", "tp"))
    tp_mesh, dp_mesh = grid["tp"], grid["dp"]
    model = Stack(2).to(device_type)
    _init_weights(model)
    plan = {
        "emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "out": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }
    model = parallelize_module(model, tp_mesh, plan)
    for layer in model.layers:
        layer_plan = {
            "norm": SequenceParallel(),
            "ffn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "ffn.0": ColwiseParallel(),
            "ffn.2": RowwiseParallel(output_layouts=Shard(1)),
        }
        parallelize_module(layer, tp_mesh, layer_plan)
    model = fully_shard(model, mesh=dp_mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=True)
    losses = []
    for i in range(STEPS):
        torch.manual_seed(i + dp_mesh.get_local_rank())
        inp = torch.randint(VOCAB, (4, BLOCK), device=device_type)
        loss = model(inp).float().pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, **whole(model)}


PROGRAMS = {f.__name__: f for f in (nanogpt, nanogpt_fp16, fsdp2, tensor_parallel, sequence_parallel, fsdp_tp)}


def main(out_dir: str, names: list[str]) -> None:
    os.environ["GPU_STYLE_OUT"] = out_dir
    device = setup()
    results = {"device": device.type}
    for name in names or PROGRAMS:
        if name == "fsdp_tp" and dist.get_world_size() % 2:
            continue
        results[name] = PROGRAMS[name](device)
        dist.barrier()
    torch.save(results, os.path.join(out_dir, f"rank{dist.get_rank()}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
