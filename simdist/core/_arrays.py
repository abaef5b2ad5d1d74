"""The array adapter: the only module that switches on the array type.

Backends and algorithms see *flat buffers*: contiguous one-dimensional arrays (torch
tensors, numpy arrays or cupy arrays) that share memory with what the user passed, or a
staging copy that is written back when the operation completes. Everything that depends
on the array type lives here: dtype names, views, copies and the reductions.

cupy arrays follow numpy's interface, so they take numpy's paths, with cupy's module
(:func:`_xp`) where a function makes or combines arrays. cupy is never imported here:
a cupy array can only exist once its user has imported cupy.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

from ._reduce_op import ReduceOp

__all__ = [
    "Array",
    "is_array",
    "check_array",
    "check_writable",
    "dtype_name",
    "shape_of",
    "nbytes",
    "itemsize",
    "numel",
    "device_of",
    "flat",
    "stage_in",
    "stage_copy",
    "changed_bytes",
    "may_overlap",
    "shares_memory",
    "overlap_span",
    "byte_bounds",
    "values_view",
    "stage_out",
    "empty",
    "zeros",
    "narrow",
    "blocks",
    "byte_view",
    "host_bytes",
    "on_host",
    "host_empty",
    "as_tensor",
    "copy_",
    "snapshot",
    "reduce_",
    "average_",
    "check_reduce_op",
    "to_numpy",
    "uint8_from_bytes",
    "concat",
    "split_into",
    "split_counts",
]

Array = Any  # torch.Tensor | numpy.ndarray | cupy.ndarray

_Tensor = torch.Tensor
_FLOATS = {"float16", "bfloat16", "float32", "float64"}
_BITWISE = {ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR}


def _is_cupy(x: object) -> bool:
    return type(x).__module__.startswith("cupy") and type(x).__name__ == "ndarray"


def _xp(x: Array) -> Any:
    """The array module of a numpy or cupy array: ``numpy``, or ``cupy`` for a device array."""
    if _is_cupy(x):
        import cupy

        return cupy
    return np


def is_array(x: object) -> bool:
    """True if ``x`` is an array simdist can communicate (a torch tensor, a numpy or a cupy array)."""
    return isinstance(x, (torch.Tensor, np.ndarray)) or _is_cupy(x)


def check_array(x: Any, argname: str) -> None:
    """Raise ``TypeError`` naming ``argname`` unless ``x`` is a supported array."""
    if not is_array(x):
        raise TypeError(
            f"{argname} must be a torch.Tensor, numpy.ndarray or cupy.ndarray, got {type(x).__name__} ({x!r:.60})"
        )
    if isinstance(x, torch.Tensor):
        if x.layout is torch.strided and not x.is_quantized and not x.is_meta:
            return
        if x.layout is not torch.strided:
            raise TypeError(
                f"{argname} must be a dense (strided) tensor, got layout {x.layout}: simdist moves dense "
                "tensors only; convert it with .to_dense() (and back with .to_sparse())"
            )
        if x.is_quantized:
            raise TypeError(f"{argname} is a quantized tensor (dtype {dtype_name(x)}); send its int_repr() instead")
        if x.device.type == "meta":
            raise TypeError(f"{argname} is on device 'meta' and holds no data (shape {tuple(x.shape)})")
    elif x.dtype == object:
        raise TypeError(f"{argname} has dtype object; only numeric and bool arrays can be sent")


def check_writable(x: Array, argname: str) -> None:
    """Raise ``ValueError`` naming ``argname`` if results cannot be written into ``x``.

    That is a read-only numpy array, or a tensor whose elements share memory (an
    ``expand``-ed tensor: a stride of 0 on a dimension of size > 1). Checked when the
    call is made, so the error belongs to the calling rank, before anything is sent.
    """
    if isinstance(x, torch.Tensor):
        if x.is_contiguous():  # (the common case: no stride of 0 on a dimension of size > 1 unless empty)
            return
        if x.numel() > 1 and any(st == 0 and sz > 1 for st, sz in zip(x.stride(), x.shape)):
            raise ValueError(
                f"{argname} has elements that share memory (shape {tuple(x.shape)}, strides {x.stride()}, "
                "as an expand()-ed tensor has); results cannot be written into it: pass a .clone()"
            )
    elif isinstance(x, np.ndarray) and not x.flags.writeable:
        raise ValueError(f"{argname} is a read-only numpy array (shape {x.shape}); results cannot be written into it")


def dtype_name(x: Array) -> str:
    """The dtype as a plain name shared by torch and numpy: ``'float32'``, ``'bfloat16'``, ``'bool'``."""
    dtype = x.dtype
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


_DTYPE_NAMES: dict = {}


def shape_of(x: Array) -> tuple[int, ...]:
    return tuple(x.shape)


def numel(x: Array) -> int:
    if type(x) is _Tensor or isinstance(x, _Tensor):  # (the first test alone is the common, quick case)
        return x.numel()
    return int(x.size)


def itemsize(x: Array) -> int:
    """Bytes per element."""
    if type(x) is _Tensor or isinstance(x, _Tensor):
        return x.element_size()
    return int(x.itemsize)


def nbytes(x: Array) -> int:
    """Bytes of the elements (torch tensors, numpy and cupy arrays all say it as ``nbytes``)."""
    return x.nbytes


def device_of(x: Array) -> str:
    """``'cpu'`` for numpy arrays and CPU tensors, else the array's device (``'cuda:0'``)."""
    if isinstance(x, torch.Tensor):
        return "cpu" if x.is_cpu else str(x.device)
    return f"cuda:{x.device.id}" if _is_cupy(x) else "cpu"


