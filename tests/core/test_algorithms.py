"""Tests of simdist.algorithms: every collective algorithm over the in-memory loopback.

Expected values come from numpy references written here, independently of the
algorithms and of ``oneshot``. Data are small integers (or, for bitwise ops and
integer dtypes, any value with wrap-around in the dtype) so that float reductions
are exact in any order; one test uses random floats to check that all ranks get the
same bits.
"""

from __future__ import annotations

import functools
import itertools
import time

import numpy as np
import pytest
import torch
from _loopback import Loopback, run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simdist.core import _arrays as A
from simdist import algorithms as alg
from simdist.core._reduce_op import ReduceOp
from simdist.algorithms import oneshot, pipelined, together
from simdist.algorithms._chunks import PIECES

R = ReduceOp
FLOATS = ["float32", "float64", "float16", "bfloat16"]
INTS = ["int8", "int32", "int64", "uint8"]
DTYPES = FLOATS + INTS + ["bool"]
KINDS = ["torch", "numpy"]
ARITH = [R.SUM, R.PRODUCT, R.MIN, R.MAX]
BITWISE = [R.BAND, R.BOR, R.BXOR]
SIZES = range(1, 10)
REDUCING = ("all_reduce", "reduce", "reduce_scatter")
PAIRS = [(op, name) for op, table in alg.ALGORITHMS.items() if op != "barrier" for name in table]


# -- data and references -------------------------------------------------------------


def ref_dtype(dtype: str) -> np.dtype:
    return np.dtype("float32" if dtype == "bfloat16" else dtype)


def reduce_ops(dtype: str) -> list[ReduceOp]:
    return ARITH if dtype in FLOATS else ARITH + BITWISE


def combos(kinds=KINDS, dtypes=DTYPES):
    """(kind, dtype) pairs: bfloat16 only for torch."""
    return [(k, d) for k in kinds for d in dtypes if not (k == "numpy" and d == "bfloat16")]


def values(rng: np.random.Generator, dtype: str, n: int, op: ReduceOp | None = None) -> np.ndarray:
    """``n`` values of ``dtype`` (as a numpy array of the reference dtype) suited to ``op``."""
    dt = ref_dtype(dtype)
    if dtype == "bool":
        return rng.integers(0, 2, n).astype(bool)
    if dtype in FLOATS:
        if op is R.PRODUCT:
            return rng.choice([-1, 1, 2], n).astype(dt)
        if op is None:
            return (rng.integers(-100, 100, n) / 4).astype(dt)  # exact in bfloat16
        return rng.integers(-4, 5, n).astype(dt)
    info = np.iinfo(dt)
    if op is R.PRODUCT:
        return rng.choice([1, 2] if info.min == 0 else [-1, 1, 2], n).astype(dt)
    return rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)


def make(kind: str, dtype: str, vals: np.ndarray):
    if kind == "numpy":
        return vals.astype(dtype).copy()
    return torch.from_numpy(vals.copy()).to(getattr(torch, dtype))


def empty(kind: str, dtype: str, n: int):
    """A buffer of ``n`` elements filled with junk, to catch results not written."""
    junk = np.full(n, 7 if dtype != "bool" else 1).astype(ref_dtype(dtype))
    return make(kind, dtype, junk)


def frozen(x):
    """Make a numpy input read-only, so that any write to it raises (torch has no such flag)."""
    if isinstance(x, np.ndarray):
        x.flags.writeable = False
    return x


def npy(x) -> np.ndarray:
    return A.to_numpy(x)


def ref_reduce(arrays: list[np.ndarray], op: ReduceOp) -> np.ndarray:
    """The element-wise reduction in the arrays' dtype (integers wrap around)."""
    stack = np.stack(arrays)
    if stack.dtype == bool:
        if op in (R.SUM, R.MAX, R.BOR):
            return stack.any(axis=0)
        if op is R.BXOR:
            return np.logical_xor.reduce(stack, axis=0)
        return stack.all(axis=0)
    ufunc = {
        R.SUM: np.add,
        R.PRODUCT: np.multiply,
        R.MIN: np.minimum,
        R.MAX: np.maximum,
        R.BAND: np.bitwise_and,
        R.BOR: np.bitwise_or,
        R.BXOR: np.bitwise_xor,
    }[op]
    return ufunc.reduce(stack, axis=0, dtype=stack.dtype)


def same(result, expected: np.ndarray) -> bool:
    got = npy(result)
    return got.shape == expected.shape and np.array_equal(got, expected.astype(got.dtype))


def raw(x) -> bytes:
    if isinstance(x, torch.Tensor):
        return x.view(torch.uint8).numpy().tobytes() if x.numel() else b""
    return x.tobytes()


def element_counts(size: int) -> list[int]:
    return sorted({0, 1, size - 1, size, 2 * size + 3, 37})


def split(rng: np.random.Generator, total: int, parts: int, even: bool) -> list[int]:
    """``parts`` counts summing to ``total``: as even as possible, or random (some zero)."""
    if even:
        return [k for _, k in alg.chunk_bounds(total, parts)]
    cuts = np.sort(rng.integers(0, total + 1, parts - 1))
    return [int(c) for c in np.diff(np.concatenate([[0], cuts, [total]]))]


# -- one case: run an algorithm on the loopback and check it against the reference ---


