"""torch.distributed's own backends behind simdist's interface: ``gloo``, ``torch-nccl`` and ``mpi``.

Code written against simdist runs unchanged on torch's production engine: the world
calls ``torch.distributed.init_process_group`` and every simdist group wraps a torch
group (:class:`TorchGroup`). Ranks are launched like the socket backend's (``simdist run``,
``simdist.spawn``, or torchrun with ``env://``).
"""

from simdist.core import skip_directory

skip_directory(__file__)

from ._group import TorchGroup as TorchGroup  # noqa: E402
from ._world import GlooWorld as GlooWorld  # noqa: E402
from ._world import MpiWorld as MpiWorld  # noqa: E402
from ._world import TorchNcclWorld as TorchNcclWorld  # noqa: E402
from ._world import TorchWorld as TorchWorld  # noqa: E402

__all__ = ["TorchGroup", "TorchWorld", "GlooWorld", "TorchNcclWorld", "MpiWorld"]