def _is_contiguous(x: Array) -> bool:
    if isinstance(x, torch.Tensor):
        return x.is_contiguous()
    return bool(x.flags.c_contiguous)


def flat(x: Array) -> Array:
    """A contiguous 1-D view of ``x`` sharing its memory; ``ValueError`` if ``x`` is not contiguous."""
    if not _is_contiguous(x):
        raise ValueError("flat() needs a contiguous array; use stage_in/stage_out")
    if isinstance(x, torch.Tensor):
        return _flat_tensor(x)
    return x.reshape(-1)


def _flat_tensor(x: torch.Tensor) -> torch.Tensor:
    """``x`` (contiguous) as a 1-D view with stride 1; torch keeps any stride on a dimension of size 1.
    A plain tensor that already is one, without autograd, is its own view (two torch calls fewer a message)."""
    if type(x) is _Tensor and not x.requires_grad and x.dim() == 1 and x.stride(0) == 1:
        return x
    v = x.detach().view(-1)
    return v if v.numel() > 1 or v.stride(0) == 1 else v.as_strided((v.numel(),), (1,))


def stage_in(x: Array) -> Array:
    """A flat buffer holding ``x``'s values: a view if ``x`` is contiguous, else a copy."""
    if isinstance(x, torch.Tensor) and x.is_contiguous():
        return _flat_tensor(x)
    if _is_contiguous(x):
        return flat(x)
    if isinstance(x, torch.Tensor):
        return x.detach().contiguous().view(-1)
    return _xp(x).ascontiguousarray(x).reshape(-1)


def stage_copy(x: Array) -> Array:
    """A flat buffer holding a copy of ``x``'s values; unlike :func:`stage_in`, never ``x``'s own memory."""
    if isinstance(x, torch.Tensor):
        return _flat_tensor(x.detach().clone(memory_format=torch.contiguous_format))
    return x.flatten()  # numpy and cupy: always a copy, in C order


def changed_bytes(before: Array, after: Array) -> tuple[int, int] | None:
    """The first and the last byte at which flat buffers ``before`` and ``after`` differ; ``None`` if none does.

    Bytes, not values: a NaN equals itself here, and ``-0.0`` differs from ``0.0``.
    """
    if nbytes(before) == 0:
        return None
    if device_of(before) == "cpu" and device_of(after) == "cpu":
        if type(before) is _Tensor and type(after) is _Tensor:  # (the common case: one call into torch)
            if torch.equal(before.view(torch.uint8), after.view(torch.uint8)):
                return None
            a, b = host_bytes(before), host_bytes(after)
        else:
            a, b = host_bytes(before), host_bytes(after)
            if a.tobytes() == b.tobytes() if a.size <= 16384 else np.array_equal(a, b):  # each the faster at its size
                return None
        diff = np.flatnonzero(a != b)
    else:
        ta, tb = _torch_bytes(before), _torch_bytes(after)
        if torch.equal(ta, tb):
            return None
        diff = torch.nonzero(ta != tb).flatten().cpu().numpy()
    return int(diff[0]), int(diff[-1])


