"""The public surface: ``simdist.__all__``, torch.distributed's signatures, ReduceOp, py.typed."""

from __future__ import annotations

import importlib.resources
import inspect
import pathlib
import sys
import types

import pytest
import torch.distributed as tdist

import simdist
import simdist as dist

# The functions issue 2 lists, with torch.distributed's names and signatures.
TORCH_FUNCTIONS = [
    "init_process_group",
    "is_initialized",
    "destroy_process_group",
    "get_rank",
    "get_world_size",
    "get_backend",
    "new_group",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
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
    "broadcast_object_list",
    "all_gather_object",
    "gather_object",
    "scatter_object_list",
]
OTHER_NAMES = [
    "P2POp",
    "ReduceOp",
    "Work",
    "GroupMember",
    "spawn",
    "simulate",
    "DistError",
    "DeadlockError",
    "CollectiveMismatchError",
    "RankError",
    "DistTimeoutError",
    "ProtocolError",
    "NotInitializedError",
    "DistributedSampler",
    "DistributedDataParallel",
    "GradBucket",
    "Future",
]
COLLECTIVES = {
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
}


def _params(fn) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]


def _torch_params(fn) -> list[inspect.Parameter]:
    """torch's parameters without its private ones (``_ranks`` of init_process_group)."""
    return [p for p in _params(fn) if not p.name.startswith("_")]


def _default(value):
    """Defaults compared by meaning: torch's ReduceOp members by name."""
    if isinstance(value, (tdist.ReduceOp.RedOpType, dist.ReduceOp)):
        return f"ReduceOp.{value.name}"
    return value


