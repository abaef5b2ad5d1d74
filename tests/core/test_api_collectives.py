"""The public collectives against an independent numpy reference (tests/support/reference.py).

One :class:`Case` is one collective call: op x algorithm x reduce op x array type x
world size x shape x root x layout x level of detail x group, run by
``simdist.simulate`` on every rank. Each rank builds its inputs from its *group* rank
and the case's seed, calls the collective, and returns numpy copies of its outputs
and of the inputs that are not outputs; the test compares them with the reference.

A hypothesis test draws cases over the whole cross product; parametrized smoke tests
make sure every (op, algorithm) pair and every array type runs at world sizes 1, 3,
4 and 7 whatever hypothesis draws. Further tests cover non-contiguous arrays, async
works, subgroups (and ranks outside them), ``group_src``/``group_dst``, tensors that
require grad and torch's own ``ReduceOp`` values.

The same cases run on real processes of the socket backend and of torch's gloo (through
simdist's API) at world sizes 1 to 5 (every pair, array type and reduce op, subgroups, and a
shorter hypothesis run), compared with the same reference exactly, so the backends agree
bit for bit.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import (
    ARRAY_TYPES,
    FLOATS,
    LAYOUTS,
    assert_same,
    build,
    is_contiguous,
    junk,
    reduce_ops_for,
    ref_reduce,
    to_np,
    values,
)

import simdist as dist
from every_backend import run
from simdist import ReduceOp
from simdist.algorithms import ALGORITHMS, choose

R = ReduceOp
OPS = [
    "broadcast",
    "all_reduce",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "gather",
    "scatter",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "barrier",
]
TABLE = {
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "all_to_all_single": "all_to_all",
}
REDUCING = {"all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor"}
ROOTED = {"broadcast": "src", "reduce": "dst", "gather": "dst", "scatter": "src"}
ALL_TO_ALL = {"all_to_all", "all_to_all_single"}
UNEVEN = ALL_TO_ALL | {"reduce_scatter"}  # ops whose pieces may differ in size between ranks
SHAPES = [(), (1,), (5,), (2, 3), (3, 2, 2), (4, 1), (0,), (2, 0)]
SMOKE_WORLDS = [1, 3, 4, 7]
DETAILS = ["messages", "collectives"]


def algorithms_of(op: str) -> list[str | None]:
    """``None`` (automatic) and every algorithm registered for ``op``'s table."""
    return [None, *sorted(ALGORITHMS[TABLE.get(op, op)])]


PAIRS = [(op, algo) for op in OPS for algo in algorithms_of(op)]


@dataclass(frozen=True)
class Case:
    """One collective call, the same on every rank of its group."""

    op: str
    kind: str = "torch"
    dtype: str = "float32"
    world: int = 4
    shape: tuple = (2, 3)
    algorithm: str | None = None
    rop: ReduceOp | None = None
    root: int = 0  # a group rank
    root_kw: str = "global"  # pass the root as src/dst ("global") or group_src/group_dst ("group")
    layout: str = "contig"
    detail: str = "messages"
    uneven: bool = False  # all_to_all(_single), reduce_scatter: different counts per (pair of) ranks
    stacked: bool = False  # *_into_tensor / *_tensor: the big tensor as (p, *shape) instead of (p * shape[0], ...)
    async_op: bool = False
    members: tuple | None = None  # global ranks of a subgroup, in the order given to new_group; None: the world
    seed: int = 0

    @property
    def ranks(self) -> list[int]:
        """The group's global ranks in group-rank order (new_group sorts them, as torch does)."""
        return sorted(self.members) if self.members is not None else list(range(self.world))

    @property
    def size(self) -> int:
        return len(self.ranks)

    def counts(self, j: int, i: int) -> int:
        """all_to_all: rows that group rank ``j`` sends to group rank ``i``."""
        if self.uneven:
            return (j + 2 * i + self.seed) % 3
        return self.shape[0] if self.shape else 1

    def piece(self, i: int) -> tuple:
        """reduce_scatter: the shape of ``input_list[i]`` (on every rank) and of group rank ``i``'s output."""
        return ((i + self.seed) % 3, *self.row) if self.uneven else tuple(self.shape)

    @property
    def row(self) -> tuple:
        return tuple(self.shape[1:])

    def big_shape(self) -> tuple:
        """The shape of the group-size-times-bigger tensor of *_into_tensor / *_tensor."""
        p, s = self.size, self.shape
        if self.stacked or not s:
            return (p, *s)
        return (p * s[0], *s[1:])


# -- inputs, the program each rank runs, and the reference ------------------------------------------