def _byte_bounds(x: Array) -> tuple[int, int] | None:
    """The first and one-past-last byte addresses ``x`` can touch (``None`` if it is empty)."""
    if numel(x) == 0:
        return None
    if isinstance(x, torch.Tensor):
        size = x.element_size()
        if x.is_contiguous():
            ptr = x.data_ptr()
            return ptr, ptr + x.numel() * size
        ptr, strides = x.data_ptr(), [s * size for s in x.stride()]
    else:
        size = x.itemsize
        ptr, strides = x.__array_interface__["data"][0] if not _is_cupy(x) else x.data.ptr, list(x.strides)
    low = ptr + sum(st * (n - 1) for st, n in zip(strides, x.shape) if st < 0)
    high = ptr + sum(st * (n - 1) for st, n in zip(strides, x.shape) if st > 0) + size
    return low, high


byte_bounds = _byte_bounds


def may_overlap(a: Array, b: Array) -> bool:
    """Whether the memory of ``a`` and ``b`` may overlap (a conservative test on byte ranges)."""
    ba, bb = _byte_bounds(a), _byte_bounds(b)
    return ba is not None and bb is not None and ba[0] < bb[1] and bb[0] < ba[1]


def shares_memory(a: Array, b: Array) -> bool:
    """Whether ``a`` and ``b`` have a byte of memory in common: exact for host arrays (interleaved views of
    one buffer share none), else :func:`may_overlap`."""
    if not may_overlap(a, b):
        return False
    ha, hb = _host_array(a), _host_array(b)
    if ha is None or hb is None:
        return True
    try:
        return bool(np.shares_memory(ha, hb))
    except Exception:  # numpy's TooHardError (its module moved between releases): the answer is not known
        return True


def _host_array(x: Array) -> np.ndarray | None:
    """``x``'s own memory as a numpy array, where it is in host memory and numpy has its dtype, else ``None``."""
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, torch.Tensor) and x.device.type == "cpu":
        try:
            return x.detach().numpy()
        except TypeError:  # a dtype numpy lacks (bfloat16, ...)
            return None
    return None


def overlap_span(view: Array, base: Array, bounds: tuple[int, int] | None | bool = False) -> tuple[int, int] | None:
    """The elements ``base[i:j]`` of flat buffer ``base`` that ``view`` may touch, as ``(i, j)``.

    ``None`` if they share no memory; the span is rounded out to whole elements of ``base``.
    ``bounds``: ``base``'s :func:`byte_bounds`, where the caller keeps them (``False``: computed here).
    """
    bv = _byte_bounds(view)
    bb = _byte_bounds(base) if bounds is False or bounds is True else bounds
    if bv is None or bb is None or not (bv[0] < bb[1] and bb[0] < bv[1]):
        return None
    size = itemsize(base)
    return (max(bv[0], bb[0]) - bb[0]) // size, -(-(min(bv[1], bb[1]) - bb[0]) // size)


def stage_out(x: Array) -> tuple[Array, Callable[[], None] | None]:
    """A flat buffer to receive into ``x``, and the write-back to call once it is filled.

    For contiguous ``x`` the buffer is a view and the write-back is ``None``. For a
    non-contiguous ``x`` (a transposed or sliced tensor) the buffer is a contiguous
    copy, and the write-back copies it into ``x`` element by element.
    """
    if isinstance(x, torch.Tensor) and x.is_contiguous():
        return _flat_tensor(x), None
    if _is_contiguous(x):
        return flat(x), None
    buf = stage_in(x)
    if isinstance(x, torch.Tensor):
        target = x.detach()

        def write_back() -> None:
            target.copy_(buf.view(target.shape))

        return buf, write_back
    return buf, lambda: _xp(x).copyto(x, buf.reshape(x.shape))


def empty(like: Array, n: int) -> Array:
    """A new flat buffer of ``n`` uninitialized elements of ``like``'s kind, dtype and device."""
    if isinstance(like, torch.Tensor):
        return like.new_empty(n)
    return _xp(like).empty(n, dtype=like.dtype)


def zeros(like: Array, n: int) -> Array:
    """A new flat buffer of ``n`` zeros of ``like``'s kind, dtype and device.

    For buffers whose values a trace may snapshot before they are filled.
    """
    if isinstance(like, torch.Tensor):
        return torch.zeros(n, dtype=like.dtype, device=like.device)
    return _xp(like).zeros(n, dtype=like.dtype)


