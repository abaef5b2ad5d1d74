"""The process group torch sees on a simulated rank: every op torch can call, forwarded to simdist.

:func:`bridge_classes` builds (once, on first use, so importing simdist never imports
``torch.distributed``) two classes:

- ``BridgeGroup``, a Python ``torch.distributed.ProcessGroup`` that starts each op on the
  rank's simdist group with ``async_op=True`` and returns at once;
- ``BridgeWork``, a Python ``torch.distributed.Work`` around the simdist works of one op:
  it completes at ``wait()`` (a scheduling point of the simulator), as on gloo, so sends
  posted before receives never wait on each other. ``get_future()`` gives a future holding
  the op's output tensors (torch's DDP reads that value and never calls ``wait()``): on a
  simulated rank it waits first; in a real process a thread completes it.
"""

from __future__ import annotations

import functools
import threading
from collections import deque
from typing import Any

import torch

from ..core._checks import timeout_seconds
from ..core._errors import DistTimeoutError

__all__ = ["bridge_classes", "hide_from_compiler", "refuse_on_started_thread", "STARTED_BY_RANK"]

_MONITORED = 2**40
"""The tag of monitored_barrier's messages: beyond the 32-bit tags torch's backends take, so no user's."""

_REDUCE_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")


def _reduction(opts: Any, what: str) -> tuple[Any, Any]:
    """simdist's ReduceOp for torch's ``opts.reduceOp``, and the factor of a PREMUL_SUM (else ``None``).

    NCCL's PREMUL_SUM (which FSDP2 uses for a custom gradient divide factor) multiplies each
    input by its factor and sums: the bridge scales the inputs, then sums.
    """
    import torch.distributed as tdist

    from ..core._reduce_op import ReduceOp

    reduce_op = getattr(opts, "reduceOp", None)
    op = getattr(reduce_op, "op", tdist.ReduceOp.SUM)
    if op == tdist.ReduceOp.PREMUL_SUM and reduce_op is not None:
        return ReduceOp.SUM, reduce_op.__getstate__()[1]
    for name in _REDUCE_OPS:
        if op == getattr(tdist.ReduceOp, name):
            return getattr(ReduceOp, name), None
    raise ValueError(f"simdist: {what} with reduce op {op} is not simulated; use one of {', '.join(_REDUCE_OPS)}")


def _scaled(t: Any, factor: Any, copy: bool = False) -> Any:
    """``t`` times a PREMUL_SUM factor: in place for an op's own buffer, else a copy; ``t`` itself without one."""
    if factor is None:
        return t
    return t * factor if copy else t.mul_(factor)


def _in_process_world() -> bool:
    """Whether the calling rank is a real process (its works complete in the background), not a simulated rank."""
    from ..core._world import current_world

    world = current_world()
    return world is not None and world.process_world


class _Keeper:
    """Keeps a group's works alive (their Python objects) while torch's C++ code may still call them.

    torch's C++ code (DDP's reducer with ``join()``, say) can hold a work it was handed from
    Python as a C++ pointer alone; once the Python object is gone, its ``wait`` and
    ``get_future`` fall back to C++ defaults, and ``wait`` then blocks forever. A work stays
    alive until it has been waited for, and then while it is among the group's last
    ``RECENT`` waited works (C++ asks for a work's future right after waiting for it).
    """

    RECENT = 16

    def __init__(self) -> None:
        self.pending: dict[int, Any] = {}
        self.recent: deque = deque(maxlen=self.RECENT)

    def started(self, work: Any) -> None:
        self.pending[id(work)] = work

    def waited(self, work: Any) -> None:
        if self.pending.pop(id(work), None) is not None:
            self.recent.append(work)


