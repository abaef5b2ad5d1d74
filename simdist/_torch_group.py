"""The process group torch sees on a simulated rank: every op torch can call, forwarded to simdist.

:func:`bridge_classes` builds (once, on first use, so importing simdist never imports
``torch.distributed``) two classes:

- ``BridgeGroup``, a Python ``torch.distributed.ProcessGroup`` that starts each op on the
  rank's simdist group with ``async_op=True`` and returns at once;
- ``BridgeWork``, a Python ``torch.distributed.Work`` around the simdist works of one op:
  it completes at ``wait()`` (a scheduling point of the simulator), as on gloo, so sends
  posted before receives never wait on each other. ``get_future()`` waits first and
  returns a completed future holding the op's output tensors: torch's DDP reads that
  value and never calls ``wait()``.
"""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any

import torch

__all__ = ["bridge_classes"]

_REDUCE_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")


def _reduction(opts: Any, what: str) -> tuple[Any, Any]:
    """simdist's ReduceOp for torch's ``opts.reduceOp``, and the factor of a PREMUL_SUM (else ``None``).

    NCCL's PREMUL_SUM (which FSDP2 uses for a custom gradient divide factor) multiplies each
    input by its factor and sums: the bridge scales the inputs, then sums.
    """
    import torch.distributed as tdist

    from ._reduce_op import ReduceOp

    reduce_op = getattr(opts, "reduceOp", None)
    op = getattr(reduce_op, "op", tdist.ReduceOp.SUM)
    if op == tdist.ReduceOp.PREMUL_SUM:
        return ReduceOp.SUM, reduce_op.__getstate__()[1]
    for name in _REDUCE_OPS:
        if op == getattr(tdist.ReduceOp, name):
            return getattr(ReduceOp, name), None
    raise ValueError(f"simdist: {what} with reduce op {op} is not simulated; use one of {', '.join(_REDUCE_OPS)}")


def _seconds(timeout: Any) -> float | None:
    if isinstance(timeout, timedelta):
        return timeout.total_seconds() or None
    return timeout or None


