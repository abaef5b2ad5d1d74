"""GPU code on CPU ranks: every torch-internal touch point of simdist's simulated GPUs lives here.

A thread with simulated GPUs (each simulated rank when ``cuda_as_cpu`` is on, and the parent
process of a ``simdist run --backend sim`` script that starts its own ranks) sees a node of
``count`` GPUs backed by the CPU:

- ``torch.cuda`` and ``torch.accelerator`` answer from the tables :data:`CUDA` and
  :data:`ACCELERATOR` (``is_available()`` is True, ``device_count()`` is ``count``, the current
  device starts at 0 and ``set_device`` changes it, streams and events exist, an event's time is
  the rank's virtual clock). Any other public function or class raises :class:`NotSimulatedError`
  when called, naming simdist and the call (submodules and constants are torch's);
- a device argument that names a GPU (``3``, ``'cuda'``, ``'cuda:3'``, ``torch.device('cuda', 3)``)
  is checked against ``count`` and becomes the CPU: tensors report ``device(type='cpu')``;
- ``DistributedDataParallel(model, device_ids=[i], output_device=i)`` checks ``i`` and builds a
  CPU DDP (the ids are dropped, since the model is on the CPU);
- ``torch.load`` keeps storages saved on, or mapped to, ``cuda...`` on the CPU, whatever form
  ``map_location`` has (a string, a device, a dict, or a function calling ``storage.cuda(i)``).

Every other thread (the main thread of a program that calls ``simdist.simulate``, threads a
rank starts) sees the real ``torch.cuda``; :func:`uninstall` undoes everything but the inert
deserializer (torch keeps no way to unregister one).

Touch points, the same in torch 2.13 and 2.14 (``simdist.torch_bridge.versions.TESTED``):

- ``torch.cuda`` / ``torch.accelerator``: the attributes of ``torch`` and the ``sys.modules``
  entries are replaced, while installed, by :class:`_ThreadModule` stand-ins that forward to
  the real module except for public callables in a thread with simulated GPUs. Names starting
  with ``_`` always forward (torch's own helpers). torch imports much of itself lazily, on a
  rank's first optimizer for instance, and some of its class bodies keep ``torch.cuda``
  functions: what a rank gets is therefore a :class:`_PerThread` that is torch's own function
  on every other thread.
- a ``TorchFunctionMode`` pushed on each such thread's mode stack (torch keeps that stack per
  thread): ``device=`` keyword arguments, the device of ``Tensor.to`` and of ``Module.to``'s
  argument parser (``torch._C._nn._parse_to``), ``Tensor.cuda``,
  ``Tensor.pin_memory`` (DataLoader's ``pin_memory=True``), ``Tensor.type('torch.cuda.FloatTensor')``.
- ``torch.distributed.device_mesh.DeviceMesh.__init__`` (a ``cuda`` mesh is a ``cpu`` mesh: DTensor
  moves local tensors to the mesh's device type, FSDP2 checks parameters against it) and
  ``torch.amp.autocast_mode.autocast.__init__`` (``cuda`` autocast is the CPU's, with CUDA's dtype),
  wrapped as below; ``F.scaled_dot_product_attention`` of DTensors, in the mode (:func:`_attention_of_dtensors`).
- ``torch.nn.parallel.DistributedDataParallel.__init__``, the ``cuda`` methods of storages
  (``_StorageBase``, ``TypedStorage``), DataLoader's ``_utils.pin_memory._pin_memory_loop``
  (the thread ``pin_memory=True, num_workers>0`` starts) and ``torch.utils._device.DeviceContext``'s
  constructor (the default-device mode), and ``Tensor.record_stream`` (whose argument parser
  refuses a simulated stream before any mode sees it), wrapped while installed (:func:`_wrapped`).
- ``torch.serialization.register_package`` (public API): a deserializer at priority 15, before
  CUDA's 20, registered once and inert outside threads with simulated GPUs.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import threading
import time
import types
import typing
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

from .gpu_memory import PROPERTIES, Placed

__all__ = [
    "ACCELERATOR",
    "CUDA",
    "NotSimulatedError",
    "Stream",
    "Event",
    "install",
    "uninstall",
    "enter_thread",
    "leave_thread",
    "simulated_gpus",
    "gpu_count",
    "names_simulated_gpu",
]

_CPU = torch.device("cpu")
_local = threading.local()


class NotSimulatedError(NotImplementedError):
    """A ``torch.cuda`` or ``torch.accelerator`` call that simulated GPUs do not provide."""


def _not_simulated(name: str) -> NotSimulatedError:
    return NotSimulatedError(
        f"simdist: {name} is not simulated on CPU ranks; simulated GPUs are backed by the CPU and only the "
        "calls listed in simdist's docs/gpu-scripts.md are mapped (leave this call out of simulated runs, "
        "or run the script on real GPUs)"
    )


# -- the GPUs one thread sees ---------------------------------------------------------------------------


class _Gpus:
    """The simulated node of one thread: how many GPUs, the current one, its streams and clock."""

    def __init__(self, count: int, clock: Callable[[], float]):
        self.count = count
        self.current = 0
        self.clock = clock
        self.defaults: dict[int, Stream] = {}
        self.streams: dict[int, Stream] = {}
        self.stream_ids = itertools.count(1)  # per thread, as in a process of its own
        self.placed = Placed()
        self.nvtx_depth = 0

    def names_gpu(self, device: Any) -> bool:
        """Whether ``device`` is a GPU spelling: an int, a 'cuda...' string or a cuda torch.device."""
        if isinstance(device, int):
            return not isinstance(device, bool)
        if isinstance(device, str):
            return device.startswith("cuda")
        return isinstance(device, torch.device) and device.type == "cuda"

    def index(self, device: Any, call: str) -> int:
        """The GPU index ``device`` names; ``ValueError`` naming ``call`` if none.

        ``None`` and the CPU name the current GPU: tensors on simulated GPUs report the CPU, so
        code that passes on a tensor's device (``torch.cuda.synchronize(t.device)``) means it.
        """
        cpu = (isinstance(device, str) and device.split(":")[0] == "cpu") or (
            isinstance(device, torch.device) and device.type == "cpu"
        )
        if device is None or cpu:
            return self.current
        if not self.names_gpu(device):
            raise ValueError(
                f"simdist: {call} got {device!r}; expected a GPU: an int, 'cuda', 'cuda:N' or torch.device('cuda', N)"
            )
        if isinstance(device, int):
            i = device
        else:
            parsed = torch.device(device)
            i = self.current if parsed.index is None else parsed.index
        if not 0 <= i < self.count:
            raise ValueError(
                f"simdist: {call} got {device!r}, but this simulated node has {self.count} GPU(s), cuda:0 .. "
                f"cuda:{self.count - 1} (set their number with 'simdist run --nproc-per-node N' or "
                "simdist.simulate(..., gpus_per_node=N))"
            )
        return i

    def gpu_named(self, device: Any) -> int | None:
        """The GPU ``device`` names (unchecked; ``None`` for another device, such as the CPU)."""
        if not self.names_gpu(device) or isinstance(device, bool):
            return None
        if isinstance(device, int):
            return device if 0 <= device < self.count else None
        index = torch.device(device).index
        return self.current if index is None else index if 0 <= index < self.count else None

    def cpu(self, device: Any, call: str) -> Any:
        """``device`` with a GPU (checked) replaced by the CPU; any other device unchanged."""
        if self.names_gpu(device):
            self.index(device, call)
            return _CPU
        return device

    def select(self, device: Any, call: str) -> None:
        """Make ``device`` the current GPU (a negative int does nothing, as in torch)."""
        if isinstance(device, int) and not isinstance(device, bool) and device < 0:
            return
        self.current = self.index(device, call)

    def default_stream(self, index: int) -> "Stream":
        if index not in self.defaults:
            self.defaults[index] = Stream._default(index)
        return self.defaults[index]

    def current_stream(self, index: int) -> "Stream":
        return self.streams.get(index) or self.default_stream(index)


def _here(call: str) -> _Gpus:
    gpus = getattr(_local, "gpus", None)
    if gpus is None:
        raise RuntimeError(f"simdist: {call} was used on a thread without simulated GPUs (not a simulated rank)")
    return gpus


def gpu_count() -> int | None:
    """The number of simulated GPUs the calling thread sees, or ``None`` if it sees the real torch.cuda."""
    gpus = getattr(_local, "gpus", None)
    return None if gpus is None else gpus.count


def names_simulated_gpu(device: Any) -> bool:
    """Whether the calling thread has simulated GPUs and ``device`` names one of them."""
    gpus = getattr(_local, "gpus", None)
    if gpus is None or not gpus.names_gpu(device):
        return False
    try:
        gpus.index(device, "device")
    except (ValueError, RuntimeError):
        return False
    return True


# -- streams and events ---------------------------------------------------------------------------------


class Stream:
    """A simulated CUDA stream. Work runs on the CPU when it is issued, so every wait returns at once."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any):
        gpus = _here("torch.cuda.Stream")
        self.device_index = gpus.index(device, "torch.cuda.Stream(device=...)")
        self.priority = priority
        self.stream_id = next(gpus.stream_ids)

    @classmethod
    def _default(cls, index: int) -> "Stream":
        stream = cls.__new__(cls)
        stream.device_index, stream.priority, stream.stream_id = index, 0, 0
        return stream

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self.device_index)

    @property
    def cuda_stream(self) -> int:
        return self.stream_id

    def wait_event(self, event: "Event") -> None:
        _check_type(event, Event, "Stream.wait_event(event)")

    def wait_stream(self, stream: "Stream") -> None:
        _check_type(stream, Stream, "Stream.wait_stream(stream)")

    def record_event(self, event: "Event | None" = None) -> "Event":
        event = Event() if event is None else event
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def is_capturing(self) -> bool:
        """False: simulated GPUs have no CUDA graphs (optimizers ask before their step)."""
        return False

    def __enter__(self) -> "Stream":
        self._context = _StreamContext(self)
        self._context.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._context.__exit__(*exc)

    def __repr__(self) -> str:
        return f"<torch.cuda.Stream device=cuda:{self.device_index} cuda_stream={self.stream_id} (simulated)>"


