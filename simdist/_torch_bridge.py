"""Unmodified ``torch.distributed`` code on simulated ranks: every torch-internal touch point lives here.

While a simulation runs (:func:`install` at its start, :func:`uninstall` at its end):

- torch's process-group bookkeeping (``distributed_c10d._world``) becomes per thread, so
  each rank thread has its own default group and group registries (torch's thread
  isolation mode on), and autograd's device threads are off;
- ``torch.distributed.init_process_group`` and ``new_group``, called from a rank thread,
  join the rank's simdist world first and then create torch groups of backend
  ``"simdist"`` whatever backend name the program gives (``"gloo"``, ``"nccl"``, ...);
  ``destroy_process_group`` leaves both;
- a :class:`BridgeGroup` (a Python ``torch.distributed.ProcessGroup``) forwards every op
  torch can call to the rank's simdist group and returns a completed work whose future
  holds the tensors it modified in place (what torch's DDP reads).

So a rank's torch calls become simdist calls: scheduled, checked, traced and replayable.
Supported torch versions: :data:`SUPPORTED`; with another torch, the first
``torch.distributed.init_process_group`` in a simulation raises a clear error.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import torch

__all__ = ["BridgeGroup", "SUPPORTED", "install", "uninstall", "enter_rank", "leave_rank", "supported"]

SUPPORTED = ((2, 13),)  # (major, minor) versions of torch this module was tested against
_OWN = ("pg_map", "pg_names", "pg_group_ranks", "pg_backend_config", "tags_to_pg", "pg_to_tag")
_state: dict[str, Any] = {}
_registered = False


@functools.cache
def supported() -> str | None:
    """``None`` if this torch can run torch.distributed code on simulated ranks, else why not."""
    version = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    if version not in SUPPORTED:
        wanted = ", ".join(f"{a}.{b}" for a, b in SUPPORTED)
        return f"torch {torch.__version__} is not supported by simdist's torch.distributed bridge (supported: {wanted})"
    import torch.distributed as tdist

    if not tdist.is_available():
        return "this torch build has no torch.distributed"
    from torch.distributed import distributed_c10d as c10d

    missing = [name for name, ok in (
        ("distributed_c10d._World", hasattr(c10d, "_World")),
        ("_set_thread_isolation_mode", hasattr(torch._C._distributed_c10d, "_set_thread_isolation_mode")),
        ("_create_work_from_future", hasattr(torch._C._distributed_c10d, "_create_work_from_future")),
    ) if not ok]
    return f"torch {torch.__version__} lacks {', '.join(missing)}" if missing else None


# -- per-thread torch worlds ------------------------------------------------------------------------------


@functools.cache
def _rank_world_class() -> type:
    from torch.distributed import distributed_c10d as c10d

    class RankWorld(c10d._World):
        """One rank's torch world: the registries torch keeps in module globals, owned by this object."""

        def __init__(self) -> None:
            super().__init__()
            self._own = {k: {} for k in _OWN}
            self._count = 0

    for key in _OWN:
        setattr(RankWorld, key, property(lambda self, k=key: self._own[k]))
    RankWorld.group_count = property(lambda self: self._count, lambda self, v: setattr(self, "_count", v))
    return RankWorld


