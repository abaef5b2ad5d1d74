"""What a simulated GPU says of itself and of its memory: ``torch.cuda``'s device properties and memory statistics.

Every simulated GPU is the same stated device, :data:`PROPERTIES` (compute capability 9.0, 80 GiB,
132 multiprocessors, as a data-centre GPU of 2023 has). A rank's GPU holds the tensors the rank
placed on it, counted by :class:`Placed` as torch's caching allocator counts a real GPU's:

- a tensor is on GPU ``i`` when a torch function made it with ``device`` naming GPU ``i``, when
  ``Tensor.to``/``Tensor.cuda``/``Module.to`` moved it there, or when a torch function computed it
  from a tensor on GPU ``i`` (so activations, optimizer states and gradients read as ``.grad``
  count); what torch allocates inside its C++ code without handing it to Python (DDP's buckets,
  autograd's temporaries) does not;
- a storage counts once, with the size it had when first placed, from then until torch frees it
  (an activation autograd keeps for backward counts until backward is done with it);
- ``memory_allocated`` is the bytes placed now, ``max_memory_allocated`` the most since the start
  or ``reset_peak_memory_stats``; reserved memory is what a caching allocator keeps: it grows in
  2 MiB blocks to cover what is allocated and shrinks only in ``empty_cache``;
  ``mem_get_info`` is ``(capacity - reserved, capacity)``.
"""

from __future__ import annotations

import functools
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

__all__ = ["PROPERTIES", "Properties", "Memory", "Placed"]

_GIB = 2**30
_BLOCK = 2 * 2**20  # the caching allocator's segments: reserved memory grows by these
_MIN_BLOCK = 512  # and every allocation is a multiple of this


@dataclass(frozen=True)
class Properties:
    """``torch.cuda.get_device_properties(i)`` of a simulated GPU: the fields of torch's ``_CudaDeviceProperties``."""

    name: str
    major: int
    minor: int
    total_memory: int
    multi_processor_count: int
    is_integrated: int = 0
    is_multi_gpu_board: int = 0
    max_threads_per_multi_processor: int = 2048
    gcnArchName: str = "NVIDIA"
    warp_size: int = 32
    uuid: str = "00000000-0000-0000-0000-000000000000"
    L2_cache_size: int = 50 * 2**20
    clock_rate: int = 1_980_000
    memory_clock_rate: int = 2_619_000
    memory_bus_width: int = 5120
    shared_memory_per_block: int = 48 * 1024
    shared_memory_per_multiprocessor: int = 228 * 1024
    regs_per_multiprocessor: int = 65536
    max_threads_per_block: int = 1024

    def __repr__(self) -> str:
        return (
            f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
            f"total_memory={self.total_memory // 2**20}MB, multi_processor_count={self.multi_processor_count}, "
            f"uuid={self.uuid}, L2_cache_size={self.L2_cache_size // 2**20}MB)"
        )


PROPERTIES = Properties(name="simdist simulated GPU (CPU)", major=9, minor=0, total_memory=80 * _GIB,
                        multi_processor_count=132)  # fmt: skip
"""The device every simulated GPU states it is."""


