"""Communication hooks for :meth:`simdist.DistributedDataParallel.register_comm_hook`.

The built-in hooks of ``torch.distributed.algorithms.ddp_comm_hooks.default_hooks``: each
takes ``(process_group, bucket)`` and returns a :class:`~simdist.Future` of the averaged
bucket buffer, without waiting, so the all-reduce overlaps the rest of the backward pass.

Example::

    from simdist.ddp_comm_hooks import fp16_compress_hook
    model.register_comm_hook(None, fp16_compress_hook)   # None: the default group
"""

from __future__ import annotations

from typing import Any

import torch

from .api import all_reduce, get_world_size
from ._ddp import started_work
from .core._future import Future

__all__ = ["allreduce_hook", "bf16_compress_hook", "fp16_compress_hook"]


def allreduce_hook(process_group: Any, bucket: Any) -> Future:
    """The bucket's average over the group: divide by the group size, then all-reduce (SUM)."""
    buffer = bucket.buffer()
    buffer.div_(get_world_size(process_group))
    return (
        started_work(all_reduce(buffer, group=process_group, async_op=True)).get_future().then(lambda f: f.value()[0])
    )


def _compressed(dtype: torch.dtype, process_group: Any, bucket: Any) -> Future:
    buffer = bucket.buffer()
    small = buffer.to(dtype).div_(get_world_size(process_group))

    def decompress(fut: Future) -> torch.Tensor:
        buffer.copy_(fut.value()[0])
        return buffer

    return started_work(all_reduce(small, group=process_group, async_op=True)).get_future().then(decompress)


def fp16_compress_hook(process_group: Any, bucket: Any) -> Future:
    """The bucket's average, all-reduced in float16 (divided by the group size first) and cast back."""
    return _compressed(torch.float16, process_group, bucket)


def bf16_compress_hook(process_group: Any, bucket: Any) -> Future:
    """The bucket's average, all-reduced in bfloat16 (divided by the group size first) and cast back."""
    return _compressed(torch.bfloat16, process_group, bucket)
