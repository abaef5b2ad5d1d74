"""``DistributedDataParallel``: torch's data-parallel wrapper, on every simdist backend.

How it works, in the order things happen:

1. Construction checks that every rank holds parameters of the same names, shapes and
   dtypes, then broadcasts parameters and buffers from group rank 0.
2. Parameters are split into *buckets* in reverse registration order (the order their
   gradients usually become ready), by dtype and device, each up to ``bucket_cap_mb``;
   with the default cap the first bucket holds only 1 MiB, so communication starts early.
   These are the buckets torch's reducer settles on after its first iteration.
3. Each forward (with grad enabled and outside ``no_sync()``) arms one backward pass;
   with ``broadcast_buffers`` the buffers are first broadcast from group rank 0.
4. In backward, a hook per parameter marks it ready once its gradient is accumulated.
   Its gradient is copied into its bucket multiplied by 1 / world size (unless a
   communication hook does the averaging). When every gradient of the next bucket in order
   is ready, the bucket is all-reduced asynchronously (or handed to the hook).
5. At the end of backward every launched bucket is waited for and the averaged values are
   written to ``param.grad`` (with ``gradient_as_bucket_view`` the gradients *are* views
   into the buckets, so nothing is copied).

A bucket that never becomes ready (a parameter unused in the loss) is not launched, and
the next forward raises torch's error, unless ``find_unused_parameters`` marks such
parameters ready in backward. On the simulator each gradient also advances the rank's
virtual clock by a modelled backward cost (``BACKWARD_SECONDS_PER_ELEMENT``), so the trace
shows buckets' all-reduces overlapping the backward pass.
"""

from __future__ import annotations

import os
import warnings
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn

from . import torch_bridge
from .api import all_gather_object, all_reduce, broadcast, get_global_rank, get_rank, get_world_size
from .core._future import Future
from .core._callsite import skip_directory, user_call_site
from .core._reduce_op import ReduceOp
from .core._work import Work
from .core._world import current_world

__all__ = ["DistributedDataParallel", "GradBucket", "bucket_assignment"]

DEFAULT_BUCKET_CAP_MB = 25
FIRST_BUCKET_BYTES = 1024 * 1024  # torch's dist._DEFAULT_FIRST_BUCKET_BYTES
BACKWARD_SECONDS_PER_ELEMENT = 1e-9  # the simulator's modelled cost of producing one gradient element

# DDP's collectives run inside torch's autograd engine: the user's line is the one that called backward()
skip_directory(os.path.dirname(torch.__file__))

_UNFINISHED = (
    "Expected to have finished reduction in the prior iteration before starting a new one. This error "
    "indicates that your module has parameters that were not used in producing loss. You can enable unused "
    "parameter detection by passing the keyword argument `find_unused_parameters=True` to "
    "`DistributedDataParallel`, and by making sure all `forward` function outputs participate in calculating "
    "loss.\nParameters which did not receive grad for rank {rank}: {names}"
)


def bucket_assignment(params: Sequence[torch.Tensor], limits: list[int]) -> list[list[int]]:
    """Indices of ``params`` grouped into buckets, as ``torch.distributed._compute_bucket_assignment_by_size``.

    Tensors are taken in order and kept apart by (dtype, device); a bucket closes once it
    holds at least its limit in bytes. Limits are used in turn, the last one repeating.
    Buckets come out ordered by their first index.
    """
    open_buckets: dict[tuple, list[int]] = {}
    sizes: dict[tuple, int] = {}
    limit_at: dict[tuple, int] = {}
    done: list[list[int]] = []
    for i, p in enumerate(params):
        key = (p.dtype, p.device)
        open_buckets.setdefault(key, []).append(i)
        sizes[key] = sizes.get(key, 0) + p.numel() * p.element_size()
        k = limit_at.setdefault(key, 0)
        if sizes[key] >= limits[k]:
            done.append(open_buckets.pop(key))
            sizes[key] = 0
            limit_at[key] = min(k + 1, len(limits) - 1)
    done.extend(b for b in open_buckets.values() if b)
    return sorted(done, key=min)