def narrow(buf: Array, start: int, length: int) -> Array:
    """The view ``buf[start:start + length]`` of a flat buffer."""
    return buf[start : start + length]


def blocks(buf: Array, counts: Sequence[int]) -> list:
    """Views of consecutive blocks of flat buffer ``buf``, ``counts[i]`` elements each, from its start.

    The same views as :func:`narrow` gives, made at once (for a tensor, one call into torch).
    """
    if isinstance(buf, torch.Tensor) and sum(counts) == buf.numel():
        return list(buf.split_with_sizes(counts))
    out, start = [], 0
    for n in counts:
        out.append(buf[start : start + n])
        start += n
    return out


def byte_view(buf: Array) -> Array:
    """Flat buffer ``buf`` seen as ``uint8`` bytes (same memory, same array kind and device: torch, numpy, cupy)."""
    if isinstance(buf, torch.Tensor):
        if buf.numel() == 0:  # torch refuses to view an empty buffer whose stride is 0 (as numpy's can be)
            return buf.new_empty(0, dtype=torch.uint8)
        return buf.view(torch.uint8)
    return buf.view(np.uint8)


def host_bytes(buf: Array) -> np.ndarray:
    """The bytes of a flat buffer in host memory, as a numpy uint8 array sharing its memory."""
    if isinstance(buf, torch.Tensor):
        return buf.view(torch.uint8).numpy()
    return buf.view(np.uint8)


_NUMPY_DTYPES = frozenset(
    {
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.float32,
        torch.float64,
    }
)


def plain_bytes(x: Any) -> memoryview | None:
    """The bytes of ``x`` as a flat memoryview sharing its memory, if ``x`` is a contiguous CPU tensor of a
    dtype numpy has, without autograd (the common case, in three torch calls fewer); else ``None``."""
    if (
        type(x) is _Tensor
        and x.dtype in _NUMPY_DTYPES
        and x.is_cpu
        and not x.requires_grad
        and x.layout is torch.strided
        and x.is_contiguous()
    ):
        return x.numpy().data.cast("B")
    return None


def on_host(buf: Array) -> Array:
    """``buf`` itself if it is in host memory, else a host copy of it (for a transport that sends host bytes)."""
    if device_of(buf) == "cpu":
        return buf
    return buf.cpu() if isinstance(buf, torch.Tensor) else buf.get()


def host_empty(like: Array) -> Array:
    """A flat host buffer of ``like``'s dtype and length (to receive what goes to device buffer ``like``)."""
    if isinstance(like, torch.Tensor):
        return torch.empty(like.numel(), dtype=like.dtype)
    return np.empty(like.size, dtype=like.dtype)


def as_tensor(flat: Array) -> torch.Tensor:
    """Flat buffer ``flat`` as a torch tensor sharing its memory (a copy for a read-only numpy array)."""
    if isinstance(flat, torch.Tensor):
        return flat
    if _is_cupy(flat):
        return torch.from_dlpack(flat)
    return torch.from_numpy(flat if flat.flags.writeable else flat.copy())


def _torch_bytes(buf: Array) -> torch.Tensor:
    """The bytes of any flat buffer as a uint8 tensor on its device (sharing its memory)."""
    if isinstance(buf, torch.Tensor):
        return buf.view(torch.uint8)
    if _is_cupy(buf):
        return torch.from_dlpack(buf.view(np.uint8))
    return torch.from_numpy(buf.view(np.uint8))


def copy_(dst: Array, src: Array) -> None:
    """Copy the bytes of flat buffer ``src`` into flat buffer ``dst`` (same byte size, any devices)."""
    if type(dst) is _Tensor and type(src) is _Tensor and dst.dtype is src.dtype:  # the common case, first
        dst.copy_(src)
        return
    if isinstance(dst, torch.Tensor) or isinstance(src, torch.Tensor):
        if isinstance(dst, torch.Tensor) and isinstance(src, torch.Tensor) and dst.dtype == src.dtype:
            dst.copy_(src)
        else:
            _torch_bytes(dst).copy_(_torch_bytes(src))
        return
    d, s = byte_view(dst), byte_view(src)
    if isinstance(d, np.ndarray) and not isinstance(s, np.ndarray):
        s.get(out=d)  # cupy device memory to host
    else:
        _xp(d).copyto(d, _xp(d).asarray(s))


