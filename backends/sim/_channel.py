"""What a rank process and its proxy thread exchange: framed messages over a socket, arrays in shared memory.

A frame is a 4-byte little-endian length and a byte counting the file descriptors that travel
beside it (``SCM_RIGHTS``), then a pickle of small values (op names, ranks, shapes, options). Array data never goes into a frame:
the rank process copies each array of a call into memory it shares with the coordinator
(:class:`Arena`: ``memfd`` segments, mapped by both sides) and the frame names where it lies
(:class:`Ref`). The proxy thread hands the engine views of that memory, the engine reads and
writes them as it would the rank's own tensors, and the rank copies the outputs back into its
arrays once the operation has completed. Views that share memory in the rank share memory in
the copy too: the arrays of one call that view one storage are copied as one span of it.
"""

from __future__ import annotations

import array
import ctypes
import mmap
import os
import pickle
import socket
import struct
from typing import Any

import numpy as np
import torch

from simdist.core import Options
from simdist.core import ReduceOp

__all__ = [
    "Channel",
    "ChannelClosed",
    "Arena",
    "Segments",
    "ref",
    "is_ref",
    "pack",
    "unpack",
    "view_of",
    "views_of",
    "copy_back",
    "refresh",
    "options_out",
    "options_in",
]

_LEN = struct.Struct("<IB")
_HEAD = _LEN.size
MAX_FDS = 8
"""File descriptors a frame may carry at most."""
_ANC = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
ALIGN = 64
"""Every array region starts at a multiple of this many bytes (any dtype's alignment)."""
FIRST_SEGMENT = 1 << 20
"""Bytes of a rank's first shared segment; each new one at least doubles."""


class ChannelClosed(EOFError):
    """The other end of a channel closed it (its process ended)."""


class Channel:
    """One end of a framed, bidirectional connection (a ``socketpair`` end); not thread-safe by itself."""

    __slots__ = ("sock", "pending", "fds")

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.pending = bytearray()  # bytes received past the last frame returned
        self.fds: list[int] = []  # descriptors received with those bytes

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, obj: Any, fds: tuple[int, ...] | list[int] = ()) -> None:
        """Send ``obj`` as one frame, with ``fds`` (duplicated into the receiver)."""
        payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        data = _LEN.pack(len(payload), len(fds)) + payload
        if fds:
            sent = self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            if sent < len(data):
                self.sock.sendall(data[sent:])
        else:
            self.sock.sendall(data)

    def ready(self) -> bool:
        """Whether a whole frame has been received already (:meth:`recv` returns it without waiting)."""
        buf = self.pending
        return len(buf) >= _HEAD and len(buf) >= _HEAD + _LEN.unpack_from(buf)[0]

    def recv(self) -> tuple[Any, list[int]]:
        """The next frame and the descriptors that came with it; ``ChannelClosed`` once the other end is gone."""
        buf = self.pending
        if not buf and not self.fds:  # the common case: one frame arrives whole, alone
            try:
                data, anc, _flags, _addr = self.sock.recvmsg(1 << 16, _ANC)
            except ConnectionResetError:
                data, anc = b"", []
            if not anc and len(data) >= _HEAD:
                n, nfds = _LEN.unpack_from(data)
                if len(data) == _HEAD + n and not nfds:
                    return pickle.loads(memoryview(data)[_HEAD:]), []
            self._took(data, anc)
        while len(buf) < _HEAD or len(buf) < _HEAD + _LEN.unpack_from(buf)[0]:
            try:
                data, anc, _flags, _addr = self.sock.recvmsg(1 << 16, _ANC)
            except ConnectionResetError:
                data, anc = b"", []
            self._took(data, anc)
        n, nfds = _LEN.unpack_from(buf)
        obj = pickle.loads(buf[_HEAD : _HEAD + n])
        del buf[: _HEAD + n]
        fds, self.fds = self.fds[:nfds], self.fds[nfds:]
        return obj, fds

    def _took(self, data: bytes, anc: list) -> None:
        if not data:
            raise ChannelClosed("the other end closed the connection")
        for level, kind, raw in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                got = array.array("i")
                got.frombytes(raw[: len(raw) - len(raw) % got.itemsize])
                self.fds.extend(got)
        self.pending += data

    def close(self) -> None:
        self.sock.close()


# -- shared memory ---------------------------------------------------------------------------------------------