class Event:
    """A simulated CUDA event: ``record`` notes the recording rank's virtual time, in seconds."""

    def __init__(
        self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False, external: bool = False
    ):
        self.enable_timing = bool(enable_timing)
        self.time: float | None = None
        self.device_index: int | None = None

    def record(self, stream: Stream | None = None) -> None:
        gpus = _here("torch.cuda.Event.record")
        stream = gpus.current_stream(gpus.current) if stream is None else stream
        _check_type(stream, Stream, "Event.record(stream)")
        self.time, self.device_index = gpus.clock(), stream.device_index

    def wait(self, stream: Stream | None = None) -> None:
        if stream is not None:
            _check_type(stream, Stream, "Event.wait(stream)")

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, end_event: "Event") -> float:
        """Milliseconds of virtual time from this event's ``record`` to ``end_event``'s."""
        _check_type(end_event, Event, "Event.elapsed_time(end_event)")
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("simdist: Event.elapsed_time needs both events created with enable_timing=True")
        if self.time is None or end_event.time is None:
            raise RuntimeError("simdist: Event.elapsed_time needs both events recorded first (Event.record())")
        return (end_event.time - self.time) * 1000.0

    def ipc_handle(self) -> Any:
        raise _not_simulated("torch.cuda.Event.ipc_handle")

    def __repr__(self) -> str:
        return f"<torch.cuda.Event (simulated) recorded={self.time is not None}>"


