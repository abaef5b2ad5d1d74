"""``library_call``: the boundary between user code and simdist."""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

import torch

__all__ = ["library_call"]

F = TypeVar("F", bound=Callable)


def library_call(fn: F) -> F:
    """Run ``fn`` with torch-function modes off.

    Modes installed for user code (the simulator's CUDA-as-CPU mapping) then cost
    nothing on the tensor operations simdist performs itself.
    """

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with torch._C.DisableTorchFunction():
            return fn(*args, **kwargs)

    return call  # type: ignore[return-value]