def test_all_is_complete_and_exported_once() -> None:
    names = simdist.__all__
    duplicates = sorted({n for n in names if names.count(n) > 1})
    assert not duplicates, f"exported more than once: {duplicates}"
    missing = [n for n in names if not hasattr(simdist, n)]
    assert not missing, f"in __all__ but missing: {missing}"
    public = {n for n, v in vars(simdist).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    assert public <= set(names), f"public but not in __all__: {sorted(public - set(names))}"
    assert set(TORCH_FUNCTIONS + OTHER_NAMES) <= set(names)


def test_star_import_gives_exactly_all() -> None:
    ns: dict = {}
    exec("from simdist import *", ns)  # noqa: S102
    assert set(ns) - {"__builtins__"} == set(simdist.__all__)


def test_public_objects_come_from_private_modules() -> None:
    """Implementation lives in private modules (``simdist.api._setup``), re-exported by name."""
    for name in simdist.__all__:
        obj = getattr(simdist, name)
        module = getattr(obj, "__module__", None)
        if module is not None and isinstance(obj, (type, types.FunctionType)):
            assert module.split(".")[-1].startswith("_"), f"{name} is defined in {module}"


@pytest.mark.parametrize("name", TORCH_FUNCTIONS)
def test_signature_matches_torch(name: str) -> None:
    ours = _params(getattr(dist, name))
    theirs = _torch_params(getattr(tdist, name))
    extra = [p for p in ours if p.name not in {q.name for q in theirs}]
    assert all(p.name == "algorithm" and p.kind is p.KEYWORD_ONLY for p in extra), (
        f"{name}: parameters torch does not have: {[p.name for p in extra]}"
    )
    ours_shared = [p for p in ours if p not in extra]
    assert [p.name for p in ours_shared] == [p.name for p in theirs], (
        f"{name}: {inspect.signature(getattr(dist, name))}"
    )
    for a, b in zip(ours_shared, theirs):
        assert a.kind == b.kind or (a.kind, b.kind) == (a.POSITIONAL_OR_KEYWORD, b.KEYWORD_ONLY), (name, a.name)
        assert (a.default is a.empty) == (b.default is b.empty), f"{name}({a.name}): required in one only"
        if b.default is not b.empty:
            assert _default(a.default) == _default(b.default), f"{name}({a.name}={a.default!r}) vs torch {b.default!r}"


@pytest.mark.parametrize("name", sorted(COLLECTIVES))
def test_collectives_take_algorithm_async_op_and_group(name: str) -> None:
    params = inspect.signature(getattr(dist, name)).parameters
    assert params["algorithm"].kind is inspect.Parameter.KEYWORD_ONLY and params["algorithm"].default is None
    assert params["async_op"].default is False
    assert params["group"].default is None


def test_p2pop_matches_torch() -> None:
    ours = [p.name for p in _params(dist.P2POp)]
    theirs = [p.name for p in _torch_params(tdist.P2POp.__init__)]
    assert ours == theirs


def test_functions_are_fully_annotated() -> None:
    for name in TORCH_FUNCTIONS:
        sig = inspect.signature(getattr(dist, name))
        unannotated = [p.name for p in sig.parameters.values() if p.annotation is inspect.Parameter.empty]
        assert not unannotated, f"{name}: parameters without annotation: {unannotated}"
        assert sig.return_annotation is not inspect.Signature.empty, f"{name} has no return annotation"


def test_reduce_op_has_the_eight_members() -> None:
    assert [m.name for m in dist.ReduceOp] == ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
    assert {m.name for m in dist.ReduceOp} <= set(tdist.ReduceOp.RedOpType.__members__)
    assert dist.ReduceOp.SUM is dist.ReduceOp["SUM"]


def test_work_has_torchs_methods() -> None:
    for method in ("wait", "is_completed", "is_success", "exception", "result", "get_future"):
        assert callable(getattr(dist.Work, method))
    assert list(inspect.signature(dist.Work.wait).parameters) == ["self", "timeout"]


def test_group_member_sentinels() -> None:
    assert dist.GroupMember.WORLD is None
    assert dist.GroupMember.NON_GROUP_MEMBER is not None


def test_errors_derive_from_dist_error() -> None:
    for name in (
        "DeadlockError",
        "CollectiveMismatchError",
        "RankError",
        "DistTimeoutError",
        "ProtocolError",
        "NotInitializedError",
    ):
        assert issubclass(getattr(dist, name), dist.DistError)
    assert issubclass(dist.DistError, RuntimeError)
    assert issubclass(dist.DistTimeoutError, TimeoutError)


def test_py_typed_ships() -> None:
    marker = importlib.resources.files("simdist") / "py.typed"
    assert marker.is_file()
    root = pathlib.Path(__file__).resolve().parents[2]
    pyproject = (root / "pyproject.toml").read_text()
    if sys.version_info >= (3, 11):
        import tomllib

        data = tomllib.loads(pyproject)["tool"]["setuptools"]["package-data"]
        assert "py.typed" in data["simdist"]
    else:  # pragma: no cover
        assert "py.typed" in pyproject


def test_import_is_light() -> None:
    """Importing simdist must not import the app, plotting or NCCL stacks."""
    import subprocess

    code = (
        "import sys, simdist; bad = [m for m in ('streamlit', 'cupy', 'plotly', 'simdist.visualize') "
        "if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_seed_program_runs_with_only_the_import_changed() -> None:
    """The issue's example: all_reduce of rank + 1 on 4 ranks, through spawn and simulate."""

    def main(rank, world_size):
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        import torch

        t = torch.tensor([rank + 1.0])
        dist.all_reduce(t)
        assert dist.get_rank() == rank and dist.get_world_size() == world_size and dist.is_initialized()
        assert dist.get_backend() == "gloo"
        dist.destroy_process_group()
        assert not dist.is_initialized()
        return t.item()

    assert simdist.spawn(main, args=(4,), nprocs=4, backend="sim") == [10.0] * 4
    res = simdist.simulate(main, nprocs=4, args=(4,), seed=7)
    assert res.values == [10.0] * 4 and isinstance(res.schedule, str) and res.trace is not None


def test_is_initialized_outside_a_simulation_is_false() -> None:
    assert dist.is_initialized() is False


def test_code_written_for_nccl_runs_unchanged() -> None:
    import datetime

    import torch

    def main(rank, world_size):
        dist.init_process_group(
            "nccl",
            init_method="tcp://127.0.0.1:29500",
            world_size=world_size,
            rank=rank,
            timeout=datetime.timedelta(seconds=30),
            device_id=None,
        )
        t = torch.ones(2) * rank
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        dist.barrier(device_ids=[0], timeout=datetime.timedelta(seconds=5))
        backend = dist.get_backend()
        dist.destroy_process_group()
        return t.tolist(), backend

    assert simdist.spawn(main, args=(3,), nprocs=3) == [([2.0, 2.0], "nccl")] * 3