def _check_type(value: Any, cls: type, call: str) -> None:
    if not isinstance(value, cls):
        raise TypeError(f"simdist: {call} expects a simulated torch.cuda.{cls.__name__}, got {type(value).__name__}")


class _StreamContext:
    """``torch.cuda.stream(s)``: ``s`` is the current stream of its device, which is the current device."""

    def __init__(self, stream: Stream | None):
        if stream is not None:
            _check_type(stream, Stream, "torch.cuda.stream(stream)")
        self.stream = stream

    def __enter__(self) -> Stream | None:
        if self.stream is not None:
            gpus = _here("torch.cuda.stream")
            self.saved = (gpus.current, dict(gpus.streams))
            gpus.current = self.stream.device_index
            gpus.streams[self.stream.device_index] = self.stream
        return self.stream

    def __exit__(self, *exc: Any) -> None:
        if self.stream is not None:
            gpus = _here("torch.cuda.stream")
            gpus.current, gpus.streams = self.saved


class _DeviceContext:
    """``torch.cuda.device(d)`` and ``torch.accelerator.device_index(d)``: ``d`` is current inside the block."""

    def __init__(self, device: Any):
        gpus = _here("torch.cuda.device")
        negative = device is None or (isinstance(device, int) and not isinstance(device, bool) and device < 0)
        self.index = -1 if negative else gpus.index(device, "torch.cuda.device(device=...)")

    def __enter__(self) -> None:
        gpus = _here("torch.cuda.device")
        self.previous = gpus.current
        if self.index >= 0:
            gpus.current = self.index

    def __exit__(self, *exc: Any) -> None:
        _here("torch.cuda.device").current = self.previous


# -- the tables: what torch.cuda and torch.accelerator answer on a thread with simulated GPUs -------------


def _true(*args: Any, **kwargs: Any) -> bool:
    return True


def _device_count() -> int:
    return _here("torch.cuda.device_count").count


def _current_device() -> int:
    return _here("torch.cuda.current_device").current


def _set_device(device: Any) -> None:
    _here("torch.cuda.set_device").select(device, "torch.cuda.set_device(device=...)")


def _synchronize(device: Any = None) -> None:
    _here("torch.cuda.synchronize").index(device, "torch.cuda.synchronize(device=...)")


def _current_stream(device: Any = None) -> Stream:
    gpus = _here("torch.cuda.current_stream")
    return gpus.current_stream(gpus.index(device, "torch.cuda.current_stream(device=...)"))


def _default_stream(device: Any = None) -> Stream:
    gpus = _here("torch.cuda.default_stream")
    return gpus.default_stream(gpus.index(device, "torch.cuda.default_stream(device=...)"))


def _set_stream(stream: Stream) -> None:
    _check_type(stream, Stream, "torch.cuda.set_stream(stream)")
    gpus = _here("torch.cuda.set_stream")
    gpus.current = stream.device_index
    gpus.streams[stream.device_index] = stream


def _device_of(obj: Any) -> _DeviceContext:
    return _DeviceContext(-1)  # a simulated GPU's tensors are CPU tensors: the current device stays


def _get_device_name(device: Any = None) -> str:
    index = _here("torch.cuda.get_device_name").index(device, "torch.cuda.get_device_name(device=...)")
    return f"simdist simulated GPU {index} (CPU)"


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def _false(*args: Any, **kwargs: Any) -> bool:
    return False


def _get_rng_state(device: Any = "cuda") -> torch.Tensor:
    """The state of the generator tensors on simulated GPUs draw from: the rank's CPU generator."""
    _here("torch.cuda.get_rng_state").index(device, "torch.cuda.get_rng_state(device=...)")
    return torch.default_generator.get_state()


def _set_rng_state(state: torch.Tensor, device: Any = "cuda") -> None:
    _here("torch.cuda.set_rng_state").index(device, "torch.cuda.set_rng_state(device=...)")
    torch.default_generator.set_state(state)


def _get_rng_state_all() -> list[torch.Tensor]:
    return [torch.default_generator.get_state() for _ in range(_here("torch.cuda.get_rng_state_all").count)]


def _set_rng_state_all(states: Any) -> None:
    states = list(states)
    gpus = _here("torch.cuda.set_rng_state_all")
    if len(states) != gpus.count:
        raise ValueError(f"simdist: torch.cuda.set_rng_state_all got {len(states)} states for {gpus.count} GPU(s)")
    torch.default_generator.set_state(states[gpus.current])


def _initial_seed() -> int:
    return torch.default_generator.initial_seed()


def _current_accelerator(check_available: bool = False) -> torch.device:
    return torch.device("cuda")


