"""A torchrun-style script that resumes from its checkpoint: train, save, and a later launch continues.

    torchrun --nproc-per-node 2 train_resume.py --stop 2 --steps 4 --out DIR   # steps 0-1, saves DIR/ckpt.pt
    torchrun --nproc-per-node 2 train_resume.py --steps 4 --out DIR            # loads it, steps 2-3

Every rank loads DIR/ckpt.pt where it exists (model, optimizer with its momentum, step) and trains
from that step up to ``--stop`` (default ``--steps``); rank 0 then saves DIR/ckpt.pt again. The same
training as train_torchrun.py: two launches end with the parameters of one uninterrupted run.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import toy_training

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--stop", type=int, default=None, help="stop (and save) after this step (default --steps)")
parser.add_argument("--out", required=True, help="where ckpt.pt is loaded from and saved")
args = parser.parse_args()

dist.init_process_group("gloo")
model = toy_training.model()
optimizer = toy_training.optimizer(model.parameters())
start, path = 0, os.path.join(args.out, "ckpt.pt")
if os.path.exists(path):
    saved = torch.load(path, map_location="cpu")
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    start = saved["step"]
    print(f"rank {dist.get_rank()}: resumed at step {start}", flush=True)
ddp = DDP(model)
stop = args.steps if args.stop is None else args.stop
for step in range(start, stop):
    toy_training.train_step(ddp, optimizer, step)
dist.barrier()  # every rank has read the checkpoint before rank 0 replaces it
toy_training.finish(model, optimizer, stop, args.out)
dist.destroy_process_group()