class _WorldProxy:
    """Stands for ``distributed_c10d._world``: the calling rank thread's world, or the process's."""

    def __init__(self, fallback: Any):
        object.__setattr__(self, "_local", threading.local())
        object.__setattr__(self, "_fallback", fallback)

    def _world(self) -> Any:
        return getattr(self._local, "world", None) or self._fallback

    def __getattr__(self, name: str) -> Any:
        return getattr(self._world(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._world(), name, value)


# -- the process group torch sees ------------------------------------------------------------------------


def _done(result: Any) -> Any:
    fut = torch.futures.Future()
    fut.set_result(result)
    return torch._C._distributed_c10d._create_work_from_future(fut)


def _reduce_op(opts: Any) -> Any:
    import torch.distributed as tdist

    from ._reduce_op import ReduceOp

    op = getattr(getattr(opts, "reduceOp", None), "op", tdist.ReduceOp.SUM)
    names = {tdist.ReduceOp.SUM: "SUM", tdist.ReduceOp.AVG: "AVG", tdist.ReduceOp.PRODUCT: "PRODUCT",
             tdist.ReduceOp.MIN: "MIN", tdist.ReduceOp.MAX: "MAX", tdist.ReduceOp.BAND: "BAND",
             tdist.ReduceOp.BOR: "BOR", tdist.ReduceOp.BXOR: "BXOR"}
    if op not in names:
        raise ValueError(f"reduce op {op} has no simdist equivalent")
    return getattr(ReduceOp, names[op])


def _make_bridge_class() -> type:
    import torch.distributed as tdist

    from . import _api as api

    class BridgeGroup(tdist.ProcessGroup):
        """A torch ProcessGroup whose every op runs on a simdist group (blocking; the work is complete)."""

        def __init__(self, rank: int, size: int, group: Any):
            super().__init__(rank, size)
            self._g = group
            self._name = f"simdist:{group.group_id}"

        @property
        def group_name(self) -> str:
            return self._name

        def _set_group_name(self, name: str) -> None:
            self._name = name

        def getBackendName(self) -> str:  # noqa: N802 - torch's name
            return "simdist"

        def _global(self, group_rank: int) -> int:
            return self._g.ranks[group_rank]

        def allreduce(self, tensors, opts=None):
            for t in tensors:
                api.all_reduce(t, op=_reduce_op(opts), group=self._g)
            return _done(tensors)

        def allreduce_coalesced(self, tensors, opts=None):
            return self.allreduce(tensors, opts)

        def broadcast(self, tensors, opts):
            for t in tensors:
                api.broadcast(t, src=self._global(opts.rootRank), group=self._g)
            return _done(tensors)

        def reduce(self, tensors, opts):
            for t in tensors:
                api.reduce(t, dst=self._global(opts.rootRank), op=_reduce_op(opts), group=self._g)
            return _done(tensors)

        def allgather(self, output_lists, inputs, opts=None):
            for outs, x in zip(output_lists, inputs):
                api.all_gather(outs, x, group=self._g)
            return _done(output_lists)

        def _allgather_base(self, output, input, opts=None):
            api.all_gather_into_tensor(output, input, group=self._g)
            return _done([output])

        all_gather_into_tensor = _allgather_base

        def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
            for o, x in zip(outputs, inputs):
                api.all_gather_into_tensor(o, x, group=self._g)
            return _done(outputs)

        def reduce_scatter(self, outputs, input_lists, opts=None):
            for o, xs in zip(outputs, input_lists):
                api.reduce_scatter(o, xs, op=_reduce_op(opts), group=self._g)
            return _done(outputs)

        def _reduce_scatter_base(self, output, input, opts=None):
            api.reduce_scatter_tensor(output, input, op=_reduce_op(opts), group=self._g)
            return _done([output])

        reduce_scatter_tensor = _reduce_scatter_base

        def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
            for o, x in zip(outputs, inputs):
                api.reduce_scatter_tensor(o, x, op=_reduce_op(opts), group=self._g)
            return _done(outputs)

        def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
            api.all_to_all_single(output, input, output_split_sizes or None, input_split_sizes or None,
                                  group=self._g)
            return _done([output])

        all_to_all_single = alltoall_base

        def alltoall(self, outputs, inputs, opts=None):
            api.all_to_all(outputs, inputs, group=self._g)
            return _done(outputs)

        def gather(self, output_lists, inputs, opts):
            dst = self._global(opts.rootRank)
            for outs, x in zip(output_lists or [None] * len(inputs), inputs):
                api.gather(x, outs if self.rank() == opts.rootRank else None, dst=dst, group=self._g)
            return _done(output_lists)

        def scatter(self, outputs, input_lists, opts):
            src = self._global(opts.rootRank)
            for o, xs in zip(outputs, input_lists or [None] * len(outputs)):
                api.scatter(o, xs if self.rank() == opts.rootRank else None, src=src, group=self._g)
            return _done(outputs)

        def barrier(self, opts=None):
            api.barrier(group=self._g)
            return _done([])

        def send(self, tensors, dst, tag):
            for t in tensors:
                api.send(t, self._global(dst), group=self._g, tag=tag)
            return _done(tensors)

        def recv(self, tensors, src, tag):
            for t in tensors:
                api.recv(t, self._global(src), group=self._g, tag=tag)
            return _done(tensors)

        def recv_anysource(self, tensors, tag):
            src = [api.recv(t, None, group=self._g, tag=tag) for t in tensors]
            return _AnySourceWork(tensors, self._g.group_rank(src[-1]) if src else -1)

    class _AnySourceWork(tdist.Work):
        """A completed receive from any source: torch asks it which rank sent (``_source_rank``)."""

        def __init__(self, tensors: list, source: int):
            super().__init__()
            self._tensors, self._source = tensors, source

        def wait(self, timeout=None):
            return True

        def is_completed(self):
            return True

        def _source_rank(self):
            return self._source

        source_rank = _source_rank

        def get_future(self):
            fut = torch.futures.Future()
            fut.set_result(self._tensors)
            return fut

    return BridgeGroup


BridgeGroup: Any = None


def _creator(opts: Any, backend_options: Any = None) -> Any:
    """torch's backend factory (extended API): the bridge to the simdist group of the same global ranks."""
    from ._world import current_world

    world = current_world()
    ranks = list(getattr(opts, "global_ranks_in_group", None) or range(opts.group_size))
    group = _lookup_group(world, ranks)
    return BridgeGroup(opts.group_rank, opts.group_size, group)


def _lookup_group(world: Any, ranks: list[int]) -> Any:
    if len(ranks) == world.size and ranks == sorted(ranks):
        return world.default_group
    pending = _state["new_groups"].get(threading.get_ident(), {})
    group = pending.pop(tuple(sorted(ranks)), None)
    if group is None:
        raise RuntimeError(f"no simdist group for ranks {ranks}: create it with torch.distributed.new_group")
    return group


# -- install / uninstall ----------------------------------------------------------------------------------


def install(engine: Any) -> None:
    """Make torch.distributed per rank thread and route it to simdist, for the simulation of ``engine``."""
    global BridgeGroup, _registered
    import torch.distributed as tdist

    reason = supported()
    if reason is not None:
        _state["unsupported"] = (tdist, tdist.init_process_group)
        tdist.init_process_group = _refuse(reason)
        return
    from torch.distributed import distributed_c10d as c10d

    if BridgeGroup is None:
        BridgeGroup = _make_bridge_class()
    if not _registered:
        tdist.Backend.register_backend("simdist", _creator, extended_api=True, devices=["cpu"])
        _registered = True
    _state.update(
        c10d=c10d, world=c10d._world, init=c10d.init_process_group, new_group=c10d.new_group,
        destroy=c10d.destroy_process_group,
        multithreading=torch._C._is_multithreading_enabled(), new_groups={},
        store=tdist.HashStore(), rank_world=_rank_world_class(),
    )
    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    c10d._world = _WorldProxy(c10d._world)
    torch._C._set_multithreading_enabled(False)
    for module in (tdist, c10d):
        module.init_process_group = _init_process_group
        module.new_group = _new_group
        module.destroy_process_group = _destroy_process_group


def uninstall(engine: Any) -> None:
    """Undo :func:`install`."""
    if "unsupported" in _state:
        tdist, init = _state.pop("unsupported")
        tdist.init_process_group = init
        return
    if "c10d" not in _state:
        return
    import torch.distributed as tdist

    c10d = _state["c10d"]
    for module in (tdist, c10d):
        module.init_process_group = _state["init"]
        module.new_group = _state["new_group"]
        module.destroy_process_group = _state["destroy"]
    c10d._world = _state["world"]
    torch._C._distributed_c10d._set_thread_isolation_mode(False)
    torch._C._set_multithreading_enabled(_state["multithreading"])
    _state.clear()


def enter_rank() -> None:
    """Give the calling rank thread its own torch world."""
    if "c10d" in _state:
        _state["c10d"]._world._local.world = _state["rank_world"]()


def leave_rank() -> None:
    if "c10d" in _state:
        _state["c10d"]._world._local.world = None
        _state["new_groups"].pop(threading.get_ident(), None)


def _in_rank() -> bool:
    return "c10d" in _state and getattr(_state["c10d"]._world._local, "world", None) is not None


def _init_process_group(backend: Any = None, init_method: Any = None, timeout: Any = None, world_size: int = -1,
                        rank: int = -1, store: Any = None, *args: Any, **kwargs: Any) -> None:
    """torch's ``init_process_group`` on a rank thread: this rank of the simulation, whatever the arguments."""
    if not _in_rank():
        return _state["init"](backend, init_method, timeout, world_size, rank, store, *args, **kwargs)
    import torch.distributed as tdist

    from . import _api as api

    api.init_process_group("sim", timeout=timeout) if timeout is not None else api.init_process_group("sim")
    r, n = api.get_rank(), api.get_world_size()
    _state["init"]("simdist", store=tdist.PrefixStore(f"rank{r}", _state["store"]), rank=r, world_size=n)


def _new_group(ranks: Any = None, *args: Any, **kwargs: Any) -> Any:
    """torch's ``new_group`` on a rank thread: the simdist group first (every rank calls both), then torch's."""
    if not _in_rank():
        return _state["new_group"](ranks, *args, **kwargs)
    from . import _api as api

    members = sorted(ranks) if ranks is not None else list(range(api.get_world_size()))
    group = api.new_group(members)
    if group is not None and api.get_rank(group) >= 0:
        _state["new_groups"].setdefault(threading.get_ident(), {})[tuple(members)] = group
    kwargs.pop("backend", None)
    return _state["new_group"](ranks, *args, backend="simdist", **kwargs)


def _destroy_process_group(group: Any = None) -> None:
    """torch's ``destroy_process_group`` on a rank thread: torch's groups, then the simdist world (for ``None``)."""
    _state["destroy"](group)
    if group is None and _in_rank():
        from . import _api as api

        if api.is_initialized():
            api.destroy_process_group()


def _refuse(reason: str) -> Any:
    def init_process_group(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"{reason}; torch.distributed code cannot run on simulated ranks with it "
                           "(simdist's own API, `import simdist as dist`, still can)")

    return init_process_group