def check_case(op, name, size, n, kind, dtype, rop=None, root=0, even=True, seed=None, fn=None):
    """Run one collective with fresh data; assert results, untouched inputs, quiet size 1.

    ``n`` is the element count per rank (per block for all_to_all with ``even``, the
    total for reduce_scatter); ``even`` picks even or random counts for the ops that
    take counts; ``seed`` the loopback's schedule (``None``: round robin); ``fn`` the
    algorithm function if not the registered one (e.g. with other keyword arguments).
    """
    key = [size, n, DTYPES.index(dtype), KINDS.index(kind), root, 0 if rop is None else list(R).index(rop)]
    rng = np.random.default_rng(key)
    fn = fn or alg.get(op, name)
    if op in ("all_reduce", "reduce", "broadcast"):
        data = [values(rng, dtype, n, rop) for _ in range(size)]
        bufs = [make(kind, dtype, d) for d in data]
        for r in range(size):
            if (op == "reduce") != (r == root) and op != "all_reduce":
                frozen(bufs[r])  # reduce: the non-roots' bufs; broadcast: the root's
        if op == "all_reduce":
            lb = run(size, lambda t: fn(t, bufs[t.rank], rop), seed)
            expected = ref_reduce(data, rop)
            assert all(same(b, expected) for b in bufs), (op, name, [npy(b) for b in bufs], expected)
            assert len({raw(b) for b in bufs}) == 1
        elif op == "reduce":
            lb = run(size, lambda t: fn(t, bufs[t.rank], rop, root), seed)
            assert same(bufs[root], ref_reduce(data, rop)), (npy(bufs[root]), ref_reduce(data, rop))
            assert all(same(bufs[r], data[r]) for r in range(size) if r != root), "non-root buf changed"
        else:
            lb = run(size, lambda t: fn(t, bufs[t.rank], root), seed)
            assert all(same(b, data[root]) for b in bufs)
    elif op == "all_gather" or op == "gather":
        data = [values(rng, dtype, n) for _ in range(size)]
        inps = [frozen(make(kind, dtype, d)) for d in data]
        outs = [empty(kind, dtype, size * n) if op == "all_gather" or r == root else None for r in range(size)]
        if op == "all_gather":
            lb = run(size, lambda t: fn(t, inps[t.rank], outs[t.rank]), seed)
        else:
            lb = run(size, lambda t: fn(t, inps[t.rank], outs[t.rank], root), seed)
        expected = np.concatenate(data)
        assert all(same(o, expected) for o in outs if o is not None)
        assert all(same(i, d) for i, d in zip(inps, data)), "inp changed"
    elif op == "scatter":
        data = values(rng, dtype, size * n)
        inps = [frozen(make(kind, dtype, data)) if r == root else None for r in range(size)]
        outs = [empty(kind, dtype, n) for _ in range(size)]
        lb = run(size, lambda t: fn(t, inps[t.rank], outs[t.rank], root), seed)
        assert all(same(outs[r], data[r * n : (r + 1) * n]) for r in range(size))
        assert same(inps[root], data), "inp changed"
    elif op == "reduce_scatter":
        counts = split(rng, n, size, even)
        total = sum(counts)
        data = [values(rng, dtype, total, rop) for _ in range(size)]
        inps = [frozen(make(kind, dtype, d)) for d in data]
        outs = [empty(kind, dtype, c) for c in counts]
        lb = run(size, lambda t: fn(t, inps[t.rank], outs[t.rank], counts, rop), seed)
        full, offs = ref_reduce(data, rop), np.cumsum([0, *counts])
        assert all(same(outs[r], full[offs[r] : offs[r + 1]]) for r in range(size)), (counts, name)
        assert all(same(i, d) for i, d in zip(inps, data)), "inp changed"
    elif op == "all_to_all":
        if even:
            matrix = np.full((size, size), n)
        else:
            matrix = np.array([split(rng, n, size, False) for _ in range(size)]).reshape(size, size)
        data = [values(rng, dtype, int(matrix[i].sum())) for i in range(size)]
        inps = [frozen(make(kind, dtype, d)) for d in data]
        outs = [empty(kind, dtype, int(matrix[:, j].sum())) for j in range(size)]
        uneven = len(set(matrix.flat)) > 1

        def body(t):
            return fn(t, inps[t.rank], outs[t.rank], list(matrix[t.rank]), list(matrix[:, t.rank]))

        if name == "bruck" and uneven:
            with pytest.raises(ValueError, match="bruck"):
                run(size, body, seed)
            return
        lb = run(size, body, seed)
        pieces = [np.split(d, np.cumsum(matrix[i])[:-1]) for i, d in enumerate(data)]
        for j in range(size):
            assert same(outs[j], np.concatenate([pieces[i][j] for i in range(size)])), (name, matrix)
        assert all(same(i, d) for i, d in zip(inps, data)), "inp changed"
    else:
        raise AssertionError(op)
    if size == 1:
        assert lb.messages == [], "a single rank must not send"
    for m in lb.messages:
        assert m.nbytes > 0 and 0 <= m.tag < 64 and (m.chunk is None or 0 <= m.chunk < size)