class _Segment:
    """One shared ``memfd`` mapping and a uint8 tensor over all of it; ``typed`` views by dtype."""

    __slots__ = ("id", "size", "map", "bytes", "address", "typed", "views", "top", "live")

    def __init__(self, seg_id: int, size: int, fd: int):
        self.id, self.size = seg_id, size
        self.map = mmap.mmap(fd, size)
        self.bytes = torch.frombuffer(self.map, dtype=torch.uint8)
        self.address = self.bytes.data_ptr()
        self.typed: dict[torch.dtype, torch.Tensor] = {torch.uint8: self.bytes}
        self.views: dict[tuple, torch.Tensor] = {}  # made by _view, by where they lie
        self.top = 0  # the arena's bump pointer (rank side)
        self.live = 0  # regions handed out and not freed (rank side)

    def view(self, dtype: torch.dtype) -> torch.Tensor:
        """The whole segment as a 1-D tensor of ``dtype`` (its size is a multiple of every itemsize)."""
        t = self.typed.get(dtype)
        if t is None:
            t = self.typed[dtype] = self.bytes.view(dtype)
        return t


class Arena:
    """The rank process's shared memory: regions handed out per call, freed once the call is over.

    Each segment is a bump allocator that starts over once every region in it is freed; a
    region that does not fit opens a new segment (at least twice the size), announced to the
    coordinator with the next frame (:meth:`take_news`). A segment that is neither the newest
    nor in use is dropped on both sides.
    """

    def __init__(self) -> None:
        self.segments: dict[int, _Segment] = {}
        self.current: _Segment | None = None
        self.news: list[tuple] = []  # ("segment", id, size) / ("drop", id) for the coordinator
        self.news_fds: list[int] = []
        self._ids = 0

    def alloc(self, nbytes: int) -> tuple[_Segment, int]:
        """A region of at least ``nbytes`` bytes: its segment and byte offset (aligned to ``ALIGN``)."""
        need = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        seg = self.current
        if seg is not None and seg.live == 0:
            seg.top = 0
        if seg is None or seg.top + need > seg.size:
            seg = self._open(max(FIRST_SEGMENT, 2 * (seg.size if seg else 0), 1 << (need - 1).bit_length()))
        offset = seg.top
        seg.top += need
        seg.live += 1
        return seg, offset

    def free(self, seg: _Segment) -> None:
        """Give back one region of ``seg``."""
        seg.live -= 1
        if seg.live == 0 and seg is not self.current:
            del self.segments[seg.id]
            self.news.append(("drop", seg.id))

    def _open(self, size: int) -> _Segment:
        old = self.current
        self._ids += 1
        fd = os.memfd_create(f"simdist-rank-{self._ids}", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        seg = _Segment(self._ids, size, fd)
        self.segments[seg.id] = self.current = seg
        self.news.append(("segment", seg.id, size))
        self.news_fds.append(fd)
        if old is not None and old.live == 0:
            del self.segments[old.id]
            self.news.append(("drop", old.id))
        return seg

    def take_news(self) -> tuple[list[tuple], list[int]]:
        """The segments opened and dropped since the last call, and the descriptors of the opened ones."""
        news, fds = self.news, self.news_fds
        self.news, self.news_fds = [], []
        return news, fds


class Segments:
    """The coordinator's mapping of one rank's segments, kept up to date from the rank's news."""

    def __init__(self) -> None:
        self.by_id: dict[int, _Segment] = {}

    def apply(self, news: list[tuple], fds: list[int]) -> None:
        fds = list(fds)
        for item in news:
            if item[0] == "segment":
                fd = fds.pop(0)
                try:
                    self.by_id[item[1]] = _Segment(item[1], item[2], fd)
                finally:
                    os.close(fd)
            else:
                self.by_id.pop(item[1], None)


# -- arrays of a call ------------------------------------------------------------------------------------------

REF = "@simdist-array"
"""The first item of a :func:`ref` tuple."""
VIEWS_KEPT = 256
"""Views of shared memory a segment keeps made, by where they lie (a rank's calls reuse the same few places)."""

_DTYPES: dict[str, Any] = {str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)}


def ref(seg: int, elem: int, dtype: str, shape: tuple, stride: tuple, numpy: bool) -> tuple:
    """Where one array of a call lies in shared memory, as a plain tuple (cheap to pickle).

    ``elem`` is the array's first element within segment ``seg``, in elements of ``dtype`` (a
    torch dtype's name; for a loose copy, ``stride`` is empty, ``elem`` a byte offset and
    ``dtype`` a numpy dtype's); ``shape``/``stride`` are the array's own; ``numpy`` says the
    rank passed a numpy array.
    """
    return (REF, seg, elem, dtype, shape, stride, numpy)


def is_ref(value: Any) -> bool:
    return type(value) is tuple and len(value) == 7 and value[0] == REF