@functools.cache
def bridge_classes() -> tuple[type, type]:
    """``(BridgeGroup, BridgeWork)``, made on first use."""
    import torch.distributed as tdist

    from .. import api
    from . import profiler

    class BridgeWork(tdist.Work):
        """One op's simdist works as a torch Work: complete once every one of them is (at ``wait()``)."""

        def __init__(self, works: list, outputs: Any, keeper: "_Keeper", source: Any = None):
            super().__init__()
            self._works = [w for w in works if w is not None]
            self._outputs = outputs
            self._source = source  # a receive from any source: the simdist work that knows the sender
            self._error: BaseException | None = None
            self._keeper = keeper
            self._lock = threading.Lock()
            keeper.started(self)

        def wait(self, timeout: Any = None) -> bool:
            with self._lock:  # the thread of get_future() and the program may both wait
                try:
                    for w in self._works:
                        w.wait(timeout_seconds(timeout, "timeout", default=None) or None)  # 0: no timeout, as torch's
                except BaseException as exc:
                    self._error = exc
                    raise
                finally:
                    self._keeper.waited(self)
            return True

        def is_completed(self) -> bool:
            return all(w.is_completed() for w in self._works)

        def is_success(self) -> bool:
            return self.is_completed() and self._error is None

        def exception(self) -> Any:
            return self._error

        def result(self) -> list:
            return list(self._outputs)

        def get_future(self) -> Any:
            """A future holding the op's output tensors once it completes.

            In a real process (the socket backend) it returns at once, as gloo's does, and a thread
            completes it (or fails it with the op's error) when the op completes. On a simulated
            rank it waits first: the op completes at ``wait()``, a scheduling point of this rank,
            and torch's DDP waits on the future in C++, where the simulator cannot step in.
            """
            fut: torch.futures.Future = torch.futures.Future()
            if not _in_process_world():
                self.wait()
                fut.set_result(self._outputs)
                return fut

            def complete() -> None:
                try:
                    self.wait()
                except BaseException:  # noqa: BLE001 - kept in self._error, raised by the future's callback
                    pass
                done.set_result(None)

            # The op's error must fail the future in C++ (torch's DDP reads the value there): a Python
            # ``set_exception`` would store the exception as the value. A callback that raises does fail it.
            done: torch.futures.Future = torch.futures.Future()
            threading.Thread(target=complete, name="simdist-work-future", daemon=True).start()
            return done.then(self._outputs_or_error)

        def _outputs_or_error(self, _: Any) -> list:
            if self._error is not None:
                raise self._error
            return self._outputs

        def synchronize(self) -> None:
            self.wait()

        def _source_rank(self) -> int:
            self.wait()
            return self._source[0].group_rank(self._source[1].source_rank())

        source_rank = _source_rank

    class BridgeGroup(tdist.ProcessGroup):
        """A torch ProcessGroup whose every op is started on the simdist group ``group`` of this rank."""

        def __init__(self, rank: int, size: int, group: Any, backend_name: str = "gloo"):
            super().__init__(rank, size)  # type: ignore[call-arg]  # torch's (rank, size) overload
            self._g = group
            self._name = f"simdist:{group.group_id}"
            self._desc = "undefined"
            self._backend_name = backend_name
            self._coalescing: list | None = None
            self._keeper = _Keeper()
            self.bound_device_id = None

        def __repr__(self) -> str:
            """Which rank's group this is: torch's errors show it ("Group <...> is not registered")."""
            return f"<process group {self._name!r} of simulated rank {self._g.ranks[self.rank()]}, ranks {list(self._g.ranks)}>"

        # -- identity, as torch's C++ groups answer it --------------------------------------------------

        @property
        def group_name(self) -> str:  # type: ignore[override]  # torch's C++ groups answer a plain str too
            return self._name

        def _set_group_name(self, name: str) -> None:
            self._name = name

        @property
        def group_desc(self) -> str:
            return self._desc

        def _set_group_desc(self, desc: str) -> None:
            self._desc = desc

        def getBackendName(self) -> str:  # noqa: N802 - torch's name
            return "simdist"  # torch's C++ side (DDP's logger) takes "gloo"/"nccl" for its own backend classes

        _get_backend_name = name = getBackendName

        def _set_backend_name(self, name: str) -> None:
            """The backend the program asked for (``"gloo"``, ``"nccl"``), which decides the device types."""
            self._backend_name = name

        @property
        def _device_types(self) -> list:
            """The device types torch's own backend of that name would serve here (CUDA where it is available)."""
            from torch.distributed.distributed_c10d import Backend, BackendConfig

            devices = BackendConfig(Backend(self._backend_name)).get_device_backend_map()
            usable = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)
            return [torch.device(d) for d in devices if d in usable] or [torch.device("cpu")]

        def _get_backend(self, device: Any) -> Any:
            return self  # one group serves every device type

        def _has_hooks(self) -> bool:
            return False

        def supports_tensor_alloc(self, device: Any) -> bool:
            return False

        supports_splitting = False
        supports_coalescing = False

        def _global(self, group_rank: int) -> int:
            return self._g.ranks[group_rank]

        def _record(self, op: str, inputs: list) -> None:
            """Record ``op`` for torch's profiler as torch's own backend names it (while a rank profiles); refused on
            a thread a simulated rank started."""
            if getattr(threading.current_thread(), STARTED_BY_RANK, False):
                refuse_on_started_thread(f"torch.distributed {op}")
            profiler.record_op(f"{self._backend_name}:{op}", inputs)

        def _start(self, works: list, outputs: Any, source: Any = None) -> Any:
            work = BridgeWork(works, outputs, self._keeper, source)
            if self._coalescing is not None:
                self._coalescing.append(work)
            return work

        # -- coalescing (torch's _coalescing_manager): ops start one by one, one work waits for all ---------

        def _start_coalescing(self, device: Any = None) -> None:
            self._coalescing = []

        def _end_coalescing(self, device: Any = None) -> Any:
            started, self._coalescing = self._coalescing or [], None
            return BridgeWork(started, [t for w in started for t in w.result()], self._keeper)

        # -- collectives ------------------------------------------------------------------------------------

        def allreduce(self, tensors, opts=None):
            self._record("all_reduce", tensors)
            op, factor = _reduction(opts, "all_reduce")
            if any(t.layout == torch.sparse_coo for t in tensors):
                return self._start(self._sparse_sum(tensors, op), tensors)
            works = [api.all_reduce(_scaled(t, factor), op=op, group=self._g, async_op=True) for t in tensors]
            return self._start(works, tensors)

        def _sparse_sum(self, tensors: list, op: Any) -> list:
            """gloo's sparse all_reduce: each sparse COO tensor becomes the sum of every rank's (nnz may differ)."""
            from ..api import all_gather_object
            from ..core._reduce_op import ReduceOp

            if op is not ReduceOp.SUM:
                raise ValueError(f"simdist: all_reduce of sparse tensors takes ReduceOp.SUM only (as gloo), not {op}")
            for t in tensors:
                parts: list = [None] * self.size()
                all_gather_object(parts, t.coalesce(), group=self._g)
                t.copy_(torch.stack(parts).sum(0).coalesce() if len(parts) > 1 else parts[0])
            return []

        allreduce_coalesced = allreduce

        def broadcast(self, tensors, opts):
            self._record("broadcast", tensors)
            src = self._global(opts.rootRank)
            works = [api.broadcast(t, src=src, group=self._g, async_op=True) for t in tensors]
            return self._start(works, tensors)

        def reduce(self, tensors, opts):
            self._record("reduce", tensors)
            dst, (op, factor) = self._global(opts.rootRank), _reduction(opts, "reduce")
            works = [api.reduce(_scaled(t, factor), dst=dst, op=op, group=self._g, async_op=True) for t in tensors]
            return self._start(works, tensors)

        def allgather(self, output_lists, inputs, opts=None):
            self._record("all_gather", inputs)
            works = [api.all_gather(outs, x, group=self._g, async_op=True) for outs, x in zip(output_lists, inputs)]
            return self._start(works, output_lists)

        def allgather_coalesced(self, output_lists, inputs, opts=None):
            """``output_lists[r][i]`` receives rank r's ``inputs[i]``."""
            self._record("all_gather", inputs)
            works = [
                api.all_gather([outs[i] for outs in output_lists], x, group=self._g, async_op=True)
                for i, x in enumerate(inputs)
            ]
            return self._start(works, output_lists)

        def _allgather_base(self, output, input, opts=None):
            self._record("all_gather", [input])
            work = api.all_gather_into_tensor(output, input, group=self._g, async_op=True)
            return self._start([work], [output])

        all_gather_single = all_gather_into_tensor = _allgather_base

        def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
            self._record("all_gather", inputs)
            works = [api.all_gather_into_tensor(o, x, group=self._g, async_op=True) for o, x in zip(outputs, inputs)]
            return self._start(works, outputs)

        all_gather_single_coalesced = allgather_into_tensor_coalesced

        def reduce_scatter(self, outputs, input_lists, opts=None):
            self._record("reduce_scatter", [x for xs in input_lists for x in xs])
            op, factor = _reduction(opts, "reduce_scatter")
            works = [
                api.reduce_scatter(o, [_scaled(x, factor, copy=True) for x in xs], op=op, group=self._g, async_op=True)
                for o, xs in zip(outputs, input_lists)
            ]
            return self._start(works, outputs)

        def _reduce_scatter_base(self, output, input, opts=None):
            self._record("all_reduce", [input])  # gloo's own title for it
            op, factor = _reduction(opts, "reduce_scatter_tensor")
            work = api.reduce_scatter_tensor(
                output, _scaled(input, factor, copy=True), op=op, group=self._g, async_op=True
            )
            return self._start([work], [output])

        reduce_scatter_single = reduce_scatter_tensor = _reduce_scatter_base

        def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
            self._record("reduce_scatter_tensor_coalesced", inputs)
            op, factor = _reduction(opts, "reduce_scatter_tensor")
            works = [
                api.reduce_scatter_tensor(o, _scaled(x, factor, copy=True), op=op, group=self._g, async_op=True)
                for o, x in zip(outputs, inputs)
            ]
            return self._start(works, outputs)

        reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

        def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
            self._record("all_to_all", [input])
            work = api.all_to_all_single(
                output,
                input,
                list(output_split_sizes) or None,
                list(input_split_sizes) or None,
                group=self._g,
                async_op=True,
            )
            return self._start([work], [output])

        all_to_all_single = alltoall_base

        def alltoall(self, outputs, inputs, opts=None):
            self._record("all_to_all", inputs)
            return self._start([api.all_to_all(outputs, inputs, group=self._g, async_op=True)], outputs)

        def gather(self, output_lists, inputs, opts):
            self._record("gather", inputs)
            dst, root = self._global(opts.rootRank), self.rank() == opts.rootRank
            works = [
                api.gather(x, outs if root else None, dst=dst, group=self._g, async_op=True)
                for outs, x in zip(output_lists or [None] * len(inputs), inputs)
            ]
            return self._start(works, output_lists)

        def _gather_base(self, output, input, opts):
            self._record("gather", [input])
            """torch 2.14's ``gather_into_tensor``/``gather_single``: the root's ``output`` holds every input."""
            root = self.rank() == opts.rootRank
            parts = list(output.chunk(self.size())) if root else None
            work = api.gather(input, parts, dst=self._global(opts.rootRank), group=self._g, async_op=True)
            return self._start([work], [output])

        gather_single = gather_into_tensor = _gather_base

        def scatter(self, outputs, input_lists, opts):
            self._record("scatter", [x for xs in input_lists or () for x in xs])
            src, root = self._global(opts.rootRank), self.rank() == opts.rootRank
            works = [
                api.scatter(o, xs if root else None, src=src, group=self._g, async_op=True)
                for o, xs in zip(outputs, input_lists or [None] * len(outputs))
            ]
            return self._start(works, outputs)

        def barrier(self, opts=None):
            self._record("barrier", [])
            return self._start([api.barrier(group=self._g, async_op=True)], [])

        def monitored_barrier(self, timeout=None, wait_all_ranks=False):
            """gloo's monitored barrier, its timeout in virtual time: group rank 0 waits for every other rank.

            Rank 0 waits at most ``timeout`` for each other rank in turn and raises gloo's error
            naming the first one missing (every one missing with ``wait_all_ranks``); the others
            wait as long for rank 0's answer. A wait times out when no rank can run any more, or
            when what it waits for completes later than its timeout.
            """
            seconds = timeout_seconds(timeout, "timeout", default=0.0)  # torch passes its group timeout
            me, token = self.rank(), torch.zeros(1)
            if me != 0:
                sent = api.isend(token, group=self._g, group_dst=0, tag=_MONITORED)
                try:
                    api.irecv(torch.zeros(1), group=self._g, group_src=0, tag=_MONITORED).wait(seconds)
                except DistTimeoutError:
                    raise RuntimeError(
                        f"[Rank {me}]: Rank {me} successfully reached monitoredBarrier, but received errors while "
                        "waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank."
                    ) from None
                sent.wait()
                return
            if seconds <= 0:
                raise RuntimeError("[Rank 0]: Rank 0 timed out in monitoredBarrier after 0 ms")
            missing = []
            for r in range(1, self.size()):
                try:
                    api.irecv(torch.zeros(1), group=self._g, group_src=r, tag=_MONITORED).wait(seconds)
                except DistTimeoutError:
                    missing.append(r)
                    if not wait_all_ranks:
                        break
            ms = int(seconds * 1000)
            if len(missing) > 1 or (missing and wait_all_ranks):
                ranks = ", ".join(str(r) for r in missing)
                raise RuntimeError(f"[Rank 0]: Ranks {ranks} failed to pass monitoredBarrier in {ms} ms")
            if missing:
                raise RuntimeError(f"[Rank 0]: Rank {missing[0]} failed to pass monitoredBarrier in {ms} ms")
            for work in [api.isend(token, group=self._g, group_dst=r, tag=_MONITORED) for r in range(1, self.size())]:
                work.wait()

        # -- point to point: posted at once, complete at wait() ------------------------------------------

        def send(self, tensors, dst, tag):
            self._record("send", tensors)
            works = [api.isend(t, group=self._g, group_dst=dst, tag=tag) for t in tensors]
            return self._start(works, tensors)

        def recv(self, tensors, src, tag):
            self._record("recv", tensors)
            works = [api.irecv(t, group=self._g, group_src=src, tag=tag) for t in tensors]
            return self._start(works, tensors)

        def recv_anysource(self, tensors, tag):
            self._record("recvAnySource", tensors)
            works = [api.irecv(t, None, group=self._g, tag=tag) for t in tensors]
            return self._start(works, tensors, source=(self._g, works[-1]) if works else None)

        # -- life cycle ---------------------------------------------------------------------------------

        def shutdown(self) -> None:
            """torch's ``destroy_process_group`` calls this for each group it destroys: destroy the simdist group."""
            self._keeper = _Keeper()
            if not api.is_initialized() or self._g.destroyed:
                return
            if self._g.group_id == 0:  # the default group
                api.destroy_process_group()
            else:
                api.destroy_process_group(self._g)

        def abort(self) -> None:
            pass

    return BridgeGroup, BridgeWork