class Memory:
    """One simulated GPU's memory counters, in bytes and allocations, as torch's caching allocator keeps them."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.current = self.peak = self.count = self.peak_count = 0
        self.allocated = self.freed = self.allocations = self.frees = 0
        self.reserved = self.peak_reserved = 0

    def add(self, nbytes: int) -> None:
        self.current += nbytes
        self.count += 1
        self.allocated += nbytes
        self.allocations += 1
        self.peak = max(self.peak, self.current)
        self.peak_count = max(self.peak_count, self.count)
        if self.current > self.reserved:
            self.reserved = -(-self.current // _BLOCK) * _BLOCK
            self.peak_reserved = max(self.peak_reserved, self.reserved)

    def remove(self, nbytes: int) -> None:
        self.current -= nbytes
        self.count -= 1
        self.freed += nbytes
        self.frees += 1

    def reset_peak(self) -> None:
        self.peak, self.peak_count, self.peak_reserved = self.current, self.count, self.reserved

    def empty_cache(self) -> None:
        self.reserved = -(-self.current // _BLOCK) * _BLOCK

    def stats(self) -> dict[str, int]:
        """``torch.cuda.memory_stats()``: the keys torch's allocator gives for its pools together ("all")."""
        out: dict[str, int] = {}
        families = {
            "allocated_bytes": (self.current, self.peak, self.allocated, self.freed),
            "active_bytes": (self.current, self.peak, self.allocated, self.freed),
            "requested_bytes": (self.current, self.peak, self.allocated, self.freed),
            "reserved_bytes": (self.reserved, self.peak_reserved, self.peak_reserved, self.peak_reserved - self.reserved),
            "allocation": (self.count, self.peak_count, self.allocations, self.frees),
            "active": (self.count, self.peak_count, self.allocations, self.frees),
            "inactive_split": (0, 0, 0, 0),
            "inactive_split_bytes": (0, 0, 0, 0),
            "segment": (self.reserved // _BLOCK, self.peak_reserved // _BLOCK, self.peak_reserved // _BLOCK,
                        (self.peak_reserved - self.reserved) // _BLOCK),
            "oversize_allocations": (0, 0, 0, 0),
            "oversize_segments": (0, 0, 0, 0),
        }  # fmt: skip
        for family, values in families.items():
            for kind, value in zip(("current", "peak", "allocated", "freed"), values):
                for pool in ("all", "large_pool", "small_pool"):
                    out[f"{family}.{pool}.{kind}"] = value if pool != "small_pool" else 0
        out.update(num_alloc_retries=0, num_ooms=0, num_sync_all_streams=0, num_device_alloc=self.allocations,
                   num_device_free=self.frees, max_split_size=-1)  # fmt: skip
        return dict(sorted(out.items()))


class Placed:
    """The tensors one rank placed on its simulated GPUs, and each GPU's :class:`Memory`.

    Storages are told apart by torch's storage identity (which survives ``resize_``). A storage
    counts from when a tensor with it is placed until torch frees it: each placed tensor has a
    weak reference whose callback notes that the storage may be free; it is counted out once its
    own weak reference says so (another tensor, such as a ``Parameter`` made around it, may keep it).
    """

    def __init__(self, capacity: int = PROPERTIES.total_memory):
        self.capacity = capacity
        self.memories: dict[int, Memory] = {}  # made on first use: a rank of a node of 1,000 GPUs uses one or two
        self.tensors: dict[int, tuple[int, int, Any]] = {}  # id(tensor) -> (gpu, storage key, weak reference)
        self.storages: dict[int, list] = {}  # storage key -> [gpu, nbytes, placed tensors alive, StorageWeakRef]
        self.pending: list[int] = []  # storages whose last placed tensor died since the last look
        self.orphans: list[int] = []  # such storages found still alive (another tensor holds them)
        self.lock = threading.RLock()  # tensors may be freed on any thread, or by a collection inside place()

    def memory(self, gpu: int) -> Memory:
        """GPU ``gpu``'s counters."""
        memory = self.memories.get(gpu)
        if memory is None:
            memory = self.memories[gpu] = Memory(self.capacity)
        return memory

    def settle(self, orphans: bool = False) -> None:
        """Count out the storages torch has freed among those whose last placed tensor died (and, with ``orphans``,
        among those found alive before: what the statistics read)."""
        with self.lock:
            keys = self.pending + self.orphans if orphans else self.pending
            if not keys:
                return
            alive = [] if orphans else self.orphans
            for key in keys:
                entry = self.storages.get(key)
                if entry is None or entry[2] > 0:
                    continue
                if entry[3].expired():
                    del self.storages[key]
                    self.memory(entry[0]).remove(entry[1])
                else:
                    alive.append(key)
            self.pending, self.orphans = [], alive

    def gpu_of(self, values: Any) -> int | None:
        """The GPU of the first placed tensor among ``values`` (and the items of lists and tuples in it)."""
        tensors = self.tensors
        for value in values:
            if isinstance(value, torch.Tensor):
                entry = tensors.get(id(value))
                if entry is not None:
                    return entry[0]
            elif isinstance(value, (list, tuple)):
                for item in value:
                    if isinstance(item, torch.Tensor):
                        entry = tensors.get(id(item))
                        if entry is not None:
                            return entry[0]
        return None

    def place(self, value: Any, gpu: int) -> None:
        """Count ``value`` (a tensor, or the tensors of a list or tuple) as on GPU ``gpu``."""
        if isinstance(value, torch.Tensor):
            self._place(value, gpu)
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, torch.Tensor):
                    self._place(item, gpu)

    def _place(self, tensor: torch.Tensor, gpu: int) -> None:
        tensor_id = id(tensor)
        if tensor_id in self.tensors:
            return
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError, TypeError):  # sparse, or a wrapper subclass (DTensor): no storage
            return
        key, nbytes = storage._cdata, -(-storage.nbytes() // _MIN_BLOCK) * _MIN_BLOCK
        with self.lock:
            self.settle()
            entry = self.storages.get(key)
            if entry is not None and entry[3].expired():  # a freed storage's address, reused
                del self.storages[key]
                self.memory(entry[0]).remove(entry[1])
                entry = None
            if entry is None:
                self.storages[key] = [gpu, nbytes, 1, StorageWeakRef(storage)]
                self.memory(gpu).add(nbytes)
            else:
                entry[2] += 1
            self.tensors[tensor_id] = (gpu, key, weakref.ref(tensor, functools.partial(self._freed, tensor_id)))

    def storage_gpu(self, tensor: torch.Tensor) -> int | None:
        """The GPU of ``tensor``'s storage if it is counted (a ``Parameter`` made around a placed tensor)."""
        try:
            entry = self.storages.get(tensor.untyped_storage()._cdata)
        except (RuntimeError, NotImplementedError, TypeError):
            return None
        return None if entry is None or entry[3].expired() else entry[0]

    def unplace(self, tensor: torch.Tensor) -> int | None:
        """Stop counting ``tensor`` (its weak reference goes): the GPU it was on, or ``None`` if it was not placed."""
        return self._drop(id(tensor))

    def _drop(self, tensor_id: int) -> int | None:
        with self.lock:
            entry = self.tensors.pop(tensor_id, None)
            if entry is None:
                return None
            self._count_out(entry[1])
            return entry[0]

    def _count_out(self, key: int) -> None:
        entry = self.storages[key]
        entry[2] -= 1
        if entry[2] == 0:
            self.pending.append(key)

    def _freed(self, tensor_id: int, _: Any = None) -> None:
        self._drop(tensor_id)