def _as_tensor(x: Any) -> torch.Tensor | None:
    """``x`` as a torch tensor sharing its memory (a numpy array through ``from_numpy``), else ``None``."""
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, np.ndarray):
        try:
            return torch.from_numpy(x)
        except (TypeError, ValueError):  # a dtype torch lacks, negative strides: not shareable as is
            return None
    return None


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The elements of ``t``'s storage that ``t`` covers: ``[first, end)`` (empty for an empty tensor)."""
    start, numel = int(t.storage_offset()), int(t.numel())
    if t.is_contiguous():
        return start, start + numel
    if numel == 0:
        return start, start
    return start, start + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1


def _arrays(value: Any, out: list) -> None:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _arrays(v, out)


def _view(seg: _Segment, dtype: torch.dtype, name: str, shape: Any, stride: tuple, elem: int) -> torch.Tensor:
    """The view of ``seg`` at element ``elem`` of ``dtype`` with ``shape``/``stride``, made once and kept."""
    key = (elem, name, tuple(shape), stride)
    view = seg.views.get(key)
    if view is None:
        if len(seg.views) >= VIEWS_KEPT:
            seg.views.clear()
        view = seg.views[key] = seg.view(dtype).as_strided(shape, stride, elem)
    return view


def pack(args: tuple, arena: Arena) -> tuple[tuple, list, dict]:
    """``args`` with every array replaced by a :func:`ref` to a shared copy of it.

    Returns the packed arguments, the regions used (to free once the call is over) and, by
    ``id`` of each array passed, its shared view (to copy results back from).
    """
    found: list = []
    _arrays(args, found)
    if not found:
        return args, [], {}
    if len(found) == 1 and type(found[0]) is torch.Tensor:
        return _pack_one(args, found[0], arena)
    views: dict[int, Any] = {}
    refs: dict[int, tuple] = {}
    regions: list = []
    groups: dict[Any, list] = {}  # (storage address, dtype) -> its tensors: one region for views of one storage
    for x in found:
        if id(x) in refs:
            continue
        t = _as_tensor(x)
        if t is None or (not t.is_cpu and not t.is_cuda):
            _pack_loose(x, arena, regions, refs, views)
            continue
        if t.requires_grad:
            t = t.detach()
        if len(found) == 1:
            groups = {None: [(x, t)]}  # (one array: no storage to compare)
            break
        groups.setdefault((t.untyped_storage().data_ptr(), t.dtype), []).append((x, t))
    for members in groups.values():
        t0 = members[0][1]
        if len(members) == 1:
            lo, hi = _span(t0)
        else:
            spans = [_span(t) for _x, t in members]
            lo, hi = min(s[0] for s in spans), max(s[1] for s in spans)
        dtype = t0.dtype
        name = _dtype_name(dtype)
        itemsize = t0.element_size()
        seg, offset = arena.alloc((hi - lo) * itemsize)
        regions.append(seg)
        base = offset // itemsize - lo
        for x, t in members:
            shape, stride, elem = t.shape, t.stride(), base + t.storage_offset()
            view = _view(seg, dtype, name, shape, stride, elem)
            view.copy_(t)
            refs[id(x)] = (REF, seg.id, elem, name, tuple(shape), stride, x is not t and isinstance(x, np.ndarray))
            views[id(x)] = view
    return _replace(args, refs), regions, views