def inputs(case: Case, g: int) -> dict[str, Any]:
    """The canonical (numpy) inputs of group rank ``g``."""
    rng = np.random.default_rng([case.seed, g, len(case.shape)])
    p, s = case.size, case.shape

    def v(shape):
        return values(rng, case.dtype, shape, case.rop, p)

    op = case.op
    if op in ("broadcast", "all_reduce", "reduce", "all_gather", "all_gather_into_tensor", "gather"):
        return {"x": v(s)}
    if op == "scatter":
        return {"xs": [v(s) for _ in range(p)]}
    if op == "reduce_scatter":
        return {"xs": [v(case.piece(i)) for i in range(p)]}
    if op == "reduce_scatter_tensor":
        return {"x": v(case.big_shape())}
    if op == "all_to_all":
        return {"xs": [v((case.counts(g, i), *case.row) if case.uneven else s) for i in range(p)]}
    if op == "all_to_all_single":
        return {"x": v((sum(case.counts(g, i) for i in range(p)), *case.row))}
    return {}


def _call(case: Case, g: int, group: Any, log: list) -> dict[str, Any]:
    """Build group rank ``g``'s arguments, call the collective; return what the test checks."""
    ins = inputs(case, g)
    kind, dtype, layout, s, p = case.kind, case.dtype, case.layout, case.shape, case.size
    kw: dict[str, Any] = {"algorithm": case.algorithm}
    if group is not None:
        kw["group"] = group
    if case.async_op:
        kw["async_op"] = True
    if case.op in REDUCING:
        kw["op"] = case.rop
    if case.op in ROOTED:
        name = ROOTED[case.op]
        if case.root_kw == "group":
            kw[f"group_{name}"] = case.root
        else:
            kw[name] = case.ranks[case.root]

    def b(vals):
        return build(kind, dtype, vals, layout)

    def j(shape):
        return junk(kind, dtype, shape, layout)

    op, out = case.op, {}
    if op in ("broadcast", "all_reduce", "reduce"):
        x = b(ins["x"])
        ret = getattr(dist, op)(x, **kw)
        out["x"] = x
    elif op == "all_gather":
        x, outs = b(ins["x"]), [j(s) for _ in range(p)]
        ret = dist.all_gather(outs, x, **kw)
        out.update(list=outs, input=x)
    elif op == "all_gather_into_tensor":
        x, o = b(ins["x"]), j(case.big_shape())
        ret = dist.all_gather_into_tensor(o, x, **kw)
        out.update(out=o, input=x)
    elif op == "gather":
        x = b(ins["x"])
        outs = [j(s) for _ in range(p)] if g == case.root else None
        ret = dist.gather(x, outs, **kw)
        out.update(input=x)
        if outs is not None:
            out["list"] = outs
    elif op == "scatter":
        o = j(s)
        xs = [b(x) for x in ins["xs"]] if g == case.root else None
        ret = dist.scatter(o, xs, **kw)
        out.update(out=o)
        if xs is not None:
            out["inputs"] = xs
    elif op == "reduce_scatter":
        o, xs = j(case.piece(g)), [b(x) for x in ins["xs"]]
        ret = dist.reduce_scatter(o, xs, **kw)
        out.update(out=o, inputs=xs)
    elif op == "reduce_scatter_tensor":
        o, x = j(s), b(ins["x"])
        ret = dist.reduce_scatter_tensor(o, x, **kw)
        out.update(out=o, input=x)
    elif op == "all_to_all":
        xs = [b(x) for x in ins["xs"]]
        outs = [j((case.counts(k, g), *case.row) if case.uneven else s) for k in range(p)]
        ret = dist.all_to_all(outs, xs, **kw)
        out.update(list=outs, inputs=xs)
    elif op == "all_to_all_single":
        x = b(ins["x"])
        o = j((sum(case.counts(k, g) for k in range(p)), *case.row))
        if case.uneven:
            kw["input_split_sizes"] = [case.counts(g, i) for i in range(p)]
            kw["output_split_sizes"] = [case.counts(k, g) for k in range(p)]
        ret = dist.all_to_all_single(o, x, **kw)
        out.update(out=o, input=x)
    elif op == "barrier":
        log.append(("enter", g))
        ret = dist.barrier(**kw)
    else:  # pragma: no cover
        raise AssertionError(op)
    if case.async_op:
        assert isinstance(ret, dist.Work), f"async_op=True returned {ret!r}, expected a Work"
        assert ret.wait() in (True, None)
        assert ret.is_completed(), "is_completed() is False after wait()"
    else:
        assert ret is None, f"{op} returned {ret!r} without async_op"
    if op == "barrier":
        log.append(("leave", g))
    return {k: ([to_np(a) for a in v] if isinstance(v, list) else to_np(v)) for k, v in out.items()}


