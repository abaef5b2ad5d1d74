"""The torch.distributed names simdist adds, each checked against torch itself.

Signatures are compared with torch's through ``inspect``; behaviour by running one program with
``torch.distributed`` on gloo processes and with ``simdist`` on the simulator; simdist's errors
are torch's ``DistError`` classes.
"""

from __future__ import annotations

import datetime
import inspect
import multiprocessing
import pickle
import socket
import time

import pytest
import torch
import torch.distributed as tdist
from torch.distributed.device_mesh import init_device_mesh as torch_init_device_mesh

import simdist

NEW_FUNCTIONS = {
    "send_object_list": tdist.send_object_list,
    "recv_object_list": tdist.recv_object_list,
    "monitored_barrier": tdist.monitored_barrier,
    "new_subgroups": tdist.new_subgroups,
    "split_group": tdist.split_group,
    "is_nccl_available": tdist.is_nccl_available,
    "init_device_mesh": torch_init_device_mesh,
}


@pytest.mark.parametrize("name", sorted(NEW_FUNCTIONS))
def test_signature_is_torchs(name: str) -> None:
    ours = inspect.signature(getattr(simdist, name)).parameters.values()
    theirs = inspect.signature(NEW_FUNCTIONS[name]).parameters.values()
    assert [(p.name, p.kind, p.default) for p in ours] == [(p.name, p.kind, p.default) for p in theirs]
    assert name in simdist.__all__


def test_backend_is_torchs() -> None:
    assert issubclass(simdist.Backend, tdist.Backend)
    for name in ("GLOO", "gloo", "NCCL", "mpi", "sim", "SOCKET"):
        assert simdist.Backend(name) == tdist.Backend(name)
    assert simdist.Backend.GLOO == "gloo" and simdist.Backend.NCCL == "nccl" and simdist.Backend.SIM == "sim"


# -- one program, on torch's gloo processes and on the simulator ------------------------------------------------


def program(rank: int, world: int, dist, init_device_mesh) -> dict:
    """Every new name that gloo runs; ``dist`` is ``torch.distributed`` or ``simdist``."""
    out: dict = {"backend": dist.Backend("GLOO")}
    if rank == 0:
        dist.send_object_list([{"step": 3}, "hello", None], dst=1)
        dist.send_object_list([[rank] * 3], group_dst=world - 1, use_batch=True)
    if rank == 1:
        got = [0, 0, 0]
        out["recv"] = (dist.recv_object_list(got, src=0), got)
    if rank == world - 1:
        got = [None]
        out["recv_batch"] = (dist.recv_object_list(got, group_src=0, use_batch=True), got)
    mine, blocks = dist.new_subgroups(group_size=2)
    t = torch.tensor([rank + 1])
    dist.all_reduce(t, group=mine)
    out["subgroups"] = (int(t), len(blocks), dist.get_process_group_ranks(mine))
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=60), wait_all_ranks=True)
    mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
    u = torch.tensor([rank + 1])
    dist.all_reduce(u, group=mesh.get_group("dp"))
    out["mesh"] = (mesh.get_coordinate(), mesh.size(), mesh.size(1), mesh.get_local_rank("dp"), int(u))
    out["mesh_1d"] = mesh["tp"].mesh.tolist()
    return out


def _gloo_rank(rank: int, world: int, port: int, queue) -> None:
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        queue.put((rank, program(rank, world, tdist, torch_init_device_mesh)))
    finally:
        tdist.destroy_process_group()


def gloo_values(world: int, target=_gloo_rank) -> list:
    """``program``'s values (or ``target``'s) on ``world`` gloo processes of torch (forked, on 127.0.0.1)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, world, port, queue)) for r in range(world)]
    for p in procs:
        p.start()
    values = dict(queue.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    return [values[r] for r in range(world)]


def _simulated(rank: int, world: int) -> dict:
    simdist.init_process_group("gloo")
    return program(rank, world, simdist, simdist.init_device_mesh)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 4])
def test_program_gives_what_torch_gives_on_gloo(world: int) -> None:
    truth = gloo_values(world)
    for seed in range(3):
        assert simdist.simulate(_simulated, world, (world,), seed=seed).values == truth


def late_rank(rank: int, world: int, dist, pause) -> str:
    """``monitored_barrier``'s words on each rank when the last rank arrives 2 s late (``pause`` sleeps or computes)."""
    if rank == world - 1:
        pause(2.0)
    try:
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=0.5), wait_all_ranks=world > 2)
    except RuntimeError as exc:
        return str(exc).split("\n")[0]
    return "passed"


def _gloo_late(rank: int, world: int, port: int, queue) -> None:
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    queue.put((rank, late_rank(rank, world, tdist, time.sleep)))
    time.sleep(3)  # the late rank must find rank 0's group alive: gloo reports a closed peer otherwise
    tdist.destroy_process_group()


def _simulated_late(rank: int, world: int) -> str:
    simdist.init_process_group("gloo")
    return late_rank(rank, world, simdist, lambda seconds: simdist.compute(seconds=seconds))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 4])