class GradBucket:
    """One bucket of gradients, as handed to a communication hook (torch's ``dist.GradBucket``)."""

    def __init__(self, index: int, params: list[nn.Parameter], offsets: list[int], buffer: torch.Tensor, last: bool):
        self._index, self._params, self._offsets, self._buffer, self._last = index, params, offsets, buffer, last

    def index(self) -> int:
        """This bucket's position in reduction order (0 is reduced first)."""
        return self._index

    def buffer(self) -> torch.Tensor:
        """The flat tensor holding every gradient of the bucket."""
        return self._buffer

    def set_buffer(self, buffer: torch.Tensor) -> None:
        self._buffer.copy_(buffer)

    def gradients(self) -> list[torch.Tensor]:
        """Each parameter's gradient, as a view into :meth:`buffer`."""
        return [self._buffer[o : o + p.numel()].view_as(p) for p, o in zip(self._params, self._offsets)]

    def parameters(self) -> list[nn.Parameter]:
        return list(self._params)

    def is_last(self) -> bool:
        """Whether this is the last bucket to be reduced in a backward pass."""
        return self._last


class _Bucket:
    """A bucket's parameters, their offsets in its flat buffer, and this backward's progress."""

    def __init__(self, index: int, params: list[nn.Parameter], last: bool):
        self.params = params
        self.offsets = [0]
        for p in params[:-1]:
            self.offsets.append(self.offsets[-1] + p.numel())
        numel = self.offsets[-1] + params[-1].numel()
        self.buffer = torch.zeros(numel, dtype=params[0].dtype, device=params[0].device)
        self.grad_bucket = GradBucket(index, params, self.offsets, self.buffer, last)
        self.pending = 0
        self.future: Future | None = None

    def view(self, j: int) -> torch.Tensor:
        p = self.params[j]
        return self.buffer[self.offsets[j] : self.offsets[j] + p.numel()].view_as(p)


def _default_hook(state: Any, bucket: GradBucket) -> Future:
    """All-reduce (SUM) the bucket, which the reducer has already divided by the world size."""
    return (
        started_work(all_reduce(bucket.buffer(), group=state, async_op=True)).get_future().then(lambda f: f.value()[0])
    )


def started_work(work: Work | None) -> Work:
    """The work of an operation called with ``async_op=True`` (``None`` only on ranks outside its group, which
    DDP's group never has)."""
    if work is None:
        raise RuntimeError("an asynchronous operation of DDP's process group returned no work")
    return work


