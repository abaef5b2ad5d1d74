"""simdist: torch.distributed-style collectives on a deterministic simulator and real backends.

``import simdist as dist`` in place of ``import torch.distributed as dist``; launch with
``simdist.spawn(fn, args=(world_size,), nprocs=world_size, backend="sim")`` or
``simdist.simulate(fn, nprocs)`` for values, trace and replay token.
"""

__version__ = "0.1.0"

from . import _source_layout  # noqa: F401  (first: in a checkout, maps backends/ and visualize/ as installed)

from ._api import (
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
from ._p2p import (
    batch_isend_irecv,
    irecv,
    isend,
    P2POp,
    recv,
    send,
)
from ._backend import Backend, is_nccl_available
from ._ddp import DistributedDataParallel, GradBucket
from .core._errors import (
    AuthenticationError,
    BufferRaceError,
    CollectiveMismatchError,
    DeadlockError,
    DistError,
    DistTimeoutError,
    LeakWarning,
    NotInitializedError,
    PeerLostError,
    ProtocolError,
    RankError,
    RankExitError,
)
from .core._future import Future
from .core._group import group, GroupMember, ProcessGroup
from .launch._launch import enumerate_schedules, spawn
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
from .core._reduce_op import ReduceOp
from .core._registry import BackendSpec, register_backend
from ._sampler import DistributedSampler
from ._subgroups import new_subgroups, split_group
from .core._topology import TOPOLOGIES, Topology
from .core._trace import Event, Trace
from .core._work import Work
from .backends.sim import SimOptions, simulate

__all__ = [
    "P2POp",
    "all_gather",
    "all_gather_into_tensor",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "compute",
    "destroy_process_group",
    "gather",
    "get_backend",
    "get_global_rank",
    "get_group_rank",
    "get_process_group_ranks",
    "get_rank",
    "get_world_size",
    "init_process_group",
    "irecv",
    "is_available",
    "is_initialized",
    "isend",
    "new_group",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "send",
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "scatter_object_list",
    "send_object_list",
    "recv_object_list",
    "monitored_barrier",
    "new_subgroups",
    "split_group",
    "is_nccl_available",
    "Backend",
    "init_device_mesh",
    "AuthenticationError",
    "BufferRaceError",
    "CollectiveMismatchError",
    "DeadlockError",
    "DistError",
    "DistTimeoutError",
    "LeakWarning",
    "NotInitializedError",
    "PeerLostError",
    "ProtocolError",
    "RankError",
    "RankExitError",
    "GroupMember",
    "ProcessGroup",
    "group",
    "ReduceOp",
    "DistributedDataParallel",
    "DistributedSampler",
    "Future",
    "GradBucket",
    "Work",
    "Event",
    "Trace",
    "Topology",
    "TOPOLOGIES",
    "BackendSpec",
    "register_backend",
    "enumerate_schedules",
    "simulate",
    "SimOptions",
    "spawn",
]