@functools.cache
def bridge_classes() -> tuple[type, type]:
    """``(BridgeGroup, BridgeWork)``, made on first use."""
    import torch.distributed as tdist

    from . import _api as api

    class BridgeWork(tdist.Work):
        """One op's simdist works as a torch Work: complete once every one of them is (at ``wait()``)."""

        def __init__(self, works: list, outputs: Any, source: Any = None):
            super().__init__()
            self._works = [w for w in works if w is not None]
            self._outputs = outputs
            self._source = source  # a receive from any source: the simdist work that knows the sender
            self._error: BaseException | None = None

        def wait(self, timeout: Any = None) -> bool:
            try:
                for w in self._works:
                    w.wait(_seconds(timeout))
            except BaseException as exc:
                self._error = exc
                raise
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
            self.wait()
            fut = torch.futures.Future()
            fut.set_result(self._outputs)
            return fut

        def synchronize(self) -> None:
            self.wait()

        def _source_rank(self) -> int:
            self.wait()
            return self._source[0].group_rank(self._source[1].source_rank())

        source_rank = _source_rank

    class BridgeGroup(tdist.ProcessGroup):
        """A torch ProcessGroup whose every op is started on the simdist group ``group`` of this rank."""

        def __init__(self, rank: int, size: int, group: Any, backend_name: str = "gloo"):
            super().__init__(rank, size)
            self._g = group
            self._name = f"simdist:{group.group_id}"
            self._desc = "undefined"
            self._backend_name = backend_name
            self._coalescing: list | None = None
            self.bound_device_id = None

        # -- identity, as torch's C++ groups answer it --------------------------------------------------

        @property
        def group_name(self) -> str:
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

        def _start(self, works: list, outputs: Any, source: Any = None) -> Any:
            work = BridgeWork(works, outputs, source)
            if self._coalescing is not None:
                self._coalescing.append(work)
            return work

        # -- coalescing (torch's _coalescing_manager): ops start one by one, one work waits for all ---------

        def _start_coalescing(self, device: Any = None) -> None:
            self._coalescing = []

        def _end_coalescing(self, device: Any = None) -> Any:
            started, self._coalescing = self._coalescing or [], None
            return BridgeWork(started, [t for w in started for t in w.result()])

        # -- collectives ------------------------------------------------------------------------------------

        def allreduce(self, tensors, opts=None):
            op, factor = _reduction(opts, "all_reduce")
            for t in tensors if factor is not None else ():
                t.mul_(factor)
            return self._start([api.all_reduce(t, op=op, group=self._g, async_op=True) for t in tensors], tensors)

        allreduce_coalesced = allreduce

        def broadcast(self, tensors, opts):
            src = self._global(opts.rootRank)
            return self._start([api.broadcast(t, src=src, group=self._g, async_op=True) for t in tensors], tensors)

        def reduce(self, tensors, opts):
            dst, (op, factor) = self._global(opts.rootRank), _reduction(opts, "reduce")
            for t in tensors if factor is not None else ():
                t.mul_(factor)
            return self._start(
                [api.reduce(t, dst=dst, op=op, group=self._g, async_op=True) for t in tensors], tensors
            )

        def allgather(self, output_lists, inputs, opts=None):
            works = [api.all_gather(outs, x, group=self._g, async_op=True) for outs, x in zip(output_lists, inputs)]
            return self._start(works, output_lists)

        allgather_coalesced = allgather

        def _allgather_base(self, output, input, opts=None):
            return self._start([api.all_gather_into_tensor(output, input, group=self._g, async_op=True)], [output])

        all_gather_single = all_gather_into_tensor = _allgather_base

        def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
            works = [api.all_gather_into_tensor(o, x, group=self._g, async_op=True) for o, x in zip(outputs, inputs)]
            return self._start(works, outputs)

        all_gather_single_coalesced = allgather_into_tensor_coalesced

        def reduce_scatter(self, outputs, input_lists, opts=None):
            op, factor = _reduction(opts, "reduce_scatter")
            if factor is not None:
                input_lists = [[x * factor for x in xs] for xs in input_lists]
            works = [api.reduce_scatter(o, xs, op=op, group=self._g, async_op=True)
                     for o, xs in zip(outputs, input_lists)]
            return self._start(works, outputs)

        def _reduce_scatter_base(self, output, input, opts=None):
            op, factor = _reduction(opts, "reduce_scatter_tensor")
            input = input if factor is None else input * factor
            return self._start(
                [api.reduce_scatter_tensor(output, input, op=op, group=self._g, async_op=True)], [output]
            )

        reduce_scatter_single = reduce_scatter_tensor = _reduce_scatter_base

        def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
            op, factor = _reduction(opts, "reduce_scatter_tensor")
            if factor is not None:
                inputs = [x * factor for x in inputs]
            works = [api.reduce_scatter_tensor(o, x, op=op, group=self._g, async_op=True)
                     for o, x in zip(outputs, inputs)]
            return self._start(works, outputs)

        reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

        def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
            work = api.all_to_all_single(output, input, list(output_split_sizes) or None,
                                         list(input_split_sizes) or None, group=self._g, async_op=True)
            return self._start([work], [output])

        all_to_all_single = alltoall_base

        def alltoall(self, outputs, inputs, opts=None):
            return self._start([api.all_to_all(outputs, inputs, group=self._g, async_op=True)], outputs)

        def gather(self, output_lists, inputs, opts):
            dst, root = self._global(opts.rootRank), self.rank() == opts.rootRank
            works = [api.gather(x, outs if root else None, dst=dst, group=self._g, async_op=True)
                     for outs, x in zip(output_lists or [None] * len(inputs), inputs)]
            return self._start(works, output_lists)

        def _gather_base(self, output, input, opts):
            """torch 2.14's ``gather_into_tensor``/``gather_single``: the root's ``output`` holds every input."""
            root = self.rank() == opts.rootRank
            parts = list(output.chunk(self.size())) if root else None
            work = api.gather(input, parts, dst=self._global(opts.rootRank), group=self._g, async_op=True)
            return self._start([work], [output])

        gather_single = gather_into_tensor = _gather_base

        def scatter(self, outputs, input_lists, opts):
            src, root = self._global(opts.rootRank), self.rank() == opts.rootRank
            works = [api.scatter(o, xs if root else None, src=src, group=self._g, async_op=True)
                     for o, xs in zip(outputs, input_lists or [None] * len(outputs))]
            return self._start(works, outputs)

        def barrier(self, opts=None):
            return self._start([api.barrier(group=self._g, async_op=True)], [])

        def monitored_barrier(self, timeout=None, wait_all_ranks=False):
            """A barrier; a rank that never arrives is a deadlock report naming it, never a hang."""
            api.barrier(group=self._g)

        # -- point to point: posted at once, complete at wait() ------------------------------------------

        def send(self, tensors, dst, tag):
            works = [api.isend(t, group=self._g, group_dst=dst, tag=tag) for t in tensors]
            return self._start(works, tensors)

        def recv(self, tensors, src, tag):
            works = [api.irecv(t, group=self._g, group_src=src, tag=tag) for t in tensors]
            return self._start(works, tensors)

        def recv_anysource(self, tensors, tag):
            works = [api.irecv(t, None, group=self._g, tag=tag) for t in tensors]
            return self._start(works, tensors, source=(self._g, works[-1]) if works else None)

        # -- life cycle ---------------------------------------------------------------------------------

        def shutdown(self) -> None:
            """torch's ``destroy_process_group`` calls this for each group it destroys: destroy the simdist group."""
            if not api.is_initialized() or getattr(self._g, "_simdist_destroyed", False):
                return
            if self._g.group_id == 0:  # the default group
                api.destroy_process_group()
            else:
                api.destroy_process_group(self._g)

        def abort(self) -> None:
            pass

    return BridgeGroup, BridgeWork