class DistributedDataParallel(nn.Module):
    """``module`` replicated on every rank of ``process_group``, its gradients averaged in backward.

    The constructor takes torch's arguments in torch's order. ``device_ids`` and
    ``output_device`` must be ``None`` or name the module's single device; the arguments
    after ``static_graph`` exist for signature parity and must keep their defaults.

    Example::

        model = simdist.DistributedDataParallel(net, bucket_cap_mb=25)
        loss_fn(model(x), y).backward()     # grads are now averaged over the ranks
        opt.step()
    """

    def __init__(
        self,
        module: nn.Module,
        device_ids: list | None = None,
        output_device: Any = None,
        dim: int = 0,
        broadcast_buffers: bool | None = None,
        init_sync: bool = True,
        process_group: Any = None,
        bucket_cap_mb: float | None = None,
        find_unused_parameters: bool = False,
        check_reduction: bool = False,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
        delay_all_reduce_named_params: Any = None,
        param_to_hook_all_reduce: Any = None,
        mixed_precision: Any = None,
        device_mesh: Any = None,
        skip_all_reduce_unused_params: bool = False,
        bucket_cap_mb_list: list | None = None,
        batched_grad_copy: bool = False,
        forward_sync_buffers: bool | None = None,
    ):
        super().__init__()
        _check_arguments(module, bucket_cap_mb, dim, locals())
        self.module = module
        self.device_ids, self.output_device, self.dim = device_ids, output_device, dim
        self.broadcast_buffers = True if broadcast_buffers is None else bool(broadcast_buffers)
        self.process_group = process_group
        self.find_unused_parameters = bool(find_unused_parameters) or bool(static_graph)
        self.gradient_as_bucket_view = bool(gradient_as_bucket_view)
        self.static_graph = bool(static_graph)
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        if check_reduction:
            warnings.warn(
                "The `check_reduction` argument of DistributedDataParallel is deprecated and has no effect",
                FutureWarning,
                stacklevel=2,
            )
        self._names = {p: n for n, p in module.named_parameters() if p.requires_grad}
        self._params = list(self._names)
        self._world = get_world_size(process_group)
        self._root = get_global_rank(process_group, 0) if process_group is not None else 0
        _verify_same_model(module, process_group)
        if init_sync:
            self._sync_module_states()
        self._buckets = self._make_buckets(bucket_cap_mb)
        self._where = {}  # param -> (bucket index, position in the bucket)
        for b, bucket in enumerate(self._buckets):
            for j, p in enumerate(bucket.params):
                self._where[p] = (b, j)
        self._hook_state: Any = process_group
        self._hook: Callable[[Any, GradBucket], Future] = _default_hook
        self._custom_hook = False
        self._armed = False  # a forward armed the next backward
        self._in_backward = False
        self._ready: set = set()
        self._next_bucket = 0
        self._used: set = set()
        self._unused: list = []
        self._unfinished: list[str] = []
        self._join: _JoinState | None = None
        self._handles = [p.register_post_accumulate_grad_hook(self._grad_ready) for p in self._params]

    # -- construction ------------------------------------------------------------------------

    def _sync_module_states(self, src: int | None = None) -> None:
        """Every parameter and buffer takes the values of global rank ``src`` (default: group rank 0)."""
        self._broadcast([*self.module.parameters(), *self.module.buffers()], src)

    def _broadcast(self, tensors: list, src: int | None = None) -> None:
        with torch.no_grad():
            for t in tensors:
                broadcast(t.data, src=self._root if src is None else src, group=self.process_group)

    def _make_buckets(self, bucket_cap_mb: float | None) -> list[_Bucket]:
        cap = int((DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb) * 1024 * 1024)
        limits = [FIRST_BUCKET_BYTES, cap] if bucket_cap_mb is None and FIRST_BUCKET_BYTES < cap else [cap]
        order = list(reversed(self._params))
        groups = bucket_assignment(order, limits)
        return [_Bucket(i, [order[k] for k in idx], i == len(groups) - 1) for i, idx in enumerate(groups)]

    # -- forward -----------------------------------------------------------------------------

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        """``module(*inputs, **kwargs)``, after syncing buffers; arms the next backward to average gradients."""
        if self._unfinished:
            names, self._unfinished = self._unfinished, []
            raise RuntimeError(_UNFINISHED.format(rank=get_rank(self.process_group), names=", ".join(names)))
        if self._join is not None:
            self._join.notify()
        if self.broadcast_buffers and self.require_forward_param_sync:
            self._sync_buffers()
        out = self.module(*inputs, **kwargs)
        self._armed = torch.is_grad_enabled() and self.require_backward_grad_sync and bool(self._params)
        if self._armed:
            self._ready, self._used, self._next_bucket = set(), set(), 0
            self._unused = _unused_parameters(self._params, out) if self.find_unused_parameters else []
            for bucket in self._buckets:
                bucket.pending, bucket.future = len(bucket.params), None
        return out

    def _sync_buffers(self) -> None:
        self._broadcast(list(self.module.buffers()))

    # -- backward ----------------------------------------------------------------------------

    def _grad_ready(self, param: nn.Parameter) -> None:
        """The hook run after ``param.grad`` is accumulated: mark it ready, launch buckets in order."""
        if not self._armed or param in self._ready:
            return
        if not self._in_backward:
            self._in_backward = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
            for p in self._unused:
                self._mark(p, used=False)
        _simulated_backward(param.numel() * BACKWARD_SECONDS_PER_ELEMENT)
        self._mark(param, used=True)

    def _mark(self, param: nn.Parameter, used: bool) -> None:
        b, j = self._where[param]
        bucket = self._buckets[b]
        view = bucket.view(j)
        if used:
            self._used.add(param)
            scale = None if self._custom_hook else 1.0 / self._divisor()  # a hook averages by itself
            grad = param.grad
            assert grad is not None, "a used parameter has a gradient"
            if self.gradient_as_bucket_view and grad.data_ptr() == view.data_ptr():
                if scale is not None:
                    view.mul_(scale)
            else:  # one pass: copy into the bucket and scale, as torch's reducer does
                if scale is None:
                    view.copy_(grad)
                else:
                    torch.mul(grad, scale, out=view)
                if self.gradient_as_bucket_view:
                    param.grad = view
        else:
            view.zero_()
        self._ready.add(param)
        bucket.pending -= 1
        while self._next_bucket < len(self._buckets) and self._buckets[self._next_bucket].pending == 0:
            self._launch(self._buckets[self._next_bucket])
            self._next_bucket += 1

    def _launch(self, bucket: _Bucket) -> None:
        bucket.future = self._hook(self._hook_state, bucket.grad_bucket)

    def _divisor(self) -> int:
        return self._join.divisor if self._join is not None else self._world

    def _finish_backward(self) -> None:
        """End of backward: wait for every launched bucket and write the averages to the gradients."""
        self._in_backward, self._armed = False, False
        launched = self._buckets[: self._next_bucket]
        if len(launched) < len(self._buckets):
            self._unfinished = [self._names[p] for p in self._params if p not in self._ready]
        globally_used = self._global_use() if self.find_unused_parameters else None
        for bucket in launched:
            assert bucket.future is not None, "a launched bucket has its future"
            result = bucket.future.wait()
            if result is not bucket.buffer:
                bucket.buffer.copy_(result)
            for j, p in enumerate(bucket.params):
                if p not in self._used and (globally_used is None or not globally_used[p]):
                    continue  # unused everywhere: the gradient stays as it was
                if self.gradient_as_bucket_view:
                    p.grad = bucket.view(j)
                elif p.grad is None:
                    p.grad = bucket.view(j).clone()
                else:
                    p.grad.copy_(bucket.view(j))

    def _global_use(self) -> dict:
        """Whether each parameter received a gradient on any rank (one all_reduce of a used-map)."""
        used = torch.tensor([p in self._used for p in self._params], dtype=torch.int32)
        all_reduce(used, group=self.process_group)
        return {p: bool(u) for p, u in zip(self._params, used.tolist())}

    # -- user controls -----------------------------------------------------------------------

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Inside: backward accumulates gradients locally; the first backward after it averages them."""
        old, self.require_backward_grad_sync = self.require_backward_grad_sync, False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def register_comm_hook(self, state: Any, hook: Callable[[Any, GradBucket], Any]) -> None:
        """Reduce each bucket with ``hook(state, bucket)``, which returns a future of the reduced buffer.

        The hook does the averaging itself (see :mod:`simdist.ddp_comm_hooks`). It may be
        registered once, before the first backward.
        """
        if not callable(hook):
            raise TypeError(f"hook must be callable, got {type(hook).__name__} ({hook!r:.60})")
        if self._custom_hook:
            raise RuntimeError("register_comm_hook can only be called once")
        self._hook_state, self._hook, self._custom_hook = state, hook, True

    @contextmanager
    def join(
        self, divide_by_initial_world_size: bool = True, enable: bool = True, throw_on_early_termination: bool = False
    ) -> Iterator[None]:
        """Train on uneven inputs: a rank that runs out of data shadows the others' collectives until all are done.

        As torch's ``Join``: each forward inside the context first all-reduces how many
        ranks still have data. A rank that leaves the context takes part, with zero
        gradients, in every iteration the others still run; when all have left, the
        parameters are broadcast from the last rank to leave. With
        ``divide_by_initial_world_size=False`` gradients are averaged over the ranks still
        training. With ``throw_on_early_termination`` every rank raises once one runs out.
        """
        if not enable or self._world == 1:
            yield
            return
        self._join = _JoinState(self, divide_by_initial_world_size, throw_on_early_termination)
        try:
            yield
            self._join.shadow_until_all_joined()
        finally:
            self._join = None


class _JoinState:
    """The bookkeeping of :meth:`DistributedDataParallel.join`."""

    def __init__(self, ddp: DistributedDataParallel, by_initial: bool, throw: bool):
        self.ddp, self.by_initial, self.throw = ddp, by_initial, throw
        self.divisor = ddp._world

    def _count(self, active: int) -> int:
        t = torch.tensor([active], dtype=torch.int64)
        all_reduce(t, group=self.ddp.process_group)
        return int(t.item())

    def notify(self) -> None:
        """Called by each forward of a rank that still has data."""
        active = self._count(1)
        if self.throw and active < self.ddp._world:
            raise RuntimeError(
                f"rank {get_rank()} found that a rank exhausted all inputs (join: throw_on_early_termination=True)"
            )
        if not self.by_initial:
            self.divisor = active

    def shadow_until_all_joined(self) -> None:
        """Take part with zero gradients in every iteration the other ranks still run, then sync the model."""
        ddp = self.ddp
        last = True  # among the last ranks to join: no other rank was still training when this one left
        while True:
            active = self._count(0)
            if active == 0:
                break
            last = False
            if self.throw:
                raise RuntimeError(f"rank {get_rank()} exhausted all inputs (join: throw_on_early_termination=True)")
            if not self.by_initial:
                self.divisor = active
            if ddp.broadcast_buffers and ddp.require_forward_param_sync:
                ddp._sync_buffers()
            if ddp.require_backward_grad_sync:
                self._shadow_backward()
        self._sync_final_model(last)

    def _shadow_backward(self) -> None:
        ddp = self.ddp
        for bucket in ddp._buckets:
            bucket.buffer.zero_()
            ddp._launch(bucket)
        if ddp.find_unused_parameters:
            all_reduce(torch.zeros(len(ddp._params), dtype=torch.int32), group=ddp.process_group)
        for bucket in ddp._buckets:
            assert bucket.future is not None, "every bucket was launched above"
            bucket.future.wait()

    def _sync_final_model(self, last: bool) -> None:
        """Broadcast the module's state from the highest rank among the last to join (the others' is stale)."""
        ddp = self.ddp
        t = torch.tensor([get_rank(ddp.process_group) if last else -1], dtype=torch.int64)
        all_reduce(t, op=ReduceOp.MAX, group=ddp.process_group)
        src = get_global_rank(ddp.process_group, int(t.item())) if ddp.process_group is not None else int(t.item())
        ddp._sync_module_states(src)


def _simulated_backward(seconds: float) -> None:
    """On the simulator: advance this rank's virtual clock by ``seconds`` of backward computation."""
    world = current_world()
    if world is not None:
        world.compute(seconds, user_call_site(), op="backward")