def _memory(call: str) -> Callable[..., Any]:
    """A ``torch.cuda`` memory statistic of one GPU: ``read(memory)`` of the GPU ``device`` names (the current one)."""

    def read_of(read: Callable[[Any], Any]) -> Callable[..., Any]:
        def statistic(device: Any = None) -> Any:
            gpus = _here(call)
            index = gpus.index(device, f"{call}(device=...)")
            gpus.placed.settle(orphans=True)
            return read(gpus.placed.memory(index))

        statistic.__name__ = call.rsplit(".", 1)[-1]
        return statistic

    return read_of


def _reset_peak(memory: Any) -> None:
    memory.reset_peak()


def _reset_accumulated(memory: Any) -> None:
    memory.allocated = memory.freed = memory.allocations = memory.frees = 0


def _empty_cache() -> None:
    placed = _here("torch.cuda.empty_cache").placed
    placed.settle(orphans=True)
    for memory in placed.memories.values():
        memory.empty_cache()


def _get_device_properties(device: Any = None) -> Any:
    index = _here("torch.cuda.get_device_properties").index(device, "torch.cuda.get_device_properties(device=...)")
    return dataclasses.replace(PROPERTIES, name=f"simdist simulated GPU {index} (CPU)")


def _get_device_capability(device: Any = None) -> tuple[int, int]:
    _here("torch.cuda.get_device_capability").index(device, "torch.cuda.get_device_capability(device=...)")
    return PROPERTIES.major, PROPERTIES.minor


def _range_push(msg: str) -> int:
    gpus = _here("torch.cuda.nvtx.range_push")
    gpus.nvtx_depth += 1
    return gpus.nvtx_depth - 1


def _range_pop() -> int:
    gpus = _here("torch.cuda.nvtx.range_pop")
    if gpus.nvtx_depth == 0:
        return -1
    gpus.nvtx_depth -= 1
    return gpus.nvtx_depth


def _zero(*args: Any, **kwargs: Any) -> int:
    return 0


@contextmanager
def _nvtx_range(msg: str, *args: Any, **kwargs: Any) -> Iterator[None]:
    _range_push(msg)
    try:
        yield
    finally:
        _range_pop()


MEMORY: dict[str, Any] = {
    "memory_allocated": _memory("torch.cuda.memory_allocated")(lambda m: m.current),
    "max_memory_allocated": _memory("torch.cuda.max_memory_allocated")(lambda m: m.peak),
    "memory_reserved": _memory("torch.cuda.memory_reserved")(lambda m: m.reserved),
    "max_memory_reserved": _memory("torch.cuda.max_memory_reserved")(lambda m: m.peak_reserved),
    "memory_cached": _memory("torch.cuda.memory_cached")(lambda m: m.reserved),
    "max_memory_cached": _memory("torch.cuda.max_memory_cached")(lambda m: m.peak_reserved),
    "reset_peak_memory_stats": _memory("torch.cuda.reset_peak_memory_stats")(_reset_peak),
    "reset_max_memory_allocated": _memory("torch.cuda.reset_max_memory_allocated")(_reset_peak),
    "reset_max_memory_cached": _memory("torch.cuda.reset_max_memory_cached")(_reset_peak),
    "reset_accumulated_memory_stats": _memory("torch.cuda.reset_accumulated_memory_stats")(_reset_accumulated),
    "memory_stats": _memory("torch.cuda.memory_stats")(lambda m: m.stats()),
    "mem_get_info": _memory("torch.cuda.mem_get_info")(lambda m: (max(0, m.capacity - m.reserved), m.capacity)),
}
"""The memory statistics of ``torch.cuda`` (and, but for ``mem_get_info``, of ``torch.accelerator``) on simulated GPUs."""

NVTX: dict[str, Any] = {
    "range_push": _range_push,
    "range_pop": _range_pop,
    "range_start": _zero,
    "range_end": _nothing,
    "mark": _nothing,
    "range": _nvtx_range,
}
"""What ``torch.cuda.nvtx.<name>`` is in a thread with simulated GPUs: ranges that mark nothing (no profiler sees them)."""


CUDA: dict[str, Any] = {
    "is_available": _true,
    "is_initialized": _true,
    "init": _nothing,
    "device_count": _device_count,
    "current_device": _current_device,
    "set_device": _set_device,
    "device": _DeviceContext,
    "device_of": _device_of,
    "get_device_name": _get_device_name,
    "synchronize": _synchronize,
    "Stream": Stream,
    "Event": Event,
    "StreamContext": _StreamContext,
    "stream": _StreamContext,
    "current_stream": _current_stream,
    "default_stream": _default_stream,
    "set_stream": _set_stream,
    "is_current_stream_capturing": _false,
    "manual_seed": _nothing,
    "manual_seed_all": _nothing,
    "seed": _nothing,
    "seed_all": _nothing,
    "get_rng_state": _get_rng_state,
    "set_rng_state": _set_rng_state,
    "get_rng_state_all": _get_rng_state_all,
    "set_rng_state_all": _set_rng_state_all,
    "initial_seed": _initial_seed,
    "empty_cache": _empty_cache,
    "is_bf16_supported": _true,
    "get_device_properties": _get_device_properties,
    "get_device_capability": _get_device_capability,
    **MEMORY,
}
"""What ``torch.cuda.<name>`` is in a thread with simulated GPUs (docs/gpu-scripts.md explains each)."""