def _outside(case: Case, group: Any) -> str:
    """A rank outside the group: every call is a no-op returning None, its arrays untouched."""
    assert dist.get_rank(group) == -1
    assert dist.get_world_size(group) == -1
    root = ROOTED.get(case.op)
    kw: dict[str, Any] = {"group": group}
    if root:
        kw[root] = case.ranks[case.root]
    x = build(case.kind, case.dtype, values(np.random.default_rng(1), case.dtype, case.shape, case.rop, 1))
    before = to_np(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if case.op == "barrier":
            ret = dist.barrier(group=group)
        elif case.op in ("broadcast", "all_reduce", "reduce", "gather", "scatter"):
            ret = getattr(dist, case.op)(x, **kw)
        elif case.op in ("all_gather", "reduce_scatter", "all_to_all"):
            lst = [junk(case.kind, case.dtype, case.shape) for _ in range(case.size)]
            ret = (
                getattr(dist, case.op)(lst, [x] * case.size, **kw)
                if case.op == "all_to_all"
                else (
                    getattr(dist, case.op)(lst, x, **kw)
                    if case.op == "all_gather"
                    else dist.reduce_scatter(x, lst, **kw)
                )
            )
        else:
            ret = getattr(dist, case.op)(x, x, **kw)
    assert ret is None, f"{case.op} on a rank outside the group returned {ret!r}"
    assert_same(x, before, "tensor of a rank outside the group")
    return "outside"


def program(rank: int, cases: list[Case], logs: dict) -> list:
    """Run every case in turn on this rank; return each case's results (or 'outside')."""
    dist.init_process_group("gloo")
    results = []
    for n, case in enumerate(cases):
        group = None
        if case.members is not None:
            group = dist.new_group(list(case.members))
            if rank not in case.members:
                results.append(_outside(case, group))
                continue
        g = dist.get_rank(group) if group is not None else rank
        assert g == case.ranks.index(rank), (g, case.ranks, rank)
        results.append(_call(case, g, group, logs.setdefault(n, [])))
    dist.destroy_process_group()
    return results


def expected(case: Case, g: int) -> dict[str, Any]:
    """What group rank ``g`` must hold after the call, from numpy alone."""
    p, root, op, rop = case.size, case.root, case.op, case.rop
    ins = [inputs(case, k) for k in range(p)]
    mine = ins[g]
    if op == "broadcast":
        return {"x": ins[root]["x"]}
    if op == "all_reduce":
        return {"x": ref_reduce([i["x"] for i in ins], rop)}
    if op == "reduce":
        return {"x": ref_reduce([i["x"] for i in ins], rop) if g == root else mine["x"]}
    if op == "all_gather":
        return {"list": [i["x"] for i in ins], "input": mine["x"]}
    if op == "all_gather_into_tensor":
        return {"out": np.stack([i["x"] for i in ins]).reshape(case.big_shape()), "input": mine["x"]}
    if op == "gather":
        res = {"input": mine["x"]}
        if g == root:
            res["list"] = [i["x"] for i in ins]
        return res
    if op == "scatter":
        res = {"out": ins[root]["xs"][g]}
        if g == root:
            res["inputs"] = mine["xs"]
        return res
    if op == "reduce_scatter":
        return {"out": ref_reduce([i["xs"][g] for i in ins], rop), "inputs": mine["xs"]}
    if op == "reduce_scatter_tensor":
        blocks = [i["x"].reshape(p, *case.shape)[g] for i in ins]
        return {"out": ref_reduce(blocks, rop), "input": mine["x"]}
    if op == "all_to_all":
        return {"list": [i["xs"][g] for i in ins], "inputs": mine["xs"]}
    if op == "all_to_all_single":
        pieces = []
        for k in range(p):
            start = sum(case.counts(k, i) for i in range(g))
            pieces.append(ins[k]["x"][start : start + case.counts(k, g)])
        return {"out": np.concatenate(pieces, axis=0), "input": mine["x"]}
    return {}


def check(cases: list[Case], world: int, detail: str, seed: int = 0, backend: str = "sim") -> Any:
    """Run ``cases`` in one run of ``backend`` and compare every rank's results with the reference.

    Returns the simulator's run (for its trace), or ``None`` on socket.
    """
    logs: dict = {}
    if backend == "sim":
        res = dist.simulate(program, world, args=(cases, logs), seed=seed, detail=detail, leaks="error")
        values = res.values
    else:  # the ranks' barrier logs stay in their processes
        res, values = None, run(program, world, backend, args=(cases, logs))
    for n, case in enumerate(cases):
        for rank in range(world):
            got = values[rank][n]
            if case.members is not None and rank not in case.members:
                assert got == "outside"
                continue
            g = case.ranks.index(rank)
            want = expected(case, g)
            assert sorted(got) == sorted(want), (case, sorted(got), sorted(want))
            for key, w in want.items():
                where = f"{case} rank {rank} (group rank {g}) {key}"
                if isinstance(w, list):
                    assert len(got[key]) == len(w), where
                    for i, (a, e) in enumerate(zip(got[key], w)):
                        assert_same(a, e, f"{where}[{i}]")
                else:
                    assert_same(got[key], w, where)
        if case.op == "barrier" and backend == "sim":
            log = logs[n]
            assert len(log) == 2 * case.size
            assert [e for e, _ in log[: case.size]] == ["enter"] * case.size, f"a rank left the barrier early: {log}"
    return res


def run_case(case: Case) -> None:
    check([case], case.world, case.detail, case.seed)


# -- hypothesis: the whole cross product ---------------------------------------------------------------


@st.composite
def cases(draw, max_world: int = 9) -> Case:
    op = draw(st.sampled_from(OPS))
    kind, dtype = draw(st.sampled_from(ARRAY_TYPES))
    world = draw(st.integers(1, max_world))
    members = None
    if world > 1 and draw(st.integers(0, 3)) == 0:
        members = tuple(draw(st.lists(st.integers(0, world - 1), min_size=1, max_size=world, unique=True)))
    size = len(members) if members is not None else world
    uneven = op in UNEVEN and draw(st.booleans())
    algorithm = draw(st.sampled_from(algorithms_of(op)))
    if uneven and algorithm == "bruck":  # Bruck moves equal blocks; tested in test_bruck_rejects_uneven_counts
        algorithm = None
    return Case(
        op=op,
        kind=kind,
        dtype=dtype,
        world=world,
        members=members,
        algorithm=algorithm,
        rop=draw(st.sampled_from(reduce_ops_for(dtype))) if op in REDUCING else None,
        shape=draw(st.sampled_from(SHAPES)),
        root=draw(st.integers(0, size - 1)) if op in ROOTED else 0,
        root_kw=draw(st.sampled_from(["global", "group"])),
        layout=draw(st.sampled_from(LAYOUTS)),
        detail=draw(st.sampled_from(DETAILS)),
        uneven=uneven,
        stacked=draw(st.booleans()),
        async_op=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )


@pytest.mark.timeout(120)
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_collectives_match_numpy_reference(case: Case) -> None:
    run_case(case)


# -- smoke tests: every (op, algorithm) pair and every array type at worlds 1, 3, 4, 7 ----------------


def _algorithm_batch(op: str, algorithm: str | None, world: int) -> list[Case]:
    """One pair: float32 (SUM for reducing ops), int64 numpy with MAX, uneven counts; the last rank as root."""
    base = Case(
        op=op,
        algorithm=algorithm,
        world=world,
        shape=(3, 2),
        root=world - 1,
        rop=R.SUM if op in REDUCING else None,
        seed=world,
    )
    batch = [base]
    if op in REDUCING:
        batch.append(replace(base, rop=R.MAX, kind="numpy", dtype="int64", seed=world + 1))
    if op in UNEVEN and algorithm != "bruck":
        batch.append(replace(base, uneven=True, seed=world + 2))
    return batch


@pytest.mark.parametrize("world", SMOKE_WORLDS)
@pytest.mark.parametrize(("op", "algorithm"), PAIRS, ids=[f"{o}-{a}" for o, a in PAIRS])
def test_every_algorithm(op: str, algorithm: str | None, world: int) -> None:
    """Each pair on both levels of detail; reducing ops with SUM then MAX; the last rank as root."""
    batch = _algorithm_batch(op, algorithm, world)
    for detail in DETAILS:
        res = check([replace(c, detail=detail) for c in batch], world, detail, seed=world)
        ran = {e.algorithm for e in res.trace.of_kind("collective") if e.op == TABLE.get(op, op)}
        if algorithm is not None:  # the named algorithm is the one that ran
            assert ran == {algorithm}
        else:  # the automatic choice may differ between even and uneven counts
            assert ran and ran <= set(ALGORITHMS[TABLE.get(op, op)])
        if detail == "messages" and world > 1 and algorithm is not None:
            messages = [e for e in res.trace.of_kind("message") if e.algorithm == algorithm]
            assert messages, f"{op} by {algorithm} sent no message on {world} ranks"


def _dtype_batch(kind: str, dtype: str, world: int) -> list[Case]:
    """Every op with every reduce op valid for ``dtype`` (default algorithms)."""
    batch = []
    for n, op in enumerate(OPS):
        rops = reduce_ops_for(dtype) if op in REDUCING else [None]
        for m, rop in enumerate(rops):
            batch.append(
                Case(
                    op=op,
                    kind=kind,
                    dtype=dtype,
                    world=world,
                    shape=(2, 2),
                    rop=rop,
                    root=(n + m) % world,
                    seed=100 * n + m,
                )
            )
    return batch


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", SMOKE_WORLDS)
@pytest.mark.parametrize(("kind", "dtype"), ARRAY_TYPES, ids=[f"{k}-{d}" for k, d in ARRAY_TYPES])
def test_every_array_type(kind: str, dtype: str, world: int) -> None:
    for detail in DETAILS:
        check([replace(c, detail=detail) for c in _dtype_batch(kind, dtype, world)], world, detail, seed=world)


# -- the same cases on real processes (socket backend, torch's gloo), worlds 1 to 5 ---------------------

PROCESS_WORLDS = [1, 2, 3, 4, 5]
PROCESS_BACKENDS = ["socket", "gloo"]


def _subgroup_batch(world: int) -> list[Case]:
    """Every op on a subgroup given in reverse order (the other ranks stay outside), roots by group rank."""
    members = tuple(range(world - 1, 0, -1)) if world > 2 else (0,)
    size = len(members)
    return [
        Case(
            op=op,
            world=world,
            members=members,
            shape=(2, 3),
            root=size - 1,
            root_kw="group",
            rop=R.SUM if op in REDUCING else None,
            uneven=op in UNEVEN,
            seed=7 * n,
        )
        for n, op in enumerate(OPS)
    ]


def _own_algorithms(backend: str) -> list[tuple[str, str | None]]:
    """The (op, algorithm) pairs a backend runs: every pair on socket; gloo chooses its own algorithms."""
    return PAIRS if backend == "socket" else [(op, None) for op in OPS]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", PROCESS_BACKENDS)
@pytest.mark.parametrize("world", PROCESS_WORLDS)
def test_every_algorithm_and_array_type_on_processes(world: int, backend: str) -> None:
    """The smoke batches above, plus subgroups, in one run of ``world`` real processes; exact results."""
    batch = [c for op, algorithm in _own_algorithms(backend) for c in _algorithm_batch(op, algorithm, world)]
    batch += [c for kind, dtype in ARRAY_TYPES for c in _dtype_batch(kind, dtype, world)]
    batch += _subgroup_batch(world)
    check(batch, world, "messages", backend=backend)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", PROCESS_BACKENDS)
@pytest.mark.parametrize("layout", ["transposed", "strided"])
def test_one_element_views_with_any_stride_on_processes(layout: str, backend: str) -> None:
    """torch calls a one-element view contiguous whatever its stride; its bytes must still go on the wire."""
    ops = ("broadcast", "all_reduce", "all_gather_into_tensor", "scatter")
    batch = [
        Case(op=op, dtype=dtype, world=3, shape=(1,), layout=layout, rop=R.SUM if op in REDUCING else None)
        for op in ops
        for dtype in ("float16", "int64")
    ]
    check(batch, 3, "messages", backend=backend)


@pytest.mark.timeout(300)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(max_world=5))
def test_collectives_match_numpy_reference_on_socket(case: Case) -> None:
    """The hypothesis cross product on real processes (fewer examples: each starts a job)."""
    check([case], case.world, case.detail, case.seed, backend="socket")


