"""A torchrun-style DDP training script: every rank runs this file with torchrun's environment.

    torchrun --nproc-per-node 2 train_torchrun.py --steps 4 --out DIR

Seeded, CPU and gloo: prints each rank's loss per step and a checksum of its final parameters;
rank 0 saves DIR/ckpt.pt (model, optimizer, step).
"""

import argparse

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import toy_training

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--out", default=None, help="where rank 0 saves ckpt.pt")
args = parser.parse_args()

dist.init_process_group("gloo")  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE from the launcher
model = toy_training.model()
ddp = DDP(model)
optimizer = toy_training.optimizer(ddp.parameters())
for step in range(args.steps):
    toy_training.train_step(ddp, optimizer, step)
toy_training.finish(model, optimizer, args.steps, args.out)
dist.destroy_process_group()