def _pack_one(args: tuple, t: torch.Tensor, arena: Arena) -> tuple[tuple, list, dict]:
    """:func:`pack` of a call with one array, a plain tensor (most calls): the same result, fewer steps.

    A contiguous CPU tensor is copied as bytes (``memmove``), without a tensor view of the copy;
    its "view" is then ``(address, nbytes)``, which :func:`copy_back` and :func:`refresh` accept.
    """
    if not t.is_cpu and not t.is_cuda:
        refs: dict[int, tuple] = {}
        views: dict[int, Any] = {}
        regions: list = []
        _pack_loose(t, arena, regions, refs, views)
        return _replace(args, refs), regions, views
    x = t.detach() if t.requires_grad else t
    dtype = x.dtype
    itemsize = x.element_size()
    if x.is_cpu and x.is_contiguous():
        nbytes = x.numel() * itemsize
        seg, offset = arena.alloc(nbytes)
        if nbytes:
            _memmove(seg.address + offset, x.data_ptr(), nbytes)
        view: Any = (seg.address + offset, nbytes)
        r = (REF, seg.id, offset // itemsize, _NAMES[dtype], tuple(x.shape), x.stride(), False)
    else:
        lo, hi = _span(x)
        seg, offset = arena.alloc((hi - lo) * itemsize)
        shape, stride, elem = x.shape, x.stride(), offset // itemsize - lo + int(x.storage_offset())
        name = _NAMES[dtype]
        view = _view(seg, dtype, name, shape, stride, elem)
        view.copy_(x)
        r = (REF, seg.id, elem, name, tuple(shape), stride, False)
    packed = (r, *args[1:]) if args[0] is t else _replace(args, {id(t): r})
    return packed, [seg], {id(t): view}


_memmove = ctypes.memmove


_NAMES: dict[torch.dtype, str] = {d: n for n, d in _DTYPES.items()}


def _dtype_name(dtype: torch.dtype) -> str:
    return _NAMES[dtype]


def _pack_loose(x: Any, arena: Arena, regions: list, refs: dict, views: dict) -> None:
    """Copy ``x`` alone, contiguous: a numpy array that torch cannot view, an array of another device."""
    c = np.ascontiguousarray(x.cpu() if isinstance(x, torch.Tensor) else x)
    seg, offset = arena.alloc(c.nbytes)
    regions.append(seg)
    seg.bytes[offset : offset + c.nbytes].copy_(torch.from_numpy(c.view(np.uint8).reshape(-1)))
    refs[id(x)] = ref(seg.id, offset, c.dtype.str, tuple(c.shape), (), True)
    views[id(x)] = seg.bytes[offset : offset + c.nbytes]


def _replace(value: Any, refs: dict[int, tuple]) -> Any:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return refs[id(value)]
    if isinstance(value, list):
        return [_replace(v, refs) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_replace(v, refs) for v in value)
    return value


def view_of(r: tuple, segments: dict[int, _Segment]) -> Any:
    """The array ``r`` (a :func:`ref`) names, as a view of shared memory (a numpy array where the rank passed one)."""
    _, seg_id, elem, name, shape, stride, numpy = r
    seg = segments[seg_id]
    if not stride and numpy and name not in _DTYPES:  # a loose numpy copy
        dtype = np.dtype(name)
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return np.frombuffer(seg.map, dtype=np.uint8, count=n, offset=elem).view(dtype).reshape(shape)
    t = _view(seg, _DTYPES[name], name, shape, stride, elem)
    return t.numpy() if numpy else t


def unpack(value: Any, segments: dict[int, _Segment]) -> Any:
    """``value`` with every :func:`ref` replaced by its view (the coordinator's side of :func:`pack`)."""
    if type(value) is tuple:
        if len(value) == 7 and value[0] == REF:
            return view_of(value, segments)
        return tuple(unpack(v, segments) for v in value)
    if type(value) is list:
        return [unpack(v, segments) for v in value]
    return value


def views_of(value: Any, views: dict[int, Any]) -> list[tuple[Any, Any]]:
    """``(array, its shared view)`` for every array in ``value`` (an output argument of a call)."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return [(value, views[id(value)])]
    found: list = []
    _arrays(value, found)
    return [(x, views[id(x)]) for x in found]


def copy_back(pairs: list[tuple[Any, Any]]) -> None:
    """Copy each shared view into the rank's array it stands for (through a detached view, as the engine writes)."""
    for x, view in pairs:
        if type(view) is tuple:  # (address, nbytes) of a contiguous CPU tensor's copy
            if view[1]:
                _memmove(x.data_ptr(), view[0], view[1])
        elif isinstance(x, torch.Tensor):
            if x.is_cpu or x.is_cuda:
                (x.detach() if x.requires_grad else x).copy_(view)
            else:  # a loose copy (another device): its bytes
                x.detach().copy_(view.view(x.dtype).reshape(x.shape))
        elif isinstance(view, torch.Tensor) and view.dtype is torch.uint8 and x.dtype != np.uint8:
            np.copyto(x, view.numpy().view(x.dtype).reshape(x.shape))
        else:
            np.copyto(x, view.numpy() if isinstance(view, torch.Tensor) else view)


def refresh(pairs: list[tuple[Any, Any]]) -> None:
    """Copy each of the rank's arrays into its shared view again (what the buffer check compares)."""
    for x, view in pairs:
        t = _as_tensor(x)
        if type(view) is tuple:
            if view[1]:
                _memmove(view[0], x.data_ptr(), view[1])
        elif t is not None and view.dtype is t.dtype:
            view.copy_(t.detach())
        else:
            view.copy_(torch.from_numpy(np.ascontiguousarray(x).view(np.uint8).reshape(-1)))


def options_out(opts: Options) -> tuple:
    """An ``Options`` as a plain tuple (its reduction by name)."""
    op = opts.op
    return (None if op is None else op.value, opts.root, opts.algorithm, opts.async_op, opts.call_site, opts.tag)


def options_in(wire: tuple) -> Options:
    """The ``Options`` that :func:`options_out` gave ``wire``."""
    op = wire[0]
    return Options(None if op is None else ReduceOp(op), *wire[1:])
