"""simdist: torch.distributed-style collectives on a deterministic simulator and real backends.

``import simdist as dist`` in place of ``import torch.distributed as dist``; launch with
``simdist.spawn(fn, args=(world_size,), nprocs=world_size, backend="sim")`` or
``simdist.simulate(fn, nprocs)`` for values, trace and replay token.
"""

# Names are imported on first use (PEP 562), so that `import simdist` is cheap until the API
# is used: the pytest plugin (simdist._pytest_plugin) loads with every pytest run.
import typing as _typing

__version__ = "0.1.0"

_LAZY = {
    "P2POp": "._api",
    "all_gather": "._api",
    "all_gather_into_tensor": "._api",
    "all_reduce": "._api",
    "all_to_all": "._api",
    "all_to_all_single": "._api",
    "barrier": "._api",
    "batch_isend_irecv": "._api",
    "broadcast": "._api",
    "compute": "._api",
    "destroy_process_group": "._api",
    "gather": "._api",
    "get_backend": "._api",
    "get_global_rank": "._api",
    "get_group_rank": "._api",
    "get_process_group_ranks": "._api",
    "get_rank": "._api",
    "get_world_size": "._api",
    "init_process_group": "._api",
    "irecv": "._api",
    "is_available": "._api",
    "is_initialized": "._api",
    "isend": "._api",
    "new_group": "._api",
    "recv": "._api",
    "reduce": "._api",
    "reduce_scatter": "._api",
    "reduce_scatter_tensor": "._api",
    "scatter": "._api",
    "send": "._api",
    "DistributedDataParallel": "._ddp",
    "GradBucket": "._ddp",
    "AuthenticationError": "._errors",
    "BufferRaceError": "._errors",
    "CollectiveMismatchError": "._errors",
    "DeadlockError": "._errors",
    "DistError": "._errors",
    "DistTimeoutError": "._errors",
    "LeakWarning": "._errors",
    "NotInitializedError": "._errors",
    "PeerLostError": "._errors",
    "ProtocolError": "._errors",
    "RankError": "._errors",
    "GroupMember": "._group",
    "ProcessGroup": "._group",
    "group": "._group",
    "enumerate_schedules": "._launch",
    "simulate": ".backends.sim",
    "spawn": "._launch",
    "Future": "._future",
    "all_gather_object": "._objects",
    "broadcast_object_list": "._objects",
    "gather_object": "._objects",
    "scatter_object_list": "._objects",
    "ReduceOp": "._reduce_op",
    "BackendSpec": "._registry",
    "register_backend": "._registry",
    "DistributedSampler": "._sampler",
    "TOPOLOGIES": "._topology",
    "Topology": "._topology",
    "Event": "._trace",
    "Trace": "._trace",
    "Work": "._work",
}

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
    "spawn",
]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'simdist' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


if _typing.TYPE_CHECKING:
    from ._api import P2POp as P2POp
    from ._api import all_gather as all_gather
    from ._api import all_gather_into_tensor as all_gather_into_tensor
    from ._api import all_reduce as all_reduce
    from ._api import all_to_all as all_to_all
    from ._api import all_to_all_single as all_to_all_single
    from ._api import barrier as barrier
    from ._api import batch_isend_irecv as batch_isend_irecv
    from ._api import broadcast as broadcast
    from ._api import compute as compute
    from ._api import destroy_process_group as destroy_process_group
    from ._api import gather as gather
    from ._api import get_backend as get_backend
    from ._api import get_global_rank as get_global_rank
    from ._api import get_group_rank as get_group_rank
    from ._api import get_process_group_ranks as get_process_group_ranks
    from ._api import get_rank as get_rank
    from ._api import get_world_size as get_world_size
    from ._api import init_process_group as init_process_group
    from ._api import irecv as irecv
    from ._api import is_available as is_available
    from ._api import is_initialized as is_initialized
    from ._api import isend as isend
    from ._api import new_group as new_group
    from ._api import recv as recv
    from ._api import reduce as reduce
    from ._api import reduce_scatter as reduce_scatter
    from ._api import reduce_scatter_tensor as reduce_scatter_tensor
    from ._api import scatter as scatter
    from ._api import send as send
    from ._ddp import DistributedDataParallel as DistributedDataParallel
    from ._ddp import GradBucket as GradBucket
    from ._errors import AuthenticationError as AuthenticationError
    from ._errors import BufferRaceError as BufferRaceError
    from ._errors import CollectiveMismatchError as CollectiveMismatchError
    from ._errors import DeadlockError as DeadlockError
    from ._errors import DistError as DistError
    from ._errors import DistTimeoutError as DistTimeoutError
    from ._errors import LeakWarning as LeakWarning
    from ._errors import NotInitializedError as NotInitializedError
    from ._errors import PeerLostError as PeerLostError
    from ._errors import ProtocolError as ProtocolError
    from ._errors import RankError as RankError
    from ._group import GroupMember as GroupMember
    from ._group import ProcessGroup as ProcessGroup
    from ._group import group as group
    from ._launch import enumerate_schedules as enumerate_schedules
    from .backends.sim import simulate as simulate
    from ._launch import spawn as spawn
    from ._future import Future as Future
    from ._objects import all_gather_object as all_gather_object
    from ._objects import broadcast_object_list as broadcast_object_list
    from ._objects import gather_object as gather_object
    from ._objects import scatter_object_list as scatter_object_list
    from ._reduce_op import ReduceOp as ReduceOp
    from ._registry import BackendSpec as BackendSpec
    from ._registry import register_backend as register_backend
    from ._sampler import DistributedSampler as DistributedSampler
    from ._topology import TOPOLOGIES as TOPOLOGIES
    from ._topology import Topology as Topology
    from ._trace import Event as Event
    from ._trace import Trace as Trace
    from ._work import Work as Work
