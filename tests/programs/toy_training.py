"""What the launch-path programs share: a small seeded model, its data, one training step, and how results print.

Plain ``torch.distributed`` (no simdist): the programs beside this file run unchanged under torchrun,
``python``, ``simdist run`` with each backend and ``simdist.spawn``. Each step trains a DDP model
(gradients all-reduced by DDP) and then runs the collectives a training loop uses beside DDP:
``all_reduce`` (the mean loss), ``all_gather`` (every rank's loss), ``broadcast`` (a learning-rate
scale that rank 0 decides) and ``isend``/``recv`` round the ring (a token). Every result line starts
with ``result:`` and ends with ``key=value`` fields, so a harness can read it whatever prefix a
launcher puts before it (``[rank 1] `` or nothing). Floats print as ``repr``, which reads back to
the same float: runs compare exactly.
"""

from __future__ import annotations

import hashlib
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

FEATURES = 6
BATCH = 8


def model(seed: int = 0) -> nn.Module:
    """The same small MLP on every rank and every launch (``seed`` decides its initial parameters)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, 1))


def optimizer(params) -> torch.optim.Optimizer:
    """SGD with momentum: its state (the momentum buffers) is part of what a checkpoint must carry."""
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def report(line: str) -> None:
    """Print ``result: LINE`` in one write, so lines of ranks that share a terminal never interleave."""
    sys.stdout.write(f"result: {line}\n")
    sys.stdout.flush()


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s batch at ``step``: its own generator, so no global random state is involved."""
    gen = torch.Generator().manual_seed(10_000 * step + rank)
    x = torch.randn(BATCH, FEATURES, generator=gen)
    return x, torch.sin(x.sum(dim=1, keepdim=True))


def train_step(ddp: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    """One step of DDP training, then the other collectives; prints this rank's ``result:`` line."""
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = batch(rank, step)
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(ddp(x), y)
    loss.backward()  # DDP all-reduces the gradients

    mean = loss.detach().reshape(1).clone()
    dist.all_reduce(mean)
    mean /= world
    losses = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(losses, loss.detach().reshape(1))
    scale = torch.tensor([1.0 / (1 + step)]) if rank == 0 else torch.zeros(1)
    dist.broadcast(scale, src=0)
    token, got = torch.tensor([1000.0 * rank + step]), torch.zeros(1)
    if world > 1:
        req = dist.isend(token, dst=(rank + 1) % world)
        dist.recv(got, src=(rank - 1) % world)
        req.wait()
    for group in optimizer.param_groups:
        group["lr"] = group.setdefault("base_lr", group["lr"]) * scale.item()
    optimizer.step()
    report(
        f"rank={rank} step={step} loss={loss.item()!r} mean={mean.item()!r} "
        f"losses={','.join(repr(t.item()) for t in losses)} scale={scale.item()!r} token={got.item()!r}"
    )


def checksum(state: dict[str, torch.Tensor]) -> str:
    """sha256 of a state dict's tensors (names, dtypes, shapes, bytes) in order: equal iff every value is."""
    h = hashlib.sha256()
    for name, t in state.items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def engine() -> str:
    """The class that runs the default group's CPU collectives: ``ProcessGroupGloo`` on torch's gloo, simdist's own
    class where simdist runs them (the launch paths differ in exactly this)."""
    try:
        return type(dist.group.WORLD._get_backend(torch.device("cpu"))).__name__
    except (AttributeError, RuntimeError):  # a torch without this internal
        return "unknown"


def finish(module: nn.Module, optimizer: torch.optim.Optimizer, steps: int, out: str | None) -> str:
    """Print this rank's final ``result:`` line; rank 0 saves the checkpoint in ``out``. Returns the checksum."""
    rank = dist.get_rank()
    state = module.state_dict()
    digest = checksum(state)
    total = sum(float(t.double().sum()) for t in state.values())
    report(f"rank={rank} final steps={steps} params={digest} sum={total!r} engine={engine()}")
    if rank == 0 and out:
        os.makedirs(out, exist_ok=True)
        torch.save({"model": state, "optimizer": optimizer.state_dict(), "step": steps}, os.path.join(out, "ckpt.pt"))
    return digest