# -- the grid --------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize(("op", "name"), PAIRS, ids=[f"{o}-{n}" for o, n in PAIRS])
def test_grid(op: str, name: str, size: int) -> None:
    """Every dtype, array kind, reduce op and element count for one algorithm and size (``hierarchical``
    on machines of the smallest size above one rank that divides the group, where there is one)."""
    case = itertools.count()
    fn = None
    if name == "hierarchical":
        k = next((k for k in range(2, size) if size % k == 0), None)
        fn = on_machines([r // k for r in range(size)]) if k else None
    for n in element_counts(size):
        for kind, dtype in combos():
            for rop in reduce_ops(dtype) if op in REDUCING else [None]:
                i = next(case)
                check_case(
                    op,
                    name,
                    size,
                    n,
                    kind,
                    dtype,
                    rop,
                    root=i % size,
                    even=i % 2 == 0,
                    seed=None if i % 3 == 0 else i,
                    fn=fn,
                )


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter"])
def test_pipelined_ring_with_many_segments(op: str, size: int) -> None:
    """Segments of a few elements: many per block, a short last one, empty ones (uneven
    counts), windows of 1 to 4 scratch slots, and shuffled schedules."""
    for i, n in enumerate([1, 5 * size + 3, 37 * size, 101]):
        fn = functools.partial(alg.get(op, "ring_pipelined"), segment_bytes=8, window=1 + i)
        for kind, dtype in combos(dtypes=["float32", "float64", "bfloat16", "int8", "bool"]):
            for rop in (R.SUM, R.MAX, R.PRODUCT):
                check_case(op, "ring_pipelined", size, n, kind, dtype, rop, even=i % 2 == 0, seed=i or None, fn=fn)


def on_machines(hosts: list, **kw):
    """The hierarchical all_reduce on a transport that says each rank's machine (``hosts``)."""

    def fn(t, buf, op):
        t.hosts = hosts
        return alg.get("all_reduce", "hierarchical")(t, buf, op, **kw)

    return fn


LAYOUTS = {  # machine labels per rank: blocks of ranks, interleaved, uneven (the pipelined ring over all)
    "2x2": ["a", "a", "b", "b"],
    "2x3": ["a", "a", "a", "b", "b", "b"],
    "3x2": ["a", "a", "b", "b", "c", "c"],
    "4x2": ["a", "a", "b", "b", "c", "c", "d", "d"],
    "2x4-interleaved": ["a", "b"] * 4,
    "3x3-shuffled": ["c", "a", "b", "a", "c", "b", "b", "a", "c"],
    "uneven": ["a", "a", "a", "b", "b"],
    "one-each": ["a", "b", "c"],
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_hierarchical_on_machines(layout: str) -> None:
    """Every machine layout, element counts below and above the ranks, many segments, shuffled schedules."""
    hosts = LAYOUTS[layout]
    size = len(hosts)
    for i, n in enumerate([1, size - 1, 5 * size + 3, 101]):
        for piece_bytes in (1 << 20, 3):  # one piece; as many pieces as there are bytes (up to PIECES)
            fn = on_machines(hosts, segment_bytes=8 if i % 2 else 1 << 20, window=1 + i % 3, piece_bytes=piece_bytes)
            for kind, dtype in combos(dtypes=["float32", "float64", "bfloat16", "int8", "bool"]):
                for rop in (R.SUM, R.MAX, R.PRODUCT, R.BXOR) if dtype in INTS else (R.SUM, R.MIN):
                    check_case("all_reduce", "hierarchical", size, n, kind, dtype, rop, seed=i or None, fn=fn)


def steps(name: str, count: int):
    """An algorithm of ``count`` steps that each wait for one handle, ``name`` and the step's number."""
    for i in range(count):
        yield [f"{name}{i}"]


def test_together_runs_algorithms_in_lockstep_until_the_last_ends() -> None:
    """Each step is the union of every unfinished algorithm's step; one algorithm alone keeps its own steps."""
    assert list(together([steps("a", 3), steps("b", 1)])) == [["a0", "b0"], ["a1"], ["a2"]]

    def with_empty():
        yield []
        yield ["x"]

    assert list(together([with_empty()])) == [[], ["x"]]
    assert list(together([])) == []


def test_pipelined_runs_each_pieces_next_phase_beside_the_next_pieces_phase_before() -> None:
    """Stage ``s`` holds phase ``i`` of piece ``s - i``; a stage ends with its longest phase."""
    pieces = [[steps(f"{c}{ph}.", n) for ph, n in zip("RXG", (1, 2, 1))] for c in "ab"]
    assert list(pipelined(pieces)) == [
        ["aR.0"],  # stage 0: a's first phase alone
        ["aX.0", "bR.0"],  # stage 1: a across, b's first phase beside it
        ["aX.1"],
        ["aG.0", "bX.0"],  # stage 2
        ["bX.1"],
        ["bG.0"],  # stage 3: b's last phase alone
    ]
    assert list(pipelined([[steps("x", 2), steps("y", 1)]])) == [["x0"], ["x1"], ["y0"]]


def test_hierarchical_pieces_overlap_the_phases_within_and_across_machines() -> None:
    """With pieces, some step of a rank sends both to its own machine (a piece's reduce-scatter or
    all-gather) and to another machine (the piece before it, across): the phases overlap. In one piece
    they never do."""
    hosts = LAYOUTS["4x2"]
    size, n = len(hosts), 1024

    def mixed_steps(piece_bytes: int) -> int:
        bufs = [np.ones(n, dtype=np.float32) for _ in range(size)]
        lb = run(size, lambda t: on_machines(hosts, piece_bytes=piece_bytes)(t, bufs[t.rank], R.SUM))
        assert all((b == size).all() for b in bufs)
        kinds: dict[tuple[int, int], set[bool]] = {}
        for m in lb.messages:
            kinds.setdefault((m.src, m.step), set()).add(hosts[m.src] == hosts[m.dst])
        return sum(len(k) == 2 for k in kinds.values())

    assert mixed_steps(1 << 20) == 0
    assert mixed_steps(4 * n // PIECES) > 0


@pytest.mark.parametrize("piece_bytes", [1 << 20, 64])
@pytest.mark.parametrize(
    ("layout", "ring_bytes", "ours"), [("2x2", 1.5, 1.0), ("4x2", 1.75, 1.5), ("2x4-interleaved", 7.0, 1.0)]
)
def test_hierarchical_puts_less_on_each_machines_link(
    layout: str, ring_bytes: float, ours: float, piece_bytes: int
) -> None:
    """Bytes each machine sends to the others per all_reduce, over the buffer: ``2 (H-1)/H`` on ``H`` machines,
    counted message by message, against the ring over all ranks in rank order (which crosses machines at
    every step where they interleave); in one piece or in several."""
    hosts = LAYOUTS[layout]
    size, n = len(hosts), 4096 * len(hosts)
    bufs = [np.ones(n, dtype=np.float32) for _ in range(size)]

    def out_of_each_machine(lb) -> set[float]:
        sent = {h: 0 for h in hosts}
        for m in lb.messages:
            if hosts[m.src] != hosts[m.dst]:
                sent[hosts[m.src]] += m.nbytes
        return {b / (4 * n) for b in sent.values()}

    lb = run(size, lambda t: on_machines(hosts, piece_bytes=piece_bytes)(t, bufs[t.rank], R.SUM))
    assert out_of_each_machine(lb) == {ours} and all((b == size).all() for b in bufs)
    ring = run(size, lambda t: alg.get("all_reduce", "ring_pipelined")(t, bufs[t.rank], R.SUM))
    assert max(out_of_each_machine(ring)) == ring_bytes


def test_machines() -> None:
    assert alg.machines(["x", "y", "x", "y"], 4) == [[0, 2], [1, 3]]
    assert alg.machines(["x", "x", "y"], 3) is None  # uneven
    assert alg.machines(["x", "y"], 2) is None  # one rank a machine
    assert alg.machines(["x", "x"], 2) is None  # one machine
    assert alg.machines(None, 2) is None and alg.machines(["x"], 2) is None


@pytest.mark.parametrize("size", SIZES)
def test_chain_with_many_segments(size: int) -> None:
    """The pipelined chain with segments of one to a few elements, from every root."""
    fn = functools.partial(alg.get("broadcast", "chain_pipelined"), segment_bytes=8)
    for i, n in enumerate([1, 5 * size + 3, 101]):
        for kind, dtype in combos(dtypes=["float32", "float64", "int8", "bool"]):
            for root in range(size):
                check_case("broadcast", "chain_pipelined", size, n, kind, dtype, root=root, seed=i or None, fn=fn)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("op", ["broadcast", "reduce", "gather", "scatter"])
def test_every_root(op: str, size: int) -> None:
    for name in alg.ALGORITHMS[op]:
        for root in range(size):
            for n in (1, size + 2):
                check_case(op, name, size, n, "numpy", "int32", R.SUM, root=root, seed=root)


@pytest.mark.parametrize("size", [3, 5, 6, 8])
@pytest.mark.parametrize("op", ["reduce_scatter", "all_to_all"])
def test_uneven_counts(op: str, size: int) -> None:
    """Random uneven counts (with zeros) for every algorithm (Bruck must refuse them)."""
    for name in alg.ALGORITHMS[op]:
        for n in (2, 11, 40):
            for dtype in ("float64", "int8"):
                check_case(op, name, size, n, "torch", dtype, R.SUM, even=False, seed=n)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 6, 7, 8, 9])
@pytest.mark.parametrize("kind", KINDS)
def test_in_place_all_gather_and_reduce_scatter(kind: str, size: int) -> None:
    """``inp`` may be this rank's block of ``out`` (all_gather) or ``out`` of ``inp`` (reduce_scatter)."""
    rng = np.random.default_rng(size)
    for n in (0, 1, 5):
        for name, fn in alg.ALGORITHMS["all_gather"].items():
            data = [values(rng, "int32", n) for _ in range(size)]
            outs = [empty(kind, "int32", size * n) for _ in range(size)]
            for r in range(size):
                A.copy_(A.narrow(outs[r], r * n, n), make(kind, "int32", data[r]))
            run(size, lambda t: fn(t, A.narrow(outs[t.rank], t.rank * n, n), outs[t.rank]), seed=n)
            assert all(same(o, np.concatenate(data)) for o in outs), name
        counts = split(rng, n * size, size, even=False)
        offs = np.cumsum([0, *counts])
        for name, fn in alg.ALGORITHMS["reduce_scatter"].items():
            data = [values(rng, "int32", n * size) for _ in range(size)]
            inps = [make(kind, "int32", d) for d in data]
            run(
                size,
                lambda t: fn(t, inps[t.rank], A.narrow(inps[t.rank], offs[t.rank], counts[t.rank]), counts, R.SUM),
                seed=n,
            )
            full = ref_reduce(data, R.SUM)
            assert all(same(A.narrow(inps[r], offs[r], counts[r]), full[offs[r] : offs[r + 1]]) for r in range(size)), (
                name
            )


@pytest.mark.parametrize("size", [2, 3, 5, 7, 8, 9])
@pytest.mark.parametrize("name", list(alg.ALGORITHMS["all_reduce"]))
def test_all_reduce_same_bits_on_every_rank(name: str, size: int) -> None:
    """Random (inexact) floats: every rank must end with identical bits, close to the true sum."""
    rng = np.random.default_rng(size)
    for kind, dtype in combos(dtypes=["float32", "float16", "bfloat16"]):
        for rop in (R.SUM, R.PRODUCT, R.MIN, R.MAX):
            data = [rng.standard_normal(29).astype(ref_dtype(dtype)) for _ in range(size)]
            bufs = [make(kind, dtype, d) for d in data]
            run(size, lambda t: alg.get("all_reduce", name)(t, bufs[t.rank], rop), seed=size)
            assert len({raw(b) for b in bufs}) == 1, (name, dtype, rop)
            ref = ref_reduce([d.astype(np.float64) for d in data], rop)
            assert np.allclose(npy(bufs[0]).astype(np.float64), ref, rtol=0.05, atol=0.05 * size)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 7, 8, 9])