@pytest.mark.timeout(300)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(max_world=5))
def test_collectives_match_numpy_reference_on_gloo(case: Case) -> None:
    """The hypothesis cross product on torch's gloo, through simdist's API (algorithm= is ignored there)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        check([replace(case, algorithm=None)], case.world, case.detail, case.seed, backend="gloo")


def test_every_reduce_op_and_dtype_is_drawn() -> None:
    """The cross product the hypothesis test draws from is the full one of the issue."""
    pairs = {(d, r) for _, d in ARRAY_TYPES for r in reduce_ops_for(d)}
    assert {r for _, r in pairs} == set(ReduceOp)
    assert all((d, R.AVG) not in pairs for d in ("int8", "int64", "uint8", "bool"))
    assert all((d, R.BXOR) not in pairs for d in FLOATS)
    assert {op for op, _ in PAIRS} == set(OPS)


# -- algorithms that cannot run a case reject it clearly ---------------------------------------------


@pytest.mark.parametrize("detail", DETAILS)
@pytest.mark.parametrize("op", sorted(ALL_TO_ALL))
def test_bruck_rejects_uneven_counts(op: str, detail: str) -> None:
    case = Case(op=op, algorithm="bruck", world=3, shape=(2,), uneven=True, detail=detail)
    with pytest.raises(dist.RankError) as info:
        run_case(case)
    assert isinstance(info.value.__cause__, ValueError)
    assert "bruck" in str(info.value.__cause__)


@pytest.mark.parametrize("world", [8, 9])
@pytest.mark.parametrize("op", sorted(ALL_TO_ALL))
def test_automatic_choice_handles_uneven_counts(op: str, world: int) -> None:
    """Small uneven all_to_all on many ranks: the automatic choice must not pick Bruck."""
    run_case(Case(op=op, world=world, shape=(1,), uneven=True))


# -- layouts ---------------------------------------------------------------------------------------------


def test_layouts_are_really_non_contiguous() -> None:
    for kind in ("torch", "numpy"):
        v = np.arange(6.0).reshape(2, 3)
        assert not is_contiguous(build(kind, "float32", v, "transposed"))
        assert not is_contiguous(build(kind, "float32", v, "strided"))
        assert not is_contiguous(build(kind, "float32", v[0], "strided"))
        assert_same(build(kind, "float32", v, "transposed"), v, "transposed")
        assert_same(build(kind, "float32", v, "strided"), v, "strided")


@pytest.mark.parametrize("layout", ["transposed", "strided"])
@pytest.mark.parametrize("kind", ["torch", "numpy"])
@pytest.mark.parametrize("op", OPS[:-1])
def test_non_contiguous_inputs_and_outputs(op: str, kind: str, layout: str) -> None:
    dtype = "float32" if kind == "torch" else "int64"
    batch = [
        Case(
            op=op,
            kind=kind,
            dtype=dtype,
            world=w,
            shape=(3, 4),
            layout=layout,
            root=w - 1,
            rop=R.SUM if op in REDUCING else None,
            uneven=op in UNEVEN,
            seed=w,
        )
        for w in (3,)
    ]
    batch.append(replace(batch[0], rop=R.PRODUCT if op in REDUCING else None, uneven=False, stacked=True))
    check(batch, 3, "messages")
    check([replace(c, detail="collectives") for c in batch], 3, "collectives")


def test_non_contiguous_tensor_is_written_through_the_view() -> None:
    """The non-contiguous view gets the result; the base's other elements stay as they were."""

    def fn(rank):
        dist.init_process_group()
        base = torch.full((4, 3), -1.0)
        view = base[::2]  # rows 0 and 2
        view.copy_(torch.tensor([[1.0, 2, 3], [4, 5, 6]]) * (rank + 1))
        dist.all_reduce(view)
        col = torch.zeros(3, 2).t()  # transposed output
        dist.broadcast(col, src=0) if rank else dist.broadcast(col.copy_(torch.tensor([[1.0, 2, 3], [4, 5, 6]])), src=0)
        dist.destroy_process_group()
        return base, col

    for base, col in dist.simulate(fn, 3).values:
        assert torch.equal(base[::2], torch.tensor([[6.0, 12, 18], [24, 30, 36]]))
        assert torch.equal(base[1::2], torch.full((2, 3), -1.0))
        assert torch.equal(col, torch.tensor([[1.0, 2, 3], [4, 5, 6]]))


