"""Lesson 6: from the simulator to real processes, torch's engine and GPUs, without changing the code.

One training script, written once. What it runs on is the backend's name, and only the
name: the simulator ("sim"), real processes over TCP ("socket"), torch.distributed's own
gloo ("gloo"), NCCL on GPUs ("nccl", through cupy; "torch-nccl" is torch's own NCCL).

Topics:
  1. the script: init_process_group, DistributedDataParallel, DistributedSampler; the only
     GPU-specific line picks the device
  2. the same training on the simulator, on socket processes and on torch's gloo: the
     weights agree
  3. what changes on GPUs, and how to launch there:
         simdist run --nproc-per-node 8 --backend nccl train.py
     (python tutorials/06_to_gpus.py --gpu runs part 2 on NCCL when this machine has a GPU)

The simulator and gloo may add a bucket's gradients in a different order, so floats are
compared with a tolerance. Only the parent prints, so the output is the same on every run
(CI compares it with ``06_to_gpus.out``); ``--gpu`` prints more, to a machine's own log.

Run it:  python tutorials/06_to_gpus.py [--gpu]
"""

import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import simdist as dist  # in place of: import torch.distributed as dist

WORLD_SIZE = 2
GPU_BACKENDS = ("nccl", "torch-nccl")

gen = torch.Generator().manual_seed(0)
DATA = TensorDataset(torch.randn(64, 16, generator=gen), torch.randn(64, 1, generator=gen))


# --- 1. the script ------------------------------------------------------------------------------
# Everything a rank does. `backend` is the one thing that differs between the runs below;
# under `simdist run --backend ...` the launcher's choice wins whatever the script names.


def train(rank, backend, steps=4):
    dist.init_process_group(backend)
    if backend in GPU_BACKENDS:
        # One GPU per rank, as under torchrun: LOCAL_RANK is the rank's index on its machine.
        local = int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count()
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
    ddp = dist.DistributedDataParallel(model)  # broadcasts rank 0's weights, averages gradients
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    sampler = dist.DistributedSampler(DATA, shuffle=False)  # rank and world size from the group
    for step, (x, y) in enumerate(DataLoader(DATA, batch_size=8, sampler=sampler)):
        if step == steps:
            break
        loss = nn.functional.mse_loss(ddp(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
    weights = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    dist.destroy_process_group()
    return weights


def max_difference(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


def title(text):
    print()
    print(f"=== {text} ===")


def compare(name, runs, reference):
    """Print whether every rank of ``runs`` ended with ``reference``'s weights."""
    worst = max(max_difference(r, reference) for r in runs)
    print(f"{name:<28} ranks agree with the simulator (max |difference| < 1e-6): {worst < 1e-6}")


def main(gpu):
    title("1. one script, several backends")
    print("train(rank, backend) calls dist.init_process_group(backend), wraps the model in")
    print("DistributedDataParallel and reads its shard through DistributedSampler.")
    print("The only GPU-specific lines choose the device: torch.cuda.set_device(LOCAL_RANK).")

    title("2. the same training on the simulator, on processes and on torch's gloo")
    sim = dist.simulate(train, WORLD_SIZE, args=("gloo",))  # inside a simulation every name binds to it
    reference = sim.values[0]
    print(f"simulator: {WORLD_SIZE} ranks, {len(sim.trace.of_kind('collective'))} collectives, "
          f"replicas identical: {max_difference(sim.values[0], sim.values[1]) == 0}")
    compare("socket (real processes)", dist.spawn(train, args=("socket",), nprocs=WORLD_SIZE, backend="socket"),
            reference)
    compare("gloo (torch.distributed)", dist.spawn(train, args=("gloo",), nprocs=WORLD_SIZE, backend="gloo"),
            reference)

    title("3. on GPUs")
    print("On a machine with GPUs, the same script runs with one process per GPU:")
    print("    simdist run --nproc-per-node 8 --backend nccl train.py        # NCCL through cupy")
    print("    simdist run --nproc-per-node 8 --backend torch-nccl train.py  # torch's ProcessGroupNCCL")
    print("What changes there:")
    print("  - tensors live on the rank's GPU; CPU tensors still work on 'nccl' (copied to the GPU and back)")
    print("  - work.wait() makes the current CUDA stream wait for the operation, not the Python")
    print("    thread: read a result on the host with .item() or .cpu(), which wait for the stream")
    print("  - NCCL has no tags and no receive from any source: recv() must name src")
    if gpu:
        from simdist.backends.nccl import nccl_unavailable

        reason = nccl_unavailable()
        if reason is not None:
            print(f"--gpu: NCCL cannot run here: {reason}")
            return 1
        world = max(1, min(WORLD_SIZE, torch.cuda.device_count()))
        if world < WORLD_SIZE:
            print(f"--gpu: {torch.cuda.device_count()} GPU(s): comparing {world} rank(s) with the simulator")
            reference = dist.simulate(train, world, args=("gloo",)).values[0]
        for backend in GPU_BACKENDS:
            runs = dist.spawn(train, args=(backend,), nprocs=world, backend=backend, start_method="spawn")
            compare(f"{backend} ({torch.cuda.get_device_name(0)})", runs, reference)
    return 0


if __name__ == "__main__":
    sys.exit(main(gpu="--gpu" in sys.argv[1:]))
