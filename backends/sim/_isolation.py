"""What makes rank threads behave like separate processes.

- Global random number generators (``random``, numpy's legacy global generator and
  torch's CPU generator) are saved and restored at every switch between ranks. Rank
  ``r`` starts with each of them seeded with ``r``, so a run does not depend on the
  caller's state and seeding one rank never changes another. The caller's states are
  restored when the run ends.
- Optionally, ``sys.stdout`` is prefixed ``[rank N]`` line by line.
- On a machine without CUDA, tensors a rank moves to a GPU (``.to(rank)``,
  ``.cuda()``, ``device='cuda:0'``) stay on the CPU, so GPU code runs unchanged under
  the simulator (``cuda_as_cpu``).
"""

from __future__ import annotations

import random
import sys
import threading
from typing import Any

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

__all__ = ["enter", "leave", "enter_thread", "leave_thread", "save", "restore", "CudaAsCpu"]

_running = threading.Lock()


def enter(engine: Any) -> tuple:
    """Set up process-wide isolation for a run; returns what :func:`leave` restores."""
    if not _running.acquire(blocking=False):
        raise RuntimeError(
            "a simulation is already running in this process; simulations cannot be nested "
            "(a rank called simdist.simulate or simdist.spawn)"
        )
    saved = (random.getstate(), np.random.get_state(), torch.get_rng_state(), sys.stdout)
    if engine.prefix_output:
        sys.stdout = _Prefixed(sys.stdout, engine)
    return saved


def leave(engine: Any, saved: tuple) -> None:
    py, npy, th, stdout = saved
    random.setstate(py)
    np.random.set_state(npy)
    torch.set_rng_state(th)
    if engine.prefix_output:
        sys.stdout.flush()
        sys.stdout = stdout
    _running.release()


def save(engine: Any, rs: Any) -> None:
    """Remember rank ``rs``'s generator states (it is about to lose the baton)."""
    rs.rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())


def restore(engine: Any, rs: Any) -> None:
    """Install rank ``rs``'s generator states (it is about to get the baton)."""
    if rs.rng is None:
        random.seed(rs.rank)
        np.random.seed(rs.rank)
        torch.manual_seed(rs.rank)
        return
    py, npy, th = rs.rng
    random.setstate(py)
    np.random.set_state(npy)
    torch.set_rng_state(th)


def enter_thread(engine: Any, rs: Any) -> None:
    if engine.cuda_as_cpu:
        rs.cuda_mode = CudaAsCpu()
        rs.cuda_mode.__enter__()


def leave_thread(engine: Any, rs: Any) -> None:
    mode = getattr(rs, "cuda_mode", None)
    if mode is not None:
        mode.__exit__(None, None, None)


def _cpu(device: Any) -> Any:
    if isinstance(device, int) and not isinstance(device, bool):
        return "cpu"
    if isinstance(device, str) and device.startswith("cuda"):
        return "cpu"
    if isinstance(device, torch.device) and device.type == "cuda":
        return "cpu"
    return device


class CudaAsCpu(TorchFunctionMode):
    """Keeps tensors on the CPU when code asks for a CUDA device (for machines without a GPU)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if "device" in kwargs:
            kwargs["device"] = _cpu(kwargs["device"])
        if func is torch.Tensor.to and len(args) > 1:
            args = (args[0], _cpu(args[1]), *args[2:])
        return func(*args, **kwargs)


class _Prefixed:
    """A stdout that starts every line with ``[rank N]`` of the rank writing it."""

    def __init__(self, inner: Any, engine: Any):
        self.inner = inner
        self.engine = engine
        self.at_start: dict[int, bool] = {}

    def write(self, text: str) -> int:
        rs = self.engine.current
        if rs is None or threading.current_thread() is threading.main_thread():
            return self.inner.write(text)
        prefix = f"[rank {rs.rank}] "
        out = []
        for line in text.splitlines(keepends=True):
            if self.at_start.get(rs.rank, True):
                out.append(prefix)
            out.append(line)
            self.at_start[rs.rank] = line.endswith("\n")
        return self.inner.write("".join(out)) and len(text)

    def flush(self) -> None:
        self.inner.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
