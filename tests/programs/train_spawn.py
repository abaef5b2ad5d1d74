"""An mp.spawn-style DDP training script: ``python train_spawn.py`` starts its own ranks.

    python train_spawn.py --world 2 --steps 4 --out DIR

The same training as train_torchrun.py, so the results are the same. The parent sets
MASTER_ADDR and MASTER_PORT only where they are unset, taking a free port, so runs side by side
never meet at one port. ``worker`` is also what ``simdist.spawn(worker, args=..., nprocs=...)``
runs; it returns the checksum of the final parameters.
"""

import argparse
import os
import socket

import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

import toy_training


def worker(rank: int, world: int, steps: int, out: str | None) -> str:
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = toy_training.model()
    ddp = DDP(model)
    optimizer = toy_training.optimizer(ddp.parameters())
    for step in range(steps):
        toy_training.train_step(ddp, optimizer, step)
    digest = toy_training.finish(model, optimizer, steps, out)
    dist.destroy_process_group()
    return digest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", default=None, help="where rank 0 saves ckpt.pt")
    args = parser.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(free_port())
    mp.spawn(worker, args=(args.world, args.steps, args.out), nprocs=args.world, join=True)
