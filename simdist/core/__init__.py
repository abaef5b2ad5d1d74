"""simdist's core: what every backend builds on, and all that the backends import from simdist.

The group interface (:class:`ProcessGroup`, :class:`Work`, the library-backed :class:`LibraryGroup`), the
world a rank runs in and the backend registry, arrays and reduce ops, errors, user call sites, argument checks
and collective signatures, the trace, and the topology with its flows. Nothing here imports a backend at import
time; a backend imports only the names below (and :mod:`simdist.algorithms`), as ``tests`` check.
"""

from __future__ import annotations

from . import _arrays as arrays  # the array adapter (dtype, shape, views, reductions)
from ._callsite import format_user_exception as format_user_exception
from ._callsite import set_remote_site as set_remote_site
from ._callsite import skip_directory as skip_directory
from ._callsite import user_call_site as user_call_site
from ._callsite import user_tracer as user_tracer
from ._checks import check_int as check_int
from ._checks import timeout_seconds as timeout_seconds
from ._entry import library_call as library_call
from ._errors import AuthenticationError as AuthenticationError
from ._errors import BufferRaceError as BufferRaceError
from ._errors import CollectiveMismatchError as CollectiveMismatchError
from ._errors import DeadlockError as DeadlockError
from ._errors import DistError as DistError
from ._errors import DistTimeoutError as DistTimeoutError
from ._errors import LeakWarning as LeakWarning
from ._errors import PeerLostError as PeerLostError
from ._errors import ProtocolError as ProtocolError
from ._errors import RankError as RankError
from ._errors import RankExitError as RankExitError
from ._errors import add_note as add_note
from ._flows import Flows as Flows
from ._group import GroupMember as GroupMember
from ._group import Options as Options
from ._group import ProcessGroup as ProcessGroup
from ._library import Handle as Handle
from ._library import LibraryGroup as LibraryGroup
from ._reduce_op import ReduceOp as ReduceOp
from ._registry import BACKEND_ENV as BACKEND_ENV
from ._registry import SERVED_ENV as SERVED_ENV
from ._registry import STORE_ENV as STORE_ENV
from ._registry import free_port as free_port
from ._registry import TORCH_NAMES as TORCH_NAMES
from ._registry import backend_spec as backend_spec
from ._signatures import decode_signature as decode_signature
from ._signatures import encode_signature as encode_signature
from ._signatures import mismatch_error as mismatch_error
from ._signatures import signature_digest as signature_digest
from ._topology import Topology as Topology
from ._topology import as_topology as as_topology
from ._trace import Event as Event
from ._trace import Raw as Raw
from ._trace import Trace as Trace
from ._work import CompletedWork as CompletedWork
from ._work import DeferredWork as DeferredWork
from ._work import Work as Work
from ._world import ProcessWorld as ProcessWorld
from ._world import World as World
from ._world import current_world as current_world
from ._world import set_process_world as set_process_world
from ._world import set_thread_world as set_thread_world
from ._world import thread_world as thread_world

__all__ = [
    "BACKEND_ENV", "SERVED_ENV", "STORE_ENV", "TORCH_NAMES", "arrays", "AuthenticationError", "BufferRaceError", "CollectiveMismatchError",
    "CompletedWork", "DeadlockError", "DeferredWork", "DistError", "DistTimeoutError", "Event", "Flows",
    "GroupMember", "Handle", "LeakWarning", "LibraryGroup", "Options", "PeerLostError", "ProcessGroup",
    "ProcessWorld", "ProtocolError", "RankError", "RankExitError", "Raw", "ReduceOp", "Topology", "Trace", "Work",
    "World", "add_note", "as_topology", "backend_spec", "check_int", "current_world", "decode_signature",
    "encode_signature", "format_user_exception", "free_port", "library_call", "mismatch_error", "set_process_world",
    "set_remote_site", "set_thread_world", "signature_digest", "skip_directory", "thread_world", "timeout_seconds",
    "user_call_site", "user_tracer",
]  # fmt: skip