# -- async works ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("detail", DETAILS)
def test_async_work_makes_results_visible_after_wait(detail: str) -> None:
    def fn(rank):
        dist.init_process_group()
        t = torch.tensor([float(rank + 1)] * 3)
        outs = [torch.zeros(3) for _ in range(4)]
        w1 = dist.all_reduce(t, async_op=True)
        w2 = dist.all_gather(outs, torch.full((3,), float(rank)), async_op=True)
        w3 = dist.barrier(async_op=True)
        assert all(isinstance(w, dist.Work) for w in (w1, w2, w3))
        for w in (w3, w2, w1):
            assert w.wait() is True
            assert w.is_completed()
        fut = w1.get_future()
        dist.destroy_process_group()
        return t, outs, w1.result(), fut.wait()

    for t, outs, result, fut in dist.simulate(fn, 4, detail=detail, leaks="error").values:
        assert torch.equal(t, torch.full((3,), 10.0))
        assert len(fut) == 1 and torch.equal(fut[0], t)
        assert [o.tolist() for o in outs] == [[float(r)] * 3 for r in range(4)]
        assert len(result) == 1 and torch.equal(result[0], t)


def test_async_work_is_not_complete_before_the_peers_arrive() -> None:
    def fn(rank):
        dist.init_process_group()
        t = torch.tensor([float(rank)])
        if rank == 0:
            w = dist.all_reduce(t, async_op=True)
            early = w.is_completed()  # rank 1 has not joined yet: it waits for our send below
            dist.send(torch.zeros(1), dst=1)
            w.wait()
        else:
            dist.recv(torch.zeros(1), src=0)
            w = dist.all_reduce(t, async_op=True)
            early = None
            w.wait()
        done = w.is_completed()
        dist.destroy_process_group()
        return early, done, t.item()

    for detail in DETAILS:
        vals = dist.simulate(fn, 2, detail=detail).values
        assert vals[0][0] is False
        assert [v[1:] for v in vals] == [(True, 1.0), (True, 1.0)]