def _unused_parameters(params: list[nn.Parameter], output: Any) -> list[nn.Parameter]:
    """The parameters no autograd path leads to from the tensors in ``output``."""
    seen, stack, reached = set(), [], set()
    for t in _tensors(output):
        if t.grad_fn is not None:
            stack.append(t.grad_fn)
        elif t.requires_grad:
            reached.add(t)
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        var = getattr(fn, "variable", None)
        if var is not None:
            reached.add(var)
        stack.extend(nxt for nxt, _ in fn.next_functions if nxt is not None)
    return [p for p in params if p not in reached]


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def _verify_same_model(module: nn.Module, group: Any) -> None:
    """Every rank holds parameters of the same shapes and dtypes, or every rank raises naming the first that differs."""
    mine = [(n, tuple(p.shape), str(p.dtype)) for n, p in module.named_parameters()]
    everyone: list = [None] * get_world_size(group)
    all_gather_object(everyone, mine, group=group)
    ref = everyone[0]
    for rank, theirs in enumerate(everyone):
        if len(theirs) != len(ref):
            raise ValueError(
                f"DistributedDataParallel needs the same model on every rank: group rank {rank} has "
                f"{len(theirs)} parameters, group rank 0 has {len(ref)}"
            )
        for (n, s, d), (n0, s0, d0) in zip(theirs, ref):
            if (s, d) != (s0, d0):
                raise ValueError(
                    f"DistributedDataParallel needs the same model on every rank: parameter {n!r} of "
                    f"group rank {rank} is {s} {d}, but group rank 0's {n0!r} is {s0} {d0}"
                )


