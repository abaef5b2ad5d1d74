"""The torch releases the torch bridge was tested on, and what differs between them.

The bridge (:mod:`simdist.torch_bridge.ranks`, :mod:`simdist.torch_bridge.group`) relies on torch
internals. The table below lists every one of them whose shape changed between the
tested releases, and how the bridge copes; everything else it touches is the same in
all of them. With a release outside :data:`TESTED`, the first
``torch.distributed.init_process_group`` on a simulated rank raises an error that says
so; setting ``SIMDIST_TORCH_UNTESTED=1`` tries the bridge anyway.
"""

from __future__ import annotations

import functools
import os

import torch

__all__ = ["TESTED", "DIFFERENCES", "UNTESTED_ENV", "unsupported", "release"]

TESTED = ((2, 13), (2, 14))
"""(major, minor) releases of torch whose torch.distributed runs on simulated ranks, tested in CI."""

UNTESTED_ENV = "SIMDIST_TORCH_UNTESTED"

DIFFERENCES = {
    # torch internal: {release: what it is there} -- and how the bridge copes
    "ProcessGroup.gather_single / gather_into_tensor": {
        (2, 13): "absent (dist.gather_into_tensor does not exist)",
        (2, 14): "called by dist.gather_into_tensor",
    },  # the bridge group defines both names
    "_new_process_group_helper(..., enable_reconfigure=False)": {
        (2, 13): "no enable_reconfigure argument",
        (2, 14): "enable_reconfigure keyword added",
    },  # the bridge's wrapper passes extra arguments through unchanged
    "BackendConfig('undefined') (init_process_group() without a backend)": {
        (2, 13): "cpu:gloo",
        (2, 14): "the accelerator's backend: cuda:nccl on a rank with simulated GPUs",
    },  # the bridge records torch's own answer for the rank, whichever it is
    "ProcessGroup.register_pre_hook / register_post_hook / get_backend": {
        (2, 13): "absent",
        (2, 14): "added; torch's Python code does not call them on a Python group",
    },
}
"""What differs between the tested releases, for every internal the bridge touches."""

_NEEDED = (  # internals the bridge needs, present in every tested release
    ("torch.distributed.distributed_c10d._World", lambda c10d: hasattr(c10d, "_World")),
    (
        "torch.distributed.distributed_c10d._new_process_group_helper",
        lambda c10d: hasattr(c10d, "_new_process_group_helper"),
    ),
    ("torch.distributed.distributed_c10d.rendezvous", lambda c10d: hasattr(c10d, "rendezvous")),
    (
        "torch._C._distributed_c10d._set_thread_isolation_mode",
        lambda c10d: hasattr(torch._C._distributed_c10d, "_set_thread_isolation_mode"),
    ),
)


def release() -> tuple[int, int]:
    """The installed torch's (major, minor)."""
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


@functools.cache
def _missing() -> str | None:
    import torch.distributed as tdist

    if not tdist.is_available():
        return f"torch {torch.__version__} was built without torch.distributed"
    from torch.distributed import distributed_c10d as c10d

    lacking = [name for name, present in _NEEDED if not present(c10d)]
    return f"torch {torch.__version__} lacks {', '.join(lacking)}" if lacking else None


def unsupported() -> str | None:
    """``None`` if torch.distributed code can run on simulated ranks with this torch, else why not."""
    missing = _missing()
    if missing is not None:
        return missing
    if release() in TESTED or os.environ.get(UNTESTED_ENV) == "1":
        return None
    tested = ", ".join(f"{a}.{b}" for a, b in TESTED)
    return (
        f"simdist's torch.distributed bridge was tested on torch {tested}, not on torch {torch.__version__}: "
        f"install one of those (pip install torch==2.13.0), or set {UNTESTED_ENV}=1 to try this torch anyway"
    )