# -- subgroups ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("detail", DETAILS)
@pytest.mark.parametrize("op", OPS)
def test_subgroup_with_ranks_outside(op: str, detail: str) -> None:
    """Group [5, 1, 3] of 6 ranks (sorted to [1, 3, 5]); ranks 0, 2 and 4 get None and keep their data."""
    case = Case(
        op=op,
        world=6,
        members=(5, 1, 3),
        root=2,
        rop=R.SUM if op in REDUCING else None,
        uneven=op in UNEVEN,
        detail=detail,
        seed=3,
    )
    run_case(case)
    run_case(replace(case, root_kw="group", root=1, async_op=True, seed=4))


@pytest.mark.filterwarnings("ignore:running all_reduce")
def test_subgroup_ranks_and_membership() -> None:
    def fn(rank):
        dist.init_process_group()
        g = dist.new_group([3, 1])
        info = (dist.get_rank(g), dist.get_world_size(g))
        if g is not dist.GroupMember.NON_GROUP_MEMBER:
            info += (dist.get_process_group_ranks(g), dist.get_global_rank(g, 0), dist.get_group_rank(g, 3))
        t = torch.tensor([rank])
        ret = dist.all_reduce(t, group=g)
        dist.destroy_process_group()
        return info, ret, t.item()

    vals = dist.simulate(fn, 4).values
    assert vals[0] == ((-1, -1), None, 0)
    assert vals[2] == ((-1, -1), None, 2)
    assert vals[1] == ((0, 2, [1, 3], 1, 1), None, 4)
    assert vals[3] == ((1, 2, [1, 3], 1, 1), None, 4)