ACCELERATOR: dict[str, Any] = {
    "current_accelerator": _current_accelerator,
    "is_available": _true,
    "device_count": _device_count,
    "current_device_index": _current_device,
    "current_device_idx": _current_device,
    "set_device_index": _set_device,
    "set_device_idx": _set_device,
    "device_index": _DeviceContext,
    "synchronize": _synchronize,
    "current_stream": _current_stream,
    "set_stream": _set_stream,
    "empty_cache": _empty_cache,
    **{
        name: MEMORY[name]
        for name in MEMORY
        if name not in ("mem_get_info", "memory_cached", "max_memory_cached") and not name.startswith("reset_max")
    },
    "get_memory_info": MEMORY["mem_get_info"],
}
"""What ``torch.accelerator.<name>`` is in a thread with simulated GPUs."""


class _PerThread:
    """One public name of ``torch.cuda`` as a thread with simulated GPUs got it: it stays right on every thread.

    Called (or used in ``isinstance``) on a thread with simulated GPUs, it is the table's entry,
    or raises :class:`NotSimulatedError` if the table has none; on any other thread it is torch's
    own. So a reference that torch code takes while a rank imports it (``staticmethod(
    torch.cuda.current_device)`` in a class body) still works once the simulation is over.
    """

    __slots__ = ("simulated", "real", "name")

    def __init__(self, simulated: Any, real: Any, name: str):
        self.simulated, self.real, self.name = simulated, real, name

    def _target(self) -> Any:
        if getattr(_local, "gpus", None) is None:
            return self.real
        if self.simulated is None:
            raise _not_simulated(self.name)
        return self.simulated

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._target()(*args, **kwargs)

    def _lookup(self) -> Any:
        """What ``isinstance`` and attribute reads (``__name__``, ``__doc__``...) use: never an error."""
        simulated = self.simulated if getattr(_local, "gpus", None) is not None else None
        return self.real if simulated is None else simulated

    def __instancecheck__(self, obj: Any) -> bool:
        return isinstance(obj, self._lookup())

    def __subclasscheck__(self, cls: type) -> bool:
        return issubclass(cls, self._lookup())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lookup(), name)

    def __or__(self, other: Any) -> Any:  # ``torch.cuda.Stream | None`` in an annotation a library evaluates
        return typing.Union[self.real, other]

    def __ror__(self, other: Any) -> Any:
        return typing.Union[other, self.real]

    def __repr__(self) -> str:
        return f"<{self.name}, simulated on threads with simulated GPUs>"


class _ThreadModule(types.ModuleType):
    """Stands for ``torch.cuda`` (or ``torch.accelerator``): on a thread with simulated GPUs, its callables serve them.

    There, a public callable is a :class:`_PerThread` (the table's entry, or an error naming the
    call); submodules and plain values are torch's. Everywhere else, and for names starting
    with ``_``, it is the real module: reads, writes and submodule imports go to it.
    """

    def __init__(
        self, real: types.ModuleType, table: dict[str, Any], modules: dict[str, "_ThreadModule"] | None = None
    ):
        super().__init__(real.__name__)
        for key in ("__doc__", "__package__", "__loader__", "__spec__", "__path__", "__file__"):
            if hasattr(real, key):
                self.__dict__[key] = getattr(real, key)
        self.__dict__.update(_simdist_real=real, _simdist_table=table, _simdist_names={})
        self.__dict__.update(modules or {})  # submodules with stand-ins of their own (torch.cuda.nvtx)

    def __getattr__(self, name: str) -> Any:
        real = self.__dict__["_simdist_real"]
        if getattr(_local, "gpus", None) is None or name.startswith("_"):
            return getattr(real, name)
        names = self.__dict__["_simdist_names"]
        if name not in names:
            table = self.__dict__["_simdist_table"]
            value = getattr(real, name, None)
            if name not in table and (isinstance(value, types.ModuleType) or not callable(value)):
                return getattr(real, name)
            names[name] = _PerThread(table.get(name), value, f"{real.__name__}.{name}")
        return names[name]

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.__dict__["_simdist_real"], name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self.__dict__["_simdist_real"], name)

    def __dir__(self) -> list[str]:
        return dir(self.__dict__["_simdist_real"])


# -- tensors: GPU devices become the CPU ------------------------------------------------------------------


def _tensor_cuda(gpus: _Gpus, args: tuple, kwargs: dict) -> Any:
    tensor, device = args[0], (args[1] if len(args) > 1 else kwargs.get("device"))
    gpus.index(device, "Tensor.cuda(device=...)")
    memory_format = kwargs.get("memory_format", torch.preserve_format)
    return tensor if memory_format is torch.preserve_format else tensor.to(memory_format=memory_format)


def _tensor_type(gpus: _Gpus, args: tuple, kwargs: dict) -> Any:
    if len(args) > 1 and isinstance(args[1], str) and args[1].startswith("torch.cuda."):
        args = (args[0], "torch." + args[1][len("torch.cuda.") :], *args[2:])
    return torch.Tensor.type(*args, **kwargs)


_SPECIAL: dict[Any, Callable[[_Gpus, tuple, dict], Any]] = {
    torch.Tensor.cuda: _tensor_cuda,
    torch.Tensor.pin_memory: lambda gpus, args, kwargs: args[0],
    torch.Tensor.type: _tensor_type,
}


# functions whose device may come positionally, and where: t.to(device, ...), Module.to's parser
_DEVICE_AT: dict[Any, int] = {torch.Tensor.to: 1, torch._C._nn._parse_to: 0}


