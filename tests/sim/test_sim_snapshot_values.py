"""Step snapshots read from a buffer's memory store exactly what the list of values stored; the quick checks agree.

The reference for each fast path is the general one it stands in for: ``_packed(snapshot(buf))``
(the values as Python numbers, packed by the trace), ``overlap_span`` computing the base's
bounds itself, ``changed_bytes`` on numpy copies of the bytes, and the row as ``Trace.add``
writes it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from simdist.core import _arrays as A
from simdist.core._trace import Event, Trace, _packed

pytestmark = pytest.mark.timeout(60)

DTYPES = [
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.bool,
    torch.complex64,
]


def sample(dtype: torch.dtype, n: int) -> torch.Tensor:
    """``n`` values of ``dtype`` with extremes, signed zeros and (for floats) inf and NaN among them."""
    if dtype == torch.bool:
        return torch.arange(n) % 3 == 0
    if dtype.is_complex:
        return torch.complex(torch.arange(n, dtype=torch.float32), -torch.arange(n, dtype=torch.float32))
    if dtype.is_floating_point:
        info = torch.finfo(dtype)
        special = [0.0, -0.0, info.max, info.min, info.tiny, math.inf, -math.inf, math.nan, 1 / 3]
        values = torch.tensor(special + [i * 0.731 - 7 for i in range(max(n - len(special), 0))])[:n]
        return values.to(dtype)
    info = torch.iinfo(dtype)
    special = [0, 1, info.max, info.min, info.max - 1]
    return torch.tensor(
        special + list(range(max(n - len(special), 0))), dtype=torch.int64 if dtype != torch.uint64 else torch.uint64
    )[:n].to(dtype)


def same(a, b) -> bool:
    """Equal values read as Python numbers (of one type each), a NaN equal to a NaN."""
    a, b = list(a), list(b)
    if len(a) != len(b) or any(type(x) is not type(y) for x, y in zip(a, b)):
        return False
    return all(x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 4, 64, 100])
def test_values_from_bytes_are_the_packed_list(dtype, n):
    from simdist.backends.sim._record import LIMIT
    from simdist.backends.sim._record import _snapshot_values as _values

    buf = sample(dtype, n)
    expected = _packed(A.snapshot(buf, LIMIT))
    got = _packed(_values(buf))
    assert same(got, expected), (got, expected)
    assert (A.values_view(buf) is None) == (dtype in (torch.bfloat16, torch.uint64, torch.bool, torch.complex64))


def test_empty_and_numpy_buffers_take_the_list_path():
    from simdist.backends.sim._record import _snapshot_values as _values

    assert A.values_view(torch.zeros(0)) is None and _values(torch.zeros(0)) == []
    assert list(_values(torch.ones(3, requires_grad=True))) == [1.0, 1.0, 1.0]
    assert A.values_view(np.arange(4.0)) is None and _values(np.arange(4.0)) == [0.0, 1.0, 2.0, 3.0]


def test_a_trace_of_byte_snapshots_reads_and_deduplicates_as_one_of_lists():
    from simdist.backends.sim._record import _snapshot_values as _values

    bufs = [torch.arange(4.0), torch.arange(4.0), torch.tensor([1.0, -0.0, math.nan]), torch.arange(70)]
    a, b = Trace(), Trace()
    for i, buf in enumerate(bufs):
        a.record(0, "step", "all_reduce", 0, None, None, 0, i, i, 0, i, None, None, "ring", A.snapshot(buf))
        b.record(0, "step", "all_reduce", 0, None, None, 0, i, i, 0, i, None, None, "ring", _values(buf))
    assert a.to_json() == b.to_json()
    assert a.columns()["snapshot"].tolist() == b.columns()["snapshot"].tolist() == [0, 0, 1, 2]


def test_update_rewrites_only_the_times_and_the_step():
    t = Trace()
    fields = {
        "rank": 3,
        "kind": "received",
        "op": "all_reduce",
        "group": 2,
        "peer": 1,
        "tag": -5,
        "nbytes": 16,
        "t_start": 0.0,
        "t_end": 0.0,
        "collective_id": 7,
        "step": None,
        "chunk": 2,
        "call_site": "x.py:3",
        "algorithm": "ring",
    }
    index = t.record(*fields.values(), hold=True)
    t.update(index, step=4, t_start=1.5, t_end=2.5)
    expected = Trace()
    expected.add(Event(**{**fields, "step": 4, "t_start": 1.5, "t_end": 2.5}))
    assert t.columns().tobytes() == expected.columns().tobytes()
    t2 = Trace()
    t2.update(t2.record(*fields.values(), hold=True), step=None, t_start=0.25, t_end=0.5)
    assert t2.events[0].step is None and (t2.events[0].t_start, t2.events[0].t_end) == (0.25, 0.5)


def test_overlap_span_with_kept_bounds_is_overlap_span():
    base = torch.arange(64.0)
    bounds = A.byte_bounds(base)
    for view in (base[3:9], base[60:], torch.arange(4.0), base.view(torch.int32)[5:7], base[2::3]):
        assert A.overlap_span(view, base, bounds) == A.overlap_span(view, base)
    assert A.overlap_span(base[:1], torch.zeros(0), A.byte_bounds(torch.zeros(0))) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.bfloat16, torch.bool])
def test_changed_bytes_compares_bytes(dtype):
    before = sample(dtype, 16)
    for first, last in ((0, 0), (5, 9), (15, 15)):
        after = before.clone()
        after[first] = after[last] = 1 if dtype != torch.bool else not bool(after[first])
        a = before.view(torch.uint8).numpy()
        b = after.view(torch.uint8).numpy()
        diff = np.flatnonzero(a != b)
        expected = None if diff.size == 0 else (int(diff[0]), int(diff[-1]))
        assert A.changed_bytes(before, after) == expected
    assert A.changed_bytes(before, before.clone()) is None
    if dtype.is_floating_point:
        zeros = torch.zeros(4, dtype=dtype)
        assert A.changed_bytes(zeros, -zeros) is not None  # -0.0 is another bit pattern
        nans = torch.full((4,), math.nan, dtype=dtype)
        assert A.changed_bytes(nans, nans.clone()) is None  # the same NaN bytes


def test_check_writable_still_refuses_an_expanded_tensor():
    with pytest.raises(ValueError, match="share memory"):
        A.check_writable(torch.zeros(1).expand(4), "tensor")
    A.check_writable(torch.zeros(1).expand(1), "tensor")
    A.check_writable(torch.zeros(4, 1)[:, 0], "tensor")
    A.check_writable(torch.zeros(0, 3).expand(0, 3), "tensor")