def test_monitored_barrier_names_the_late_rank_in_gloos_words(world: int) -> None:
    truth = gloo_values(world, _gloo_late)
    late = world - 1
    words = f"Rank {late}" if world == 2 else f"Ranks {late}"  # gloo's words with wait_all_ranks
    assert truth[0] == f"[Rank 0]: {words} failed to pass monitoredBarrier in 500 ms"
    assert all(truth[r].startswith(f"Rank {r} successfully reached monitoredBarrier, but") for r in range(1, late))
    with pytest.warns(simdist.LeakWarning):  # the late rank's token, which rank 0 no longer receives
        values = simdist.simulate(_simulated_late, world, (world,)).values
    assert values[:late] == truth[:late]
    # the late rank: on gloo it may read that rank 0's pair closed; on the simulator rank 0 did not answer in time
    assert values[late].startswith(f"Rank {late} successfully reached monitoredBarrier, but")


@pytest.mark.timeout(60)
def test_split_group_and_is_nccl_available_on_the_simulator() -> None:
    def fn(rank):
        simdist.init_process_group("gloo")
        pair = simdist.split_group(split_ranks=[[0, 1]])
        t = torch.tensor([rank + 1])
        if pair is not None:
            simdist.all_reduce(t, group=pair)
        return int(t), pair is None, simdist.is_nccl_available()

    assert simdist.simulate(fn, 3).values == [(3, False, True), (3, False, True), (3, True, True)]


@pytest.mark.timeout(60)
def test_unsupported_cases_say_so() -> None:
    def fn(rank):
        simdist.init_process_group("gloo")
        errors = []
        for call in (
            lambda: simdist.init_device_mesh("cpu", (2,), backend_override={0: "gloo"}),
            lambda: simdist.init_device_mesh("cpu", (2, 1), mesh_dim_names=("a", "b"))[("a", "b")],
            lambda: simdist.split_group(simdist.new_group([0, 1]), split_ranks=[[0]]),
            lambda: simdist.recv_object_list([None]),
            lambda: simdist.send_object_list([1], dst=rank),
            lambda: simdist.init_device_mesh("cpu", (3,)),
        ):
            try:
                call()
            except Exception as exc:  # noqa: BLE001 (the type is what is checked)
                errors.append(type(exc).__name__)
        return errors

    expected = ["NotImplementedError", "NotImplementedError", "NotImplementedError", "ValueError", "ValueError"]
    assert simdist.simulate(fn, 2).values == [[*expected, "RuntimeError"]] * 2


# -- errors: torch's classes ---------------------------------------------------------------------------------

TORCH_CLASS = {
    "DeadlockError": tdist.DistBackendError,
    "CollectiveMismatchError": tdist.DistBackendError,
    "BufferRaceError": tdist.DistBackendError,
    "DistTimeoutError": tdist.DistStoreError,
    "PeerLostError": tdist.DistNetworkError,
    "ProtocolError": tdist.DistNetworkError,
    "AuthenticationError": tdist.DistNetworkError,
    "RankError": tdist.DistError,
    "RankExitError": tdist.DistError,
    "NotInitializedError": tdist.DistError,
}
TORCH_SUBCLASSES = (tdist.DistBackendError, tdist.DistStoreError, tdist.DistNetworkError)


EXAMPLES = {
    "DeadlockError": lambda cls: cls("stuck", blocked=[0, 1]),
    "CollectiveMismatchError": lambda cls: cls("differs", ranks=[0, 1]),
    "BufferRaceError": lambda cls: cls("raced", rank=1, op="isend", call_site="x.py:3", changed=(0, 4)),
    "RankError": lambda cls: cls(1, ValueError("lost")),
    "RankExitError": lambda cls: cls("exited", exitcode=7),
    "PeerLostError": lambda cls: cls("lost", rank=2),
}


@pytest.mark.parametrize("name", sorted(TORCH_CLASS))
def test_error_is_torchs_class_and_pickles(name: str) -> None:
    cls = getattr(simdist, name)
    assert issubclass(cls, simdist.DistError) and issubclass(cls, TORCH_CLASS[name])
    others = [c for c in TORCH_SUBCLASSES if c is not TORCH_CLASS[name]]
    assert not any(issubclass(cls, c) for c in others), name
    err = EXAMPLES.get(name, lambda cls: cls("lost"))(cls)
    err.detail = 7
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls and str(back) == str(err) and back.detail == 7
    assert isinstance(back, tdist.DistError) and isinstance(back, RuntimeError)


def test_dist_error_is_torchs() -> None:
    assert issubclass(simdist.DistError, tdist.DistError) and issubclass(simdist.DistError, RuntimeError)
    assert issubclass(simdist.DistTimeoutError, TimeoutError)


def _mismatch(rank):
    simdist.init_process_group("gloo")
    if rank == 0:
        simdist.barrier()
    else:
        simdist.all_reduce(torch.zeros(1))


def _late(rank):
    simdist.init_process_group("gloo")
    simdist.compute(seconds=5 * rank)
    simdist.monitored_barrier(timeout=1)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "fn, torch_class", [(_mismatch, tdist.DistBackendError), (_late, tdist.DistStoreError)], ids=["mismatch", "late"]
)
def test_except_torch_dist_error_catches_a_failing_simulation(fn, torch_class) -> None:
    with pytest.raises(tdist.DistError) as caught:
        simdist.simulate(fn, 2)
    err = caught.value
    found = err.__cause__ if isinstance(err, simdist.RankError) else err
    assert isinstance(found, torch_class), repr(found)