class _OnCpu(TorchFunctionMode):
    """Runs every torch function with the simulated GPUs named in its arguments replaced by the CPU."""

    def __init__(self, gpus: _Gpus):
        super().__init__()
        self.gpus = gpus

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        gpus = self.gpus
        gpu: Any = _FROM_INPUTS  # where the result is: a GPU the call names, or that of a tensor it computes from
        special = _SPECIAL.get(func)
        if special is not None:
            out = special(gpus, args, kwargs)
            if func is torch.Tensor.cuda:
                gpu = gpus.index(args[1] if len(args) > 1 else kwargs.get("device"), "Tensor.cuda(device=...)")
        elif func is torch._C._nn.scaled_dot_product_attention and _any_dtensor(args[:3]):
            out = _attention_of_dtensors(func, args, kwargs)
        else:
            if "device" in kwargs:
                gpu = gpus.gpu_named(kwargs["device"])
                kwargs = {**kwargs, "device": gpus.cpu(kwargs["device"], f"{_name(func)}(device=...)")}
            at = _DEVICE_AT.get(func)
            if at is not None and len(args) > at:
                if not isinstance(args[at], (torch.dtype, torch.Tensor)):
                    gpu = gpus.gpu_named(args[at])
                args = (*args[:at], gpus.cpu(args[at], f"{_name(func)}(device)"), *args[at + 1 :])
            elif func is torch.Tensor.cpu:
                gpu = None
            out = func(*args, **kwargs)
        if gpu is _FROM_INPUTS:  # (most calls: looked at only when the result is a tensor not yet placed)
            if isinstance(out, torch.Tensor):
                gpu = None if id(out) in gpus.placed.tensors else gpus.placed.gpu_of(args)
            else:
                gpu = gpus.placed.gpu_of(args) if isinstance(out, (list, tuple)) else None
        if gpu is not None:
            gpus.placed.place(out, gpu)
        return out


_FROM_INPUTS = object()


def _any_dtensor(values: Any) -> bool:
    tensor_api = sys.modules.get("torch.distributed.tensor")  # imported wherever a DTensor exists
    return tensor_api is not None and any(isinstance(v, tensor_api.DTensor) for v in values)


def _attention_of_dtensors(func: Any, args: tuple, kwargs: dict) -> Any:
    """``F.scaled_dot_product_attention`` of DTensors on simulated GPUs: each rank's heads (or batch rows) alone.

    On a GPU it runs as flash (or efficient, cuDNN) attention, which DTensor shards by batch and by
    head; the CPU's kernel has no sharding rule in DTensor. Query, key and value on one mesh with
    the same placements, each ``Replicate`` or ``Shard`` of the batch or head dimension, need no
    communication: each rank attends over its local tensors and the result has their placements,
    as the GPU's rule gives. Anything else goes to torch (and its error).
    """
    from torch.distributed.tensor import DTensor, Replicate, Shard

    query, key, value = (list(args) + [kwargs.get(k) for k in ("query", "key", "value")[len(args) :]])[:3]
    tensors = (query, key, value)
    mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
    local_rule = (
        all(isinstance(t, DTensor) and t.ndim == 4 for t in tensors)
        and query.device_mesh == key.device_mesh == value.device_mesh
        and query.placements == key.placements == value.placements
        and all(isinstance(p, Replicate) or (isinstance(p, Shard) and p.dim % 4 in (0, 1)) for p in query.placements)
        and not isinstance(mask, DTensor)
    )
    if not local_rule:
        return func(*args, **kwargs)
    rest = {k: v for k, v in kwargs.items() if k not in ("query", "key", "value")}
    out = func(query.to_local(), key.to_local(), value.to_local(), *args[3:], **rest)
    shape = (*query.shape[:-1], value.shape[-1])
    return DTensor.from_local(
        out,
        query.device_mesh,
        query.placements,
        run_check=False,
        shape=torch.Size(shape),
        stride=torch.empty(shape, device="meta").stride(),
    )


def _name(func: Any) -> str:
    """How a user spells ``func``: ``Tensor.to``, ``torch.zeros``."""
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
    if name.startswith(("TensorBase.", "_TensorBase.")):
        return "Tensor." + name.split(".", 1)[1]
    return name if "." in name else f"torch.{name}"


# -- methods wrapped while installed: DistributedDataParallel, storages; torch.load's deserializer ----------


def _ddp_init(original: Callable) -> Callable:
    def __init__(
        self: Any, module: Any, device_ids: Any = None, output_device: Any = None, *args: Any, **kwargs: Any
    ) -> None:
        """torch's DDP constructor; with simulated GPUs, ``device_ids``/``output_device`` are checked, then dropped."""
        gpus = getattr(_local, "gpus", None)
        if gpus is not None:
            if device_ids is not None and len(device_ids) == 1 and gpus.names_gpu(device_ids[0]):
                gpus.index(device_ids[0], "DistributedDataParallel(device_ids=...)")
                device_ids = None
            if output_device is not None and gpus.names_gpu(output_device):
                gpus.index(output_device, "DistributedDataParallel(output_device=...)")
                output_device = None
        original(self, module, device_ids, output_device, *args, **kwargs)

    return __init__


def _storage_cuda(original: Callable) -> Callable:
    def cuda(self: Any, device: Any = None, non_blocking: bool = False) -> Any:
        """torch's ``Storage.cuda``; with simulated GPUs, the storage itself (``lambda s, loc: s.cuda(r)`` loads)."""
        gpus = getattr(_local, "gpus", None)
        if gpus is None:
            return original(self, device, non_blocking)
        gpus.index(device, "Storage.cuda(device=...)")
        return self

    return cuda