def _names_device(d: Any, device: torch.device) -> bool:
    """Whether ``d`` (an accelerator index, a string or a torch.device) names ``device``.

    On a rank with simulated GPUs, whose tensors live on the CPU, a simulated GPU names the CPU.
    """
    if device.type == "cpu" and torch_bridge.cuda.names_simulated_gpu(d):
        return True
    if isinstance(d, int) and not isinstance(d, bool):
        return device.type != "cpu" and device.index == d
    return isinstance(d, (str, torch.device)) and torch.device(d) == device


def _check_arguments(module: Any, bucket_cap_mb: Any, dim: Any, args: dict) -> None:
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__} ({module!r:.60})")
    if bucket_cap_mb is not None and (
        isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)) or not bucket_cap_mb > 0
    ):
        raise ValueError(f"bucket_cap_mb={bucket_cap_mb!r} must be a positive number of MiB (or None: 25)")
    devices = {p.device for p in module.parameters()}
    for name in ("device_ids", "output_device"):
        value = args[name]
        if value is None:
            continue
        wanted = value if isinstance(value, (list, tuple)) else [value]
        if len(devices) != 1 or not all(_names_device(d, next(iter(devices))) for d in wanted):
            raise ValueError(
                f"{name}={value!r} must be None or name the module's single device (the module is on "
                f"{sorted(map(str, devices))})"
            )
    defaults = {
        "delay_all_reduce_named_params": None,
        "param_to_hook_all_reduce": None,
        "mixed_precision": None,
        "device_mesh": None,
        "skip_all_reduce_unused_params": False,
        "bucket_cap_mb_list": None,
        "batched_grad_copy": False,
        "forward_sync_buffers": None,
    }
    for name, default in defaults.items():
        if args[name] != default:
            raise NotImplementedError(
                f"{name}={args[name]!r} is not supported by simdist's DistributedDataParallel (leave it at {default!r})"
            )