def test_barrier_waits_for_every_rank(size: int) -> None:
    """No rank leaves the barrier before the last one has entered, whatever the order."""
    fn = alg.get("barrier", "dissemination")
    for seed in range(20):
        clock = itertools.count()
        entered, left = {}, {}

        def body(t):
            entered[t.rank] = next(clock)
            yield from fn(t, np.zeros(1, dtype=np.float32))
            left[t.rank] = next(clock)

        lb = run(size, body, seed)
        assert max(entered.values()) < min(left.values())
        assert len(lb.messages) == size * (size - 1).bit_length()


@pytest.mark.timeout(60)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pair=st.sampled_from(PAIRS),
    size=st.integers(1, 13),
    n=st.integers(0, 60),
    dtype=st.sampled_from(["float64", "float16", "int8", "uint8", "bool"]),
    kind=st.sampled_from(KINDS),
    opi=st.integers(0, 6),
    root=st.integers(0, 12),
    even=st.booleans(),
    seed=st.integers(0, 2**16) | st.none(),
)
def test_random_cases(pair, size, n, dtype, kind, opi, root, even, seed) -> None:
    ops = reduce_ops(dtype)
    check_case(*pair, size, n, kind, dtype, ops[opi % len(ops)], root % size, even, seed)


# -- oneshot -------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 2, 5, 9])
@pytest.mark.parametrize(("kind", "dtype"), combos(dtypes=["float32", "bfloat16", "int8", "uint8", "bool"]))
def test_oneshot_matches_reference(kind: str, dtype: str, size: int) -> None:
    rng = np.random.default_rng(size)
    root = size // 2
    for n in element_counts(size):
        for rop in reduce_ops(dtype):
            data = [values(rng, dtype, n, rop) for _ in range(size)]
            bufs = [make(kind, dtype, d) for d in data]
            oneshot.all_reduce(bufs, rop)
            assert all(same(b, ref_reduce(data, rop)) for b in bufs)
            assert len({raw(b) for b in bufs}) == 1
            bufs = [make(kind, dtype, d) for d in data]
            oneshot.reduce(bufs, rop, root)
            assert same(bufs[root], ref_reduce(data, rop))
            assert all(same(bufs[r], data[r]) for r in range(size) if r != root)
            counts = split(rng, n, size, even=False)
            full = [values(rng, dtype, n, rop) for _ in range(size)]
            inps = [make(kind, dtype, d) for d in full]
            outs = [empty(kind, dtype, c) for c in counts]
            oneshot.reduce_scatter(inps, outs, counts, rop)
            offs = np.cumsum([0, *counts])
            red = ref_reduce(full, rop)
            assert all(same(outs[r], red[offs[r] : offs[r + 1]]) for r in range(size))
            assert all(same(i, d) for i, d in zip(inps, full))
        bufs = [make(kind, dtype, d) for d in data]
        oneshot.broadcast(bufs, root)
        assert all(same(b, data[root]) for b in bufs)
        inps = [make(kind, dtype, d) for d in data]
        outs = [empty(kind, dtype, size * n) for _ in range(size)]
        oneshot.all_gather(inps, outs)
        assert all(same(o, np.concatenate(data)) for o in outs)
        out = empty(kind, dtype, size * n)
        oneshot.gather(inps, out, root)
        assert same(out, np.concatenate(data))
        src = make(kind, dtype, np.concatenate(data))
        outs = [empty(kind, dtype, n) for _ in range(size)]
        oneshot.scatter(src, outs, root)
        assert all(same(outs[r], data[r]) for r in range(size))
        matrix = np.array([split(rng, n, size, even=False) for _ in range(size)])
        a2a = [values(rng, dtype, int(matrix[i].sum())) for i in range(size)]
        inps = [make(kind, dtype, d) for d in a2a]
        outs = [empty(kind, dtype, int(matrix[:, j].sum())) for j in range(size)]
        oneshot.all_to_all(inps, outs, matrix.tolist(), matrix.T.tolist())
        pieces = [np.split(d, np.cumsum(matrix[i])[:-1]) for i, d in enumerate(a2a)]
        assert all(same(outs[j], np.concatenate([pieces[i][j] for i in range(size)])) for j in range(size))