def _device_context_init(original: Callable) -> Callable:
    def __init__(self: Any, device: Any) -> None:
        """torch's default-device mode (``with torch.device('cuda'):``, ``torch.set_default_device``); a simulated
        GPU becomes the CPU. It sits below every other mode, so :class:`_OnCpu` cannot see what it adds."""
        gpus = getattr(_local, "gpus", None)
        original(self, device if gpus is None else gpus.cpu(device, "torch.set_default_device / torch.device"))

    return __init__


def _autocast_init(original: Callable) -> Callable:
    def __init__(self: Any, device_type: str, dtype: Any = None, *args: Any, **kwargs: Any) -> None:
        """torch's autocast; with simulated GPUs, ``cuda`` autocast is the CPU's with CUDA's dtype (float16 unless
        given), so ``torch.autocast("cuda", dtype=torch.bfloat16)`` computes in bfloat16 as on a GPU."""
        gpus = getattr(_local, "gpus", None)
        if gpus is not None and device_type == "cuda":
            device_type, dtype = "cpu", torch.get_autocast_dtype("cuda") if dtype is None else dtype
        original(self, device_type, dtype, *args, **kwargs)

    return __init__


def _device_mesh_init(original: Callable) -> Callable:
    def __init__(self: Any, device_type: str, *args: Any, **kwargs: Any) -> None:
        """torch's ``DeviceMesh``; with simulated GPUs, a ``cuda`` mesh is a ``cpu`` mesh, as the tensors on it are
        (DTensor moves local tensors to the mesh's device type, FSDP2 checks parameters against it)."""
        gpus = getattr(_local, "gpus", None)
        if gpus is not None and isinstance(device_type, str) and gpus.names_gpu(device_type):
            device_type = "cpu"
        original(self, device_type, *args, **kwargs)

    return __init__


def _pin_memory_loop(original: Callable) -> Callable:
    def _pin_memory_loop(in_queue: Any, out_queue: Any, device_id: int, done_event: Any, device: Any) -> None:
        """DataLoader's pin-memory thread (``pin_memory=True, num_workers>0``), started by a thread with simulated
        GPUs while they are installed: it sees simulated GPUs too, so pinning keeps the batch as it is."""
        if getattr(_local, "gpus", None) is not None:  # a simulated rank's thread: it has its rank's GPUs already
            return original(in_queue, out_queue, device_id, done_event, device)
        enter_thread(device_id + 1)
        try:
            return original(in_queue, out_queue, device_id, done_event, device)
        finally:
            leave_thread()

    return _pin_memory_loop


def _record_stream(original: Callable) -> Callable:
    def record_stream(self: Any, stream: Any) -> None:
        """torch's ``Tensor.record_stream``; nothing to do for a simulated stream (torch's parser refuses one)."""
        if isinstance(stream, Stream):
            return None
        return original(self, stream)

    return record_stream


def _module_to(original: Callable) -> Callable:
    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        """torch's ``Module.to``; with simulated GPUs, a module moved to a GPU has its parameters and buffers on it."""
        out = original(self, *args, **kwargs)
        gpus = getattr(_local, "gpus", None)
        if gpus is not None:
            gpu = gpus.gpu_named(args[0] if args else kwargs.get("device"))
            if gpu is not None:
                _place_module(gpus, self, gpu)
        return out

    return to


def _module_cuda(original: Callable) -> Callable:
    def cuda(self: Any, device: Any = None) -> Any:
        """torch's ``Module.cuda``; with simulated GPUs, its parameters and buffers are on the GPU."""
        out = original(self, device)
        gpus = getattr(_local, "gpus", None)
        if gpus is not None:
            _place_module(gpus, self, gpus.index(device, "Module.cuda(device=...)"))
        return out

    return cuda


def _place_module(gpus: _Gpus, module: Any, gpu: int) -> None:
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        gpus.placed.place(tensor, gpu)


def _compile(original: Callable) -> Callable:
    def compile(*args: Any, **kwargs: Any) -> Any:
        """``torch.compile``; on a thread with simulated GPUs on a machine without CUDA, inductor does not look for
        triton's GPU (it would load the CUDA driver): tensors on simulated GPUs are CPU tensors, compiled for the CPU."""
        if getattr(_local, "gpus", None) is not None and not _saved["cuda"].is_available():
            from torch._inductor import config

            if "detection" not in _saved_config:
                _saved_config["detection"] = config.triton_disable_device_detection
            config.triton_disable_device_detection = True
        return original(*args, **kwargs)

    return compile


def _swap_tensors(original: Callable) -> Callable:
    def swap_tensors(t1: Any, t2: Any) -> None:
        """torch's ``torch.utils.swap_tensors`` (``Module.to`` and FSDP2 swap parameters); with simulated GPUs, where
        each tensor lies follows its data. torch refuses a tensor with a weak reference, which the count holds: it
        is dropped for the swap and made again."""
        gpus = getattr(_local, "gpus", None)
        if gpus is None:
            return original(t1, t2)
        placed = gpus.placed
        first, second = placed.unplace(t1), placed.unplace(t2)
        original(t1, t2)
        for tensor, was in ((t1, second), (t2, first)):  # each now holds the other's data
            gpu = was if was is not None else placed.storage_gpu(tensor)
            if gpu is not None:
                placed.place(tensor, gpu)

    return swap_tensors


def _backward_in_mode(original: Callable) -> Callable:
    def _engine_run_backward(*args: Any, **kwargs: Any) -> Any:
        """torch's backward engine; on a thread with simulated GPUs, under the thread's device mode, which torch's
        dispatch of ``Tensor.backward`` takes off the stack: hooks and ``autograd.Function.backward`` see the GPUs."""
        mode = getattr(_local, "mode", None)
        if mode is None or mode in _get_current_function_mode_stack():
            return original(*args, **kwargs)
        with mode:
            return original(*args, **kwargs)

    return _engine_run_backward