def test_rank_outside_group_is_warned() -> None:
    def fn(rank):
        dist.init_process_group()
        g = dist.new_group([0])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ret = dist.broadcast(torch.zeros(1), src=0, group=g)
        dist.destroy_process_group()
        return ret, [str(w.message) for w in caught]

    vals = dist.simulate(fn, 2).values
    assert vals[0] == (None, [])
    assert vals[1][0] is None and any("does not belong" in m for m in vals[1][1])


def test_group_src_and_group_dst_name_group_ranks() -> None:
    """On group [1, 2, 3], group_src=1 is global rank 2; src=2 means the same."""

    def fn(rank):
        dist.init_process_group()
        g = dist.new_group([1, 2, 3])
        res = None
        if rank:
            a = torch.tensor([rank * 10])
            dist.broadcast(a, group=g, group_src=1)
            b = torch.tensor([rank * 10])
            dist.broadcast(b, src=2, group=g)
            c = torch.tensor([rank])
            dist.reduce(c, group=g, group_dst=2)
            lst = [torch.zeros(1, dtype=torch.int64) for _ in range(3)] if rank == 1 else None
            dist.gather(torch.tensor([rank]), lst, group=g, group_dst=0)
            out = torch.zeros(1, dtype=torch.int64)
            dist.scatter(
                out,
                [torch.tensor([7]), torch.tensor([8]), torch.tensor([9])] if rank == 3 else None,
                group=g,
                group_src=2,
            )
            res = (a.item(), b.item(), c.item(), None if lst is None else [x.item() for x in lst], out.item())
        dist.destroy_process_group()
        return res

    vals = dist.simulate(fn, 4).values
    assert vals[0] is None
    assert [v[:2] for v in vals[1:]] == [(20, 20)] * 3
    assert vals[3][2] == 6 and vals[1][2] == 1 and vals[2][2] == 2  # reduce: only group rank 2 (global 3) changes
    assert vals[1][3] == [1, 2, 3] and vals[2][3] is None
    assert [v[4] for v in vals[1:]] == [7, 8, 9]


def test_new_group_sort_ranks_false_keeps_the_given_order() -> None:
    def fn(rank):
        dist.init_process_group()
        g = dist.new_group([2, 0, 1], sort_ranks=False)
        outs = [torch.zeros(1, dtype=torch.int64) for _ in range(3)]
        dist.all_gather(outs, torch.tensor([rank]), group=g)
        r = dist.get_rank(g)
        dist.destroy_process_group()
        return r, [o.item() for o in outs]

    assert dist.simulate(fn, 3).values == [(1, [2, 0, 1]), (2, [2, 0, 1]), (0, [2, 0, 1])]


# -- tensors that require grad; torch's ReduceOp ----------------------------------------------------------


def test_tensors_requiring_grad_are_accepted() -> None:
    def fn(rank):
        dist.init_process_group()
        t = torch.tensor([1.0, 2.0], requires_grad=True)
        dist.all_reduce(t)
        b = torch.full((2,), float(rank), requires_grad=True)
        dist.broadcast(b, src=1)
        outs = [torch.zeros(2, requires_grad=True) for _ in range(3)]
        dist.all_gather(outs, torch.full((2,), float(rank), requires_grad=True))
        w = torch.zeros(1, requires_grad=True)
        x = w * 2 + rank  # a non-leaf input
        got = torch.zeros(1)
        dist.reduce_scatter_tensor(got, torch.cat([x, x, x]))
        dist.destroy_process_group()
        return (
            t.detach().tolist(),
            b.detach().tolist(),
            [o.detach().tolist() for o in outs],
            got.item(),
            t.requires_grad,
        )

    for t, b, outs, got, rg in dist.simulate(fn, 3).values:
        assert t == [3.0, 6.0] and b == [1.0, 1.0] and outs == [[0.0] * 2, [1.0] * 2, [2.0] * 2]
        assert got == 3.0 and rg


def test_torch_reduce_op_values_are_accepted() -> None:
    import torch.distributed as tdist

    def fn(rank):
        dist.init_process_group()
        res = []
        for op in (tdist.ReduceOp.SUM, tdist.ReduceOp.MAX, tdist.ReduceOp.MIN, tdist.ReduceOp.PRODUCT):
            t = torch.tensor([rank + 1])
            dist.all_reduce(t, op=op)
            res.append(t.item())
        t = torch.tensor([rank + 1.0])
        dist.all_reduce(t, op=tdist.ReduceOp.AVG)
        res.append(t.item())
        dist.destroy_process_group()
        return res

    assert dist.simulate(fn, 3).values == [[6, 3, 1, 6, 2.0]] * 3


def test_broadcast_root_is_not_modified_and_dtype_is_kept() -> None:
    def fn(rank):
        dist.init_process_group()
        t = torch.tensor([1, -2, 3], dtype=torch.int16) * (rank + 1)
        dist.broadcast(t, src=2)
        dist.destroy_process_group()
        return t

    for t in dist.simulate(fn, 3).values:
        assert t.dtype == torch.int16 and t.tolist() == [3, -6, 9]


