"""NCCL through cupy's bindings (``backend="nccl"``): GPUs, one NCCL communicator per group.

Needs the ``nccl`` extra (``cupy-cuda12x``, ``nvidia-nccl-cu12``) and a build of torch with
CUDA. Ranks start like the socket backend's (``simdist run --backend nccl``,
``simdist.spawn(..., backend="nccl")``, torchrun), whose store carries NCCL's unique ids.
"""

from simdist.core import skip_directory

skip_directory(__file__)

from ._group import NcclGroup as NcclGroup  # noqa: E402
from ._world import NcclWorld as NcclWorld  # noqa: E402
from ._world import nccl_unavailable as nccl_unavailable  # noqa: E402

__all__ = ["NcclGroup", "NcclWorld", "nccl_unavailable"]