def _wrapped() -> list[tuple[Any, str, Callable]]:
    """What is replaced while installed: (class or module, attribute, wrapper of the original)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils._device import DeviceContext
    from torch.utils.data._utils import pin_memory

    return [
        (torch.amp.autocast_mode.autocast, "__init__", _autocast_init),
        (DeviceMesh, "__init__", _device_mesh_init),
        (DistributedDataParallel, "__init__", _ddp_init),
        (torch.storage._StorageBase, "cuda", _storage_cuda),
        (torch.storage.TypedStorage, "cuda", _storage_cuda),
        (pin_memory, "_pin_memory_loop", _pin_memory_loop),
        (DeviceContext, "__init__", _device_context_init),
        (torch.Tensor, "record_stream", _record_stream),
        (torch.autograd.graph, "_engine_run_backward", _backward_in_mode),
        (torch.nn.Module, "to", _module_to),
        (torch.nn.Module, "cuda", _module_cuda),
        (torch, "compile", _compile),
        (torch.utils, "swap_tensors", _swap_tensors),
        (torch.autograd, "_engine_run_backward", _backward_in_mode),
    ]


def _restore_on_cpu(storage: Any, location: str) -> Any:
    """torch.load's deserializer for ``cuda...`` locations on a thread with simulated GPUs: the CPU storage as is."""
    gpus = getattr(_local, "gpus", None)
    if gpus is None or not location.startswith("cuda"):
        return None
    gpus.index(location, "torch.load (a storage's location after map_location)")
    return storage


def _no_tag(storage: Any) -> None:
    return None


# -- install / uninstall, per process and per thread --------------------------------------------------------

_lock = threading.Lock()
_users = 0
_saved: dict[str, Any] = {}
_saved_methods: list[tuple[Any, str, Any]] = []
_saved_config: dict[str, Any] = {}  # inductor's settings changed while installed
_INHERITED = object()  # an attribute the owner inherits: uninstall deletes the wrapper
_deserializer_registered = False


def install() -> None:
    """Put the stand-ins in place (process-wide, counted: each call needs one :func:`uninstall`)."""
    global _users, _deserializer_registered
    with _lock:
        _users += 1
        if _users > 1:
            return
        _saved.update(cuda=torch.cuda, accelerator=torch.accelerator, nvtx=torch.cuda.nvtx)
        nvtx = _ThreadModule(_saved["nvtx"], NVTX)
        sys.modules["torch.cuda.nvtx"] = nvtx
        for name in ("cuda", "accelerator"):
            stand_in = _ThreadModule(_saved[name], CUDA if name == "cuda" else ACCELERATOR,
                                     {"nvtx": nvtx} if name == "cuda" else None)  # fmt: skip
            setattr(torch, name, stand_in)
            sys.modules[f"torch.{name}"] = stand_in
        for owner, name, wrap in _wrapped():
            _saved_methods.append((owner, name, owner.__dict__.get(name, _INHERITED)))
            setattr(owner, name, wrap(getattr(owner, name)))
        if not _deserializer_registered:
            torch.serialization.register_package(15, _no_tag, _restore_on_cpu)
            _deserializer_registered = True


def uninstall() -> None:
    """Undo one :func:`install`; the last one puts torch back as it was."""
    global _users
    with _lock:
        _users -= 1
        if _users > 0:
            return
        for name in ("cuda", "accelerator"):
            setattr(torch, name, _saved[name])
            sys.modules[f"torch.{name}"] = _saved[name]
        sys.modules["torch.cuda.nvtx"] = _saved["nvtx"]
        for owner, name, original in _saved_methods:
            if original is _INHERITED:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        _saved_methods.clear()
        _saved.clear()
        if "detection" in _saved_config:
            from torch._inductor import config

            config.triton_disable_device_detection = _saved_config.pop("detection")


def enter_thread(count: int, clock: Callable[[], float] = time.perf_counter) -> None:
    """Give the calling thread ``count`` simulated GPUs (GPU 0 current); ``clock()`` times its events, in seconds."""
    gpus = _Gpus(count, clock)
    _local.gpus = gpus
    _local.mode = _OnCpu(gpus)
    _local.mode.__enter__()


def carried() -> Callable[[], Callable[[], None]]:
    """For a thread the calling thread starts (:func:`simdist.torch_bridge.ranks.carry`): ``enter``, which gives it
    simulated GPUs as the caller's (their number, clock and current GPU), and returns ``leave``."""
    gpus = getattr(_local, "gpus", None)
    if gpus is None:
        return lambda: _nothing
    count, clock, current = gpus.count, gpus.clock, gpus.current

    def enter() -> Callable[[], None]:
        enter_thread(count, clock)
        _local.gpus.current = current
        return leave_thread

    return enter


def leave_thread() -> None:
    """Take the calling thread's simulated GPUs away (it sees the real torch.cuda again)."""
    mode = getattr(_local, "mode", None)
    _local.gpus = _local.mode = None
    if mode is not None:
        mode.__exit__(None, None, None)


@contextmanager
def simulated_gpus(count: int, clock: Callable[[], float] = time.perf_counter) -> Iterator[None]:
    """Within the block, the calling thread sees ``count`` simulated GPUs (installing the stand-ins)."""
    install()
    try:
        enter_thread(count, clock)
        try:
            yield
        finally:
            leave_thread()
    finally:
        uninstall()
