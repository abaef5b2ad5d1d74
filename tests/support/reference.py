"""Independent numpy references and array builders for the public-API tests.

Nothing here imports simdist's collective code: inputs are generated as numpy arrays
(the *canonical* values), turned into torch tensors or numpy arrays of the dtype under
test, possibly with a non-contiguous layout, and expected results are computed from
the canonical values with plain numpy.

Data are chosen so that every result is exact in every dtype and in any reduction
order: floats are small integers (quarters for pure copies), products use {-1, 1, 2},
averages use multiples of the group size; integers may take any value of their dtype
because integer arithmetic wraps around the same way in numpy and torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from simdist import ReduceOp

R = ReduceOp

TORCH_DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"]
NUMPY_DTYPES = ["float32", "int64", "bool"]
ARRAY_TYPES: list[tuple[str, str]] = [("torch", d) for d in TORCH_DTYPES] + [("numpy", d) for d in NUMPY_DTYPES]
"""Every (array kind, dtype) pair the API must handle."""

FLOATS = {"float16", "bfloat16", "float32", "float64"}
BITWISE = [R.BAND, R.BOR, R.BXOR]
LAYOUTS = ["contig", "transposed", "strided"]


def reduce_ops_for(dtype: str) -> list[ReduceOp]:
    """The reductions defined on ``dtype``: AVG on floats only, bitwise ops on integers and bool only."""
    if dtype in FLOATS:
        return [R.SUM, R.AVG, R.PRODUCT, R.MIN, R.MAX]
    return [R.SUM, R.PRODUCT, R.MIN, R.MAX, *BITWISE]


def ref_dtype(dtype: str) -> np.dtype:
    """The numpy dtype holding canonical values of ``dtype`` (bfloat16 values are kept as float32)."""
    return np.dtype("float32" if dtype == "bfloat16" else dtype)


def values(
    rng: np.random.Generator, dtype: str, shape: Sequence[int], op: ReduceOp | None = None, group_size: int = 1
) -> np.ndarray:
    """Canonical values of ``shape`` for ``dtype``, suited to reduction ``op`` (``None``: a copy)."""
    shape = tuple(shape)
    dt = ref_dtype(dtype)
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype in FLOATS:
        if op is None:
            return (rng.integers(-100, 101, shape) / 4).astype(dt)  # quarters: exact in bfloat16
        if op is R.PRODUCT:
            return rng.choice(np.array([-1.0, 1.0, 2.0]), shape).astype(dt)
        if op is R.AVG:
            return (group_size * rng.integers(-2, 3, shape)).astype(dt)
        return rng.integers(-4, 5, shape).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)


TORCH_KINDS = ("torch", "cuda")
"""Array kinds that are torch tensors: on the CPU, or on the current CUDA device (GPU tests only)."""


def _make(kind: str, dtype: str, vals: np.ndarray) -> Any:
    if kind == "numpy":
        return np.array(vals, dtype=dtype, copy=True)
    if kind == "cupy":
        import cupy

        return cupy.asarray(np.array(vals, dtype=dtype, copy=True))
    t = torch.from_numpy(np.array(vals, copy=True)).to(getattr(torch, dtype))
    return t.cuda() if kind == "cuda" else t


def build(kind: str, dtype: str, vals: np.ndarray, layout: str = "contig") -> Any:
    """An array of ``kind`` (``'torch'``/``'numpy'``) and ``dtype`` holding ``vals``.

    ``layout='transposed'`` gives a transposed view (for two or more dims), and
    ``'strided'`` (and ``'transposed'`` on fewer dims) every other row of a bigger
    buffer; both are non-contiguous whenever the shape allows it.
    """
    vals = np.asarray(vals)
    if layout == "transposed" and vals.ndim >= 2:
        base = _make(kind, dtype, np.ascontiguousarray(np.swapaxes(vals, -1, -2)))
        return base.transpose(-1, -2) if kind in TORCH_KINDS else base.swapaxes(-1, -2)
    if layout in ("strided", "transposed") and vals.ndim >= 1:
        big = np.zeros((2 * vals.shape[0], *vals.shape[1:]), dtype=vals.dtype)
        big[::2] = vals
        return _make(kind, dtype, big)[::2]
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}")
    return _make(kind, dtype, vals)


def junk(kind: str, dtype: str, shape: Sequence[int], layout: str = "contig") -> Any:
    """An output array of ``shape`` filled with a sentinel, so results never written show up."""
    fill = True if dtype == "bool" else 7
    return build(kind, dtype, np.full(tuple(shape), fill, dtype=ref_dtype(dtype)), layout)


def is_contiguous(x: Any) -> bool:
    return x.is_contiguous() if isinstance(x, torch.Tensor) else bool(x.flags.c_contiguous)


def to_np(x: Any) -> np.ndarray:
    """A numpy copy of a tensor or array (bfloat16 as float32, gradients detached)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.dtype == torch.bfloat16:
            x = x.float()
        return x.numpy().copy()
    if type(x).__module__.startswith("cupy"):
        return x.get()
    return np.array(x, copy=True)


def ref_reduce(arrays: Sequence[np.ndarray], op: ReduceOp) -> np.ndarray:
    """The element-wise reduction of canonical arrays with ``op``, in their dtype.

    Integers wrap around; bool SUM/MAX/BOR are ``or``, PRODUCT/MIN/BAND ``and``, BXOR
    ``xor``; AVG divides the sum (exact for the data :func:`values` makes) by the count.
    """
    stack = np.stack([np.asarray(a) for a in arrays])
    dt = stack.dtype
    if dt == np.bool_:
        if op in (R.SUM, R.MAX, R.BOR):
            return stack.any(axis=0)
        if op is R.BXOR:
            return np.logical_xor.reduce(stack, axis=0)
        return stack.all(axis=0)
    if op is R.AVG:
        return (stack.astype(np.float64).sum(axis=0) / len(arrays)).astype(dt)
    if dt.kind == "f":
        wide = stack.astype(np.float64)
        ufunc = {R.SUM: np.add, R.PRODUCT: np.multiply, R.MIN: np.minimum, R.MAX: np.maximum}[op]
        return ufunc.reduce(wide, axis=0).astype(dt)
    ufunc = {
        R.SUM: np.add,
        R.PRODUCT: np.multiply,
        R.MIN: np.minimum,
        R.MAX: np.maximum,
        R.BAND: np.bitwise_and,
        R.BOR: np.bitwise_or,
        R.BXOR: np.bitwise_xor,
    }[op]
    return ufunc.reduce(stack, axis=0, dtype=dt)


def assert_same(got: Any, expected: np.ndarray, what: str) -> None:
    """``got`` (an array or its numpy copy) equals ``expected`` exactly, shape included."""
    got = to_np(got) if not isinstance(got, np.ndarray) else got
    expected = np.asarray(expected)
    assert got.shape == expected.shape, f"{what}: shape {got.shape}, expected {expected.shape}"
    assert np.array_equal(got, expected.astype(got.dtype)), f"{what}:\n got      {got!r}\n expected {expected!r}"