def snapshot(buf: Array, limit: int = 64) -> list:
    """Up to ``limit`` leading values of a flat buffer, as plain Python numbers (for traces)."""
    head = buf[:limit] if numel(buf) > limit else buf
    if isinstance(head, torch.Tensor):
        if head.dtype in (torch.bfloat16, torch.float16):
            head = head.float()
        return head.cpu().tolist()
    return head.tolist()


_EXACT: dict[Any, str] = {  # torch dtype -> the typecode of an ``array.array`` holding each of its values exactly
    **dict.fromkeys((torch.float16, torch.float32, torch.float64), "d"),
    **dict.fromkeys((torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.uint16, torch.uint32), "q"),
}


def values_view(buf: Array, limit: int = 64) -> tuple[str, np.ndarray] | None:
    """The leading ``limit`` values of flat buffer ``buf`` as a numpy view of its memory (later writes show in it).

    With it, the typecode of an ``array.array`` that holds each value exactly: ``'d'``
    (float64) for float16/32/64, ``'q'`` (int64) for signed and up to 32-bit unsigned
    integers; its values are :func:`snapshot`'s numbers. ``None`` for anything else (a
    bfloat16, uint64, bool or complex dtype, an empty buffer, a numpy or GPU array): use
    :func:`snapshot` there.
    """
    if type(buf) is not _Tensor or not buf.is_cpu:
        return None
    code = _EXACT.get(buf.dtype)
    if code is None or buf.numel() == 0:
        return None
    head = buf[:limit] if buf.numel() > limit else buf
    return code, (head.detach() if head.requires_grad else head).numpy()


def to_numpy(x: Array) -> np.ndarray:
    """A numpy copy of ``x`` (bfloat16 becomes float32), for references and reports."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.dtype == torch.bfloat16:
            x = x.float()
        return x.numpy().copy()
    if _is_cupy(x):
        return x.get()
    return np.array(x, copy=True)


def uint8_from_bytes(data: bytes) -> torch.Tensor:
    """A uint8 CPU tensor holding ``data`` (used to send pickled objects)."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


_TORCH_REDUCIBLE = {
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
}


def check_reduce_op(x: Array, op: ReduceOp, argname: str = "op") -> None:
    """Raise ``TypeError`` if ``op`` cannot reduce ``x``'s dtype (AVG on integers, bitwise on floats,
    any reduction on dtypes without arithmetic: torch's float8 and uint16-64, numpy strings and dates)."""
    key = (x.dtype, op._name_)
    if key in _REDUCES:
        return
    name = dtype_name(x)
    if isinstance(x, torch.Tensor) and x.dtype not in _TORCH_REDUCIBLE:
        raise TypeError(f"{argname}={op!r} cannot reduce dtype {name}: torch has no CPU arithmetic for it")
    if isinstance(x, np.ndarray) and x.dtype.kind not in "biufc":
        raise TypeError(f"{argname}={op!r} cannot reduce numpy dtype {name}; only numbers and bools reduce")
    floating = name in _FLOATS or name.startswith("complex")
    if op is ReduceOp.AVG and not floating:
        raise TypeError(f"{argname}=ReduceOp.AVG needs a floating-point dtype, got {name}")
    if op in _BITWISE and floating:
        raise TypeError(f"{argname}={op!r} needs an integer or bool dtype, got {name}")
    if name.startswith("complex") and op in (ReduceOp.MIN, ReduceOp.MAX):
        raise TypeError(f"{argname}={op!r} is not defined for complex dtype {name}")
    _REDUCES.add(key)


_REDUCES: set[tuple[Any, str]] = set()  # (dtype, op name) pairs already found to reduce: each is checked once


