"""(v) What counting a simulated GPU's memory costs: a training loop on simulated GPUs, counted and not, in one run.

    python benchmarks/bench_gpu_memory.py [--reps 5] [--steps 200]

A rank thread with simulated GPUs runs every torch function through simdist's device mode; since
``torch.cuda.memory_allocated`` and its kin answer from the tensors on each GPU, the mode also notes
where each result lies (simdist/torch_bridge/gpu_memory.py). The loop is SGD on an MLP of three
linear layers, batch 32, on ``cuda`` in ``simdist.torch_bridge.cuda.simulated_gpus(2)`` (one thread,
no scheduler): as shipped, and with the counting switched off (``Placed.place`` and ``Placed.gpu_of``
replaced by no-ops), alternating, median of ``--reps``. Two widths: 64 (each op a few microseconds, the
worst case) and 1024 (the matrix products dominate).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_markdown, markdown_table, median

import torch
from torch import nn

from simdist.torch_bridge import cuda, gpu_memory


def _loop(width: int, steps: int) -> tuple[float, int]:
    """Seconds of ``steps`` training steps, and the torch functions the mode saw in them."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 8))
    model = model.to("cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, width, device="cuda")
    calls = [0]
    handler = cuda._OnCpu.__torch_function__

    def counted(self, func, types, args=(), kwargs=None):
        calls[0] += 1
        return handler(self, func, types, args, kwargs)

    cuda._OnCpu.__torch_function__ = counted
    try:
        start = time.perf_counter()
        for _ in range(steps):
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        return time.perf_counter() - start, calls[0]
    finally:
        cuda._OnCpu.__torch_function__ = handler


def _run(width: int, steps: int, counting: bool) -> tuple[float, int]:
    place, gpu_of = gpu_memory.Placed.place, gpu_memory.Placed.gpu_of
    if not counting:
        gpu_memory.Placed.place = lambda self, value, gpu: None
        gpu_memory.Placed.gpu_of = lambda self, values: None
    try:
        with cuda.simulated_gpus(2):
            return _loop(width, steps)
    finally:
        gpu_memory.Placed.place, gpu_memory.Placed.gpu_of = place, gpu_of


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args(argv)
    rows, results = [], {}
    for width in (64, 1024):
        _run(width, 5, True)  # warm: imports, the allocator
        times: dict[bool, list[float]] = {True: [], False: []}
        calls = 0
        for _ in range(args.reps):
            for counting in (True, False):
                seconds, calls = _run(width, args.steps, counting)
                times[counting].append(seconds)
        on, off = median(times[True]), median(times[False])
        per_call = (on - off) / calls * 1e6 if calls else 0.0  # calls: those of one run of --steps steps
        results[width] = {"counted": on, "not counted": off, "calls": calls}
        rows.append([width, f"{on / args.steps * 1e3:.3f}", f"{off / args.steps * 1e3:.3f}", f"{on / off:.2f}",
                     calls // args.steps, f"{per_call:.2f}"])  # fmt: skip
    print(machine_markdown())
    print()
    print(markdown_table(["width", "ms a step, counted", "ms a step, not counted", "ratio", "torch calls a step",
                          "µs a call"], rows))  # fmt: skip
    return results


if __name__ == "__main__":
    main()