def test_oneshot_all_to_all_rejects_inconsistent_counts() -> None:
    inps = [np.zeros(2), np.zeros(2)]
    outs = [np.zeros(2), np.zeros(2)]
    with pytest.raises(ValueError, match="recv_counts_per_rank"):
        oneshot.all_to_all(inps, outs, [[1, 1], [1, 1]], [[2, 0], [0, 2]])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", KINDS)
def test_oneshot_at_1024_ranks(kind: str) -> None:
    """Every one-shot collective at 1024 ranks with 1 KiB of float32 per rank gives what the
    formulas say (all_gather at 256 ranks: at 1024 its outputs alone are 1 GiB). Inputs are
    integers, exact in float32 in any order of summation. How fast they are is measured by
    benchmarks/, not here: a bound of seconds per op would fail on a busy machine."""
    p, n = 1024, 256
    k = np.arange(n)
    spent = {}

    def timed(call, *args):
        t0 = time.process_time()
        call(*args)
        spent[call.__name__] = time.process_time() - t0

    def check(bufs, want):
        assert len(bufs) == len(want) and all(same(b, w) for b, w in zip(bufs, want))

    def small():  # rank r: r % 7 + k, for the reductions
        return [make(kind, "float32", (r % 7 + k).astype(np.float32)) for r in range(p)]

    def ids():  # rank r: r * n + k, every element names its rank and place
        return [make(kind, "float32", (r * n + k).astype(np.float32)) for r in range(p)]

    total, top = sum(r % 7 for r in range(p)), 6
    bufs = small()
    timed(oneshot.all_reduce, bufs, R.SUM)
    check(bufs, [total + p * k] * p)
    bufs = small()
    timed(oneshot.reduce, bufs, R.MAX, 5)
    check(bufs, [top + k if r == 5 else r % 7 + k for r in range(p)])
    bufs = ids()
    timed(oneshot.broadcast, bufs, 3)
    check(bufs, [3 * n + k] * p)
    counts = [1 if j % (p // n) == 0 else 0 for j in range(p)]  # n ones among p
    offs = np.cumsum([0, *counts])
    bufs, outs = small(), [empty(kind, "float32", c) for c in counts]
    timed(oneshot.reduce_scatter, bufs, outs, counts, R.SUM)
    check(outs, [(total + p * k)[offs[r] : offs[r + 1]] for r in range(p)])
    bufs, whole = ids(), empty(kind, "float32", p * n)
    timed(oneshot.gather, bufs, whole, 0)
    check([whole], [np.arange(p * n)])
    outs = [empty(kind, "float32", n) for _ in range(p)]
    timed(oneshot.scatter, whole, outs, 0)
    check(outs, [r * n + k for r in range(p)])
    matrix = np.array([counts[-i:] + counts[:-i] for i in range(p)])  # row i: what rank i sends
    bufs, outs = ids(), [empty(kind, "float32", n) for _ in range(p)]
    timed(oneshot.all_to_all, bufs, outs, matrix.tolist(), matrix.T.tolist())
    # blocks of 0 or 1 element: outs[j] holds, from each rank i that sends to j (in rank order),
    # the element of bufs[i] after the ones row i sends to ranks before j
    senders, before = [np.nonzero(matrix[:, j])[0] for j in range(p)], np.cumsum(matrix, axis=1) - matrix
    check(outs, [i * n + before[i, j] for j, i in enumerate(senders)])
    bufs, outs = ids()[:256], [empty(kind, "float32", 256 * n) for _ in range(256)]
    timed(oneshot.all_gather, bufs, outs)
    check(outs, [np.arange(256 * n)] * 256)
    # about 1 s (all_to_all: p^2 block copies, all_gather: 65,536) or milliseconds on an idle
    # machine: only a hang or a far slower kind of algorithm (a per-element loop) reaches this
    assert all(t < 30 for t in spent.values()), spent


# -- selection, cost, registry -------------------------------------------------------


def test_registry_shape() -> None:
    assert set(alg.ALGORITHMS) == {
        "all_reduce",
        "broadcast",
        "reduce",
        "all_gather",
        "reduce_scatter",
        "all_to_all",
        "gather",
        "scatter",
        "barrier",
    }
    assert {op: set(t) for op, t in alg.FORMULAS.items()} == {op: set(t) for op, t in alg.ALGORITHMS.items()}
    for op, table in alg.ALGORITHMS.items():
        for name, fn in table.items():
            assert alg.get(op, name) is fn


def test_get_errors_name_value_and_choices() -> None:
    with pytest.raises(ValueError, match=r"algorithm='foo' is not an all_reduce algorithm; expected one of .*'ring'"):
        alg.get("all_reduce", "foo")
    with pytest.raises(
        ValueError, match=r"not a broadcast algorithm.*'binomial', 'chain_pipelined', 'scatter_allgather'"
    ):
        alg.get("broadcast", "ring")
    with pytest.raises(ValueError, match=r"op='allreduce' is not a collective; expected one of .*'all_reduce'"):
        alg.get("allreduce", "ring")


@pytest.mark.parametrize("op", list(alg.ALGORITHMS))
def test_choose_returns_a_registered_name(op: str) -> None:
    for size in [1, 2, 3, 7, 8, 9, 64, 100, 1000, 1024]:
        for nbytes in [0, 1, 100, 2048, 2049, 12 * 1024, 80 * 1024, 512 * 1024, 10**6, 10**9]:
            name = alg.choose(op, nbytes, size)
            assert name in alg.ALGORITHMS[op], (op, nbytes, size, name)
            if op == "all_to_all":
                assert alg.choose(op, nbytes, size, equal_counts=False) != "bruck"


def test_choose_thresholds() -> None:
    assert alg.choose("all_reduce", 1024, 8) == "recursive_doubling"
    assert alg.choose("all_reduce", 1 << 20, 8) == "rabenseifner"
    assert alg.choose("all_reduce", 1 << 30, 7) == "ring"
    assert alg.choose("broadcast", 100, 64) == "binomial"
    assert alg.choose("broadcast", 1 << 20, 64) == "scatter_allgather"
    assert alg.choose("all_gather", 1024, 6) == "bruck"
    assert alg.choose("all_to_all", 64 * 16, 16) == "bruck"
    assert alg.choose("all_to_all", 1 << 30, 16) == "pairwise"
    with pytest.raises(ValueError, match="op='nope'"):
        alg.choose("nope", 1, 2)


def test_choose_by_machines() -> None:
    """An all_reduce across machines from ACROSS_MACHINES_BYTES: hierarchical where machines hold several ranks
    alike, else the pipelined ring; below it, on one machine or without machines, the model's choice."""
    big = alg.ACROSS_MACHINES_BYTES
    assert alg.choose("all_reduce", big, 4, hosts=("a", "a", "b", "b")) == "hierarchical"
    assert alg.choose("all_reduce", big, 4, hosts=("a", "b", "c", "d")) == "ring_pipelined"
    assert alg.choose("all_reduce", big, 5, hosts=("a", "a", "a", "b", "b")) == "ring_pipelined"
    for hosts in (None, ("a",) * 4):
        assert alg.choose("all_reduce", big, 4, hosts=hosts) == alg.choose("all_reduce", big, 4) == "rabenseifner"
    assert alg.choose("all_reduce", big - 1, 4, hosts=("a", "a", "b", "b")) == alg.choose("all_reduce", big - 1, 4)
    assert alg.choose("broadcast", big, 4, hosts=("a", "a", "b", "b")) == alg.choose("broadcast", big, 4)
    for size in (2, 4, 8, 1024):  # the model alone never picks it: it cannot tell it from the pipelined ring
        for nbytes in (1, 1 << 20, 1 << 30):
            assert alg.choose("all_reduce", nbytes, size) != "hierarchical"


@pytest.mark.parametrize(("op", "name"), [(o, n) for o, t in alg.ALGORITHMS.items() for n in t])
def test_cost_positive_and_monotone(op: str, name: str) -> None:
    alpha, beta = 2e-6, 1e-9
    for size in [2, 3, 4, 7, 8, 9, 100, 1024]:
        costs = [alg.cost(op, name, nbytes, size, alpha, beta) for nbytes in [0, 1, 1000, 10**6, 10**9]]
        assert all(c > 0 for c in costs)
        assert costs == sorted(costs)
        if op != "barrier":
            assert costs[-1] > costs[0]
    assert alg.cost(op, name, 10**6, 1, alpha, beta) == 0.0
    assert alg.FORMULAS[op][name]


@pytest.mark.parametrize("size", range(2, 10))
def test_cost_latency_term_counts_the_messages(size: int) -> None:
    """The α coefficient of every formula is the busiest rank's message or step count."""
    n = 3 * size  # no empty chunks
    for op, table in alg.ALGORITHMS.items():
        for name in table:
            lb = trace(op, name, size, n)
            busiest = 0
            for r in range(size):
                sends = [m.step for m in lb.messages if m.src == r]
                recvs = [m.recv_step for m in lb.messages if m.dst == r]
                busiest = max(busiest, len(sends), len(recvs), len(set(sends) | set(recvs)))
            if (op, name) == ("broadcast", "chain_pipelined"):
                busiest = size - 1  # a relay: its critical path is p - 1 hops, more than any rank's count
            assert alg.cost(op, name, 0, size, alpha=1.0, beta=0.0) == busiest, (op, name, alg.FORMULAS[op][name])


def test_hierarchical_cost_counts_the_messages_of_its_pieces() -> None:
    """From 16 MiB the hierarchical all_reduce goes in pieces; its formula's α coefficient is still the
    busiest rank's message count (2 machines of 2 ranks, 2 pieces of 8 MiB: 4 messages each)."""
    hosts = LAYOUTS["2x2"]
    size, nbytes = len(hosts), 16 << 20
    bufs = [np.ones(nbytes // 4, dtype=np.float32) for _ in range(size)]
    lb = run(size, lambda t: on_machines(hosts)(t, bufs[t.rank], R.SUM))
    assert all((b == size).all() for b in bufs)
    busiest = max(sum(m.src == r for m in lb.messages) for r in range(size))
    assert busiest == 8
    assert alg.cost("all_reduce", "hierarchical", nbytes, size, alpha=1.0, beta=0.0, per_machine=2) == busiest


def trace(op: str, name: str, size: int, n: int) -> Loopback:
    """Run ``op`` with ``n`` float32 elements per rank (per block where there are blocks)."""
    fn = alg.get(op, name)
    x = [np.ones(n * size, np.float32) for _ in range(size)]
    y = [np.ones(n * size, np.float32) for _ in range(size)]
    part = [A.narrow(b, 0, n) for b in x]
    args = {
        "all_reduce": lambda r: (part[r], R.SUM),
        "broadcast": lambda r: (part[r], 0),
        "reduce": lambda r: (part[r], R.SUM, 0),
        "all_gather": lambda r: (part[r], y[r]),
        "reduce_scatter": lambda r: (x[r], A.narrow(y[r], 0, n), [n] * size, R.SUM),
        "all_to_all": lambda r: (x[r], y[r], [n] * size, [n] * size),
        "gather": lambda r: (part[r], y[r] if r == 0 else None, 0),
        "scatter": lambda r: (x[r] if r == 0 else None, A.narrow(y[r], 0, n), 0),
        "barrier": lambda r: (x[r],),
    }[op]
    return run(size, lambda t: fn(t, *args(t.rank)))


def test_cost_values() -> None:
    a, b = 1.0, 0.001
    assert alg.cost("all_reduce", "ring", 800, 4, a, b) == pytest.approx(6 * a + 1.5 * 800 * b)
    assert alg.cost("all_reduce", "recursive_doubling", 800, 8, a, b) == pytest.approx(3 * (a + 800 * b))
    assert alg.cost("all_reduce", "rabenseifner", 800, 8, a, b) == pytest.approx(6 * a + 1.75 * 800 * b)
    assert alg.cost("broadcast", "binomial", 800, 5, a, b) == pytest.approx(3 * (a + 800 * b))
    assert alg.cost("barrier", "dissemination", 0, 9, a, b) == pytest.approx(4 * a)
    assert alg.cost("reduce", "binomial", 100, 4, a, b, gamma=0.01) == pytest.approx(2 * (a + 100 * b + 1))


def test_chunk_bounds() -> None:
    assert alg.chunk_bounds(7, 3) == [(0, 3), (3, 2), (5, 2)]
    assert alg.chunk_bounds(2, 4) == [(0, 1), (1, 1), (2, 0), (2, 0)]
    assert alg.chunk_bounds(0, 1) == [(0, 0)]
    for n in range(40):
        for parts in range(1, 12):
            b = alg.chunk_bounds(n, parts)
            assert sum(k for _, k in b) == n and all(s == sum(k for _, k in b[:i]) for i, (s, _) in enumerate(b))
            assert max(k for _, k in b) - min(k for _, k in b) <= 1
    with pytest.raises(ValueError, match="parts=0"):
        alg.chunk_bounds(3, 0)


def test_public_surface() -> None:
    assert len(alg.__all__) == len(set(alg.__all__))
    for name in alg.__all__:
        assert hasattr(alg, name)


def test_algorithm_modules_touch_no_array_library() -> None:
    import pathlib

    for path in pathlib.Path(alg.__file__).parent.glob("*.py"):
        if path.name == "_algorithmic.py":  # the group over the algorithms: it stages the caller's arrays for them
            continue
        text = path.read_text()
        assert "import torch" not in text and "import numpy" not in text, path.name
        assert len(text.splitlines()) < 400, path.name


# -- the loopback itself -------------------------------------------------------------


def test_loopback_reports_deadlock() -> None:
    def body(t):
        buf = np.zeros(1)
        yield [t.irecv(buf, 1 - t.rank, 0)]
        yield [t.isend(buf, 1 - t.rank, 0)]

    with pytest.raises(AssertionError, match="deadlock"):
        run(2, body)


def test_loopback_reports_size_mismatch_and_unwaited_handles() -> None:
    def mismatch(t):
        yield [t.isend(np.zeros(2), 1, 0)] if t.rank == 0 else [t.irecv(np.zeros(3), 0, 0)]

    with pytest.raises(AssertionError, match="size mismatch"):
        run(2, mismatch)

    def unwaited(t):
        if t.rank == 0:
            t.isend(np.zeros(1), 1, 0)
            yield []
        else:
            yield [t.irecv(np.zeros(1), 0, 0)]

    with pytest.raises(AssertionError, match="without waiting"):
        run(2, unwaited)


def test_loopback_copies_late() -> None:
    """A sender that reuses its buffer before waiting is caught: the bytes move at the wait."""

    def body(t):
        buf = np.array([1.0])
        if t.rank == 0:
            h = t.isend(buf, 1, 0)
            yield []
            buf[0] = 2.0  # out of contract
            yield [h]
        else:
            yield [t.irecv(buf, 0, 0)]
            assert buf[0] == 2.0

    Loopback(2).run(body)