_TORCH_OPS: dict[ReduceOp, Callable[..., Any]] = {
    ReduceOp.SUM: torch.add,
    ReduceOp.PRODUCT: torch.mul,
    ReduceOp.MIN: torch.minimum,
    ReduceOp.MAX: torch.maximum,
    ReduceOp.BAND: torch.bitwise_and,
    ReduceOp.BOR: torch.bitwise_or,
    ReduceOp.BXOR: torch.bitwise_xor,
}
_TORCH_BOOL_OPS: dict[ReduceOp, Callable[..., Any]] = {
    ReduceOp.SUM: torch.logical_or,
    ReduceOp.PRODUCT: torch.logical_and,
    ReduceOp.MIN: torch.logical_and,
    ReduceOp.MAX: torch.logical_or,
    ReduceOp.BAND: torch.logical_and,
    ReduceOp.BOR: torch.logical_or,
    ReduceOp.BXOR: torch.logical_xor,
}
_NUMPY_OPS = {
    ReduceOp.SUM: np.add,
    ReduceOp.PRODUCT: np.multiply,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.BAND: np.bitwise_and,
    ReduceOp.BOR: np.bitwise_or,
    ReduceOp.BXOR: np.bitwise_xor,
}
_NUMPY_BOOL_OPS = {
    ReduceOp.SUM: np.logical_or,
    ReduceOp.PRODUCT: np.logical_and,
    ReduceOp.MIN: np.logical_and,
    ReduceOp.MAX: np.logical_or,
    ReduceOp.BAND: np.logical_and,
    ReduceOp.BOR: np.logical_or,
    ReduceOp.BXOR: np.logical_xor,
}


def _by_name(table: dict) -> dict:
    """``table`` keyed by the ops' names, ``AVG`` as ``SUM`` (an Enum member hashes in Python code, its name in C)."""
    return {"AVG": table[ReduceOp.SUM], **{op._name_: fn for op, fn in table.items()}}


_TORCH_BY_NAME = _by_name(_TORCH_OPS)
_TORCH_BOOL_BY_NAME = _by_name(_TORCH_BOOL_OPS)


def reduce_(dst: Array, src: Array, op: ReduceOp) -> None:
    """``dst = dst (op) src`` element-wise, in place. ``AVG`` reduces as ``SUM`` (see :func:`average_`)."""
    if type(dst) is _Tensor and type(src) is _Tensor:  # the common case, first
        table = _TORCH_BOOL_BY_NAME if dst.dtype is torch.bool else _TORCH_BY_NAME
        table[op._name_](dst, src, out=dst)
        return
    if op is ReduceOp.AVG:
        op = ReduceOp.SUM
    if isinstance(dst, torch.Tensor):
        if not isinstance(src, torch.Tensor):
            src = torch.from_numpy(src)
        table = _TORCH_BOOL_OPS if dst.dtype == torch.bool else _TORCH_OPS
        table[op](dst, src, out=dst)
    else:
        if isinstance(src, torch.Tensor):
            src = src.numpy()
        table = _NUMPY_BOOL_OPS if dst.dtype == np.bool_ else _NUMPY_OPS
        ufunc = table[op]
        xp = _xp(dst)
        if xp is not np:  # the same ufunc by name in cupy
            ufunc = getattr(xp, ufunc.__name__)
        ufunc(dst, src, out=dst)


def average_(buf: Array, count: int) -> None:
    """Divide a summed flat buffer by ``count`` in place (the last step of ``ReduceOp.AVG``)."""
    if isinstance(buf, torch.Tensor):
        buf.div_(count)
    else:
        _xp(buf).divide(buf, count, out=buf)


# --- list arguments as one flat buffer ---------------------------------------------------


def concat(arrays: Sequence[Any]) -> Any:
    """One flat buffer holding ``arrays`` back to back."""
    first = stage_in(arrays[0])
    out = empty(first, sum(numel(a) for a in arrays))
    pos = 0
    for a in arrays:
        n = numel(a)
        copy_(narrow(out, pos, n), stage_in(a))
        pos += n
    return out


def split_into(flat: Any, arrays: Sequence[Any]) -> Callable[[], None]:
    """A write-back copying consecutive pieces of ``flat`` into ``arrays``."""

    def run() -> None:
        pos = 0
        for a in arrays:
            n = numel(a)
            buf, back = stage_out(a)
            copy_(buf, narrow(flat, pos, n))
            if back is not None:
                back()
            pos += n

    return run


def split_counts(x: Any, splits: Sequence[int] | None, size: int) -> list[int]:
    """Element counts per rank for ``all_to_all_single`` split sizes (counted in dim-0 rows)."""
    rows = shape_of(x)[0] if shape_of(x) else 1
    per_row = numel(x) // rows if rows else 0
    if splits is None:
        return [rows // size * per_row] * size
    return [int(s) * per_row for s in splits]
