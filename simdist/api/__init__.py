"""The torch.distributed-style functions, on whichever backend the calling rank's world runs.

The set-up (``init_process_group``, groups, ranks, ``compute``), collectives, point-to-point and
object collectives, subgroups, ``init_device_mesh``, ``monitored_barrier`` and ``DistributedSampler``.
Each function resolves the world (:mod:`simdist.core`), then the group, checks its arguments and calls
the group; nothing here knows a backend. ``simdist`` exports every name below; the torch bridge and the
launchers import them from here.
"""

from __future__ import annotations

from ._backend import Backend, is_nccl_available
from ._collectives import (
    all_gather,
    all_gather_into_tensor,
    all_reduce,
    all_to_all,
    all_to_all_single,
    barrier,
    broadcast,
    gather,
    reduce,
    reduce_scatter,
    reduce_scatter_tensor,
    scatter,
)
from ._mesh import init_device_mesh
from ._monitored import monitored_barrier
from ._objects import (
    all_gather_object,
    broadcast_object_list,
    gather_object,
    recv_object_list,
    scatter_object_list,
    send_object_list,
)
from ._p2p import P2POp, batch_isend_irecv, irecv, isend, recv, send
from ._sampler import DistributedSampler
from ._setup import (
    compute,
    destroy_process_group,
    get_backend,
    get_global_rank,
    get_group_rank,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    init_process_group,
    is_available,
    is_initialized,
    new_group,
)
from ._subgroups import new_subgroups, split_group

__all__ = [
    "Backend", "DistributedSampler", "P2POp", "all_gather", "all_gather_into_tensor", "all_gather_object",
    "all_reduce", "all_to_all", "all_to_all_single", "barrier", "batch_isend_irecv", "broadcast",
    "broadcast_object_list", "compute", "destroy_process_group", "gather", "gather_object", "get_backend",
    "get_global_rank", "get_group_rank", "get_process_group_ranks", "get_rank", "get_world_size",
    "init_device_mesh", "init_process_group", "irecv", "is_available", "is_initialized", "is_nccl_available",
    "isend", "monitored_barrier", "new_group", "new_subgroups", "recv", "recv_object_list", "reduce",
    "reduce_scatter", "reduce_scatter_tensor", "scatter", "scatter_object_list", "send", "send_object_list",
    "split_group",
]  # fmt: skip