STARTED_BY_RANK = "_simdist_started_by_rank"
"""The attribute that marks a ``threading.Thread`` a simulated rank started (set by :mod:`.ranks`)."""


def refuse_on_started_thread(op: str) -> None:
    """Raise a ``RuntimeError`` naming ``op``: the calling thread is one a simulated rank started, and the simulator
    schedules each rank's own thread only."""
    raise RuntimeError(
        f"simdist: {op} called from thread {threading.current_thread().name!r}, which a simulated rank started: "
        "the simulator schedules each rank's own thread only, so communication from other threads is not "
        "simulated. Make the call on the rank's thread (torch.distributed.checkpoint.save rather than "
        "async_save), or run on real processes (simdist run --backend socket, torchrun)"
    )


@functools.cache
def hide_from_compiler() -> None:
    """Make ``torch.compile`` run the bridge's groups and works as it runs torch's C++ ones: called, not traced.

    Dynamo would otherwise trace into their Python methods (a ``broadcast`` of DDP's buffers
    inside a compiled ``DistributedDataParallel``) and fail on torch's opaque objects. Done once,
    when a rank first compiles (importing the compiler costs a second, so not before).
    """
    import torch._dynamo

    for cls in bridge_classes():
        for name, member in list(vars(cls).items()):
            if callable(member) and not name.startswith("__"):
                setattr(cls, name, torch._dynamo.disable(member))