def test_group_default_algorithm_and_per_call_override() -> None:
    def fn(rank):
        dist.init_process_group()
        g = dist.new_group()
        g.set_default_algorithm("all_reduce", "ring")
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=g)  # the group's default: ring
        dist.all_reduce(t, group=g, algorithm="binomial")  # the call wins
        g.set_default_algorithm("all_reduce", None)
        dist.all_reduce(t, group=g)  # automatic again
        dist.destroy_process_group()
        return t.item()

    res = dist.simulate(fn, 5)
    assert res.values == [250.0] * 5
    ran = [e.algorithm for e in res.trace.of_kind("collective") if e.rank == 0 and e.op == "all_reduce"]
    assert ran == ["ring", "binomial", choose("all_reduce", 4, 5)]


# -- inputs that alias outputs (the zero-copy patterns of FSDP and friends) -------------------------------


def _aliased(rank, op, algorithm, n, p):
    dist.init_process_group()
    if op == "all_gather_into_tensor":  # the input is this rank's block of the output
        out = torch.zeros(p * n)
        out.narrow(0, rank * n, n).copy_(torch.arange(n) + 100.0 * rank)
        dist.all_gather_into_tensor(out, out.narrow(0, rank * n, n), algorithm=algorithm)
    elif op == "reduce_scatter_tensor":  # the output is this rank's block of the input
        inp = torch.arange(p * n, dtype=torch.float32) * (rank + 1)
        out = inp.narrow(0, rank * n, n)
        dist.reduce_scatter_tensor(out, inp, algorithm=algorithm)
        out = out.clone()
    elif op == "all_to_all_single":  # in place
        out = torch.arange(p * n, dtype=torch.float32) + 100.0 * rank
        dist.all_to_all_single(out, out, algorithm=algorithm)
    elif op == "all_to_all":  # the same list as input and output
        out = [torch.full((n,), 100.0 * rank + j) for j in range(p)]
        dist.all_to_all(out, out, algorithm=algorithm)
        out = torch.cat(out)
    elif op in ("all_gather", "gather"):  # this rank's entry of the output list is the input
        mine = torch.arange(n) + 100.0 * rank
        out = [torch.zeros(n) for _ in range(p)]
        out[rank] = mine
        if op == "all_gather":
            dist.all_gather(out, mine, algorithm=algorithm)
        else:
            dist.gather(mine, out if rank == 0 else None, dst=0, algorithm=algorithm)
        out = torch.cat(out) if rank == 0 or op == "all_gather" else mine
    elif op == "scatter":  # the source's own entry of scatter_list is its output
        parts = [torch.arange(n) + 100.0 * j for j in range(p)]
        out = parts[rank] if rank == 0 else torch.zeros(n)
        dist.scatter(out, parts if rank == 0 else None, src=0, algorithm=algorithm)
    else:  # reduce_scatter: this rank's entry of input_list is its output
        parts = [torch.arange(n) * (rank + 1) + 100.0 * j for j in range(p)]
        out = parts[rank]
        dist.reduce_scatter(out, parts, algorithm=algorithm)
    dist.destroy_process_group()
    return out


def _aliased_expected(op, rank, n, p):
    if op == "all_gather_into_tensor":
        return torch.cat([torch.arange(n) + 100.0 * r for r in range(p)])
    if op == "reduce_scatter_tensor":
        return (torch.arange(p * n, dtype=torch.float32) * sum(range(1, p + 1)))[rank * n : (rank + 1) * n]
    if op == "all_to_all_single":
        return torch.cat([torch.arange(rank * n, (rank + 1) * n, dtype=torch.float32) + 100.0 * j for j in range(p)])
    if op == "all_to_all":
        return torch.cat([torch.full((n,), 100.0 * j + rank) for j in range(p)])
    if op == "all_gather" or (op == "gather" and rank == 0):
        return torch.cat([torch.arange(n) + 100.0 * r for r in range(p)])
    if op in ("gather", "scatter"):
        return torch.arange(n) + 100.0 * rank
    return torch.arange(n) * sum(range(1, p + 1)) + 100.0 * p * rank


ALIASED = [
    (op, a)
    for op in (
        "all_gather_into_tensor",
        "reduce_scatter_tensor",
        "all_to_all_single",
        "all_to_all",
        "all_gather",
        "gather",
        "scatter",
        "reduce_scatter",
    )
    for a in algorithms_of(op)
]


@pytest.mark.parametrize(("op", "algorithm"), ALIASED, ids=[f"{o}-{a}" for o, a in ALIASED])
def test_outputs_aliasing_inputs(op: str, algorithm: str | None) -> None:
    for p, n in ((2, 1), (3, 2), (4, 3), (7, 1)):
        for detail in DETAILS:
            vals = dist.simulate(_aliased, p, args=(op, algorithm, n, p), detail=detail).values
            for rank, v in enumerate(vals):
                assert torch.equal(v, _aliased_expected(op, rank, n, p)), (p, n, detail, rank, v)
