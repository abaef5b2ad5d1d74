"""Backend names as torch spells them: ``Backend`` and ``is_nccl_available``."""

from __future__ import annotations

import os

import torch.distributed

from ..core._registry import BACKEND_ENV, backend_spec
from ..core._world import current_world

__all__ = ["Backend", "is_nccl_available"]


class Backend(torch.distributed.Backend):
    """torch's ``Backend``: ``Backend("GLOO") == Backend.GLOO == "gloo"``; a name torch does not know is lowercased.

    It is ``torch.distributed.Backend`` (a ``str`` subclass whose constructor normalizes a
    name), with simdist's own backends beside torch's: ``Backend.SIM == "sim"`` and
    ``Backend.SOCKET == "socket"``. Any of these names may be passed to ``init_process_group``.
    """

    SIM = "sim"
    SOCKET = "socket"


def is_nccl_available() -> bool:
    """Whether ``init_process_group("nccl")`` can run here: always on simulated ranks, else where NCCL can.

    Simulated ranks run code written for ``"nccl"`` (the simulator binds every backend name),
    and so does a process that ``simdist run`` launched with a backend of its own; otherwise it
    answers whether simdist's NCCL backend (through cupy) is installed, as torch's answers whether
    torch was built with NCCL. No GPU is needed for ``True``, as in torch.

    Returns:
        ``True`` or ``False``.

    Example:
        >>> import simdist
        >>> simdist.simulate(lambda rank: simdist.is_nccl_available(), 2).values
        [True, True]
    """
    world = current_world()
    if (world is not None and not world.process_world) or os.environ.get(BACKEND_ENV):
        return True
    return backend_spec("nccl").available()
