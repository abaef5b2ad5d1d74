"""Launching like torch: spawn's parameters, and the names torch code checks first."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.multiprocessing as mp

import simdist
import simdist as dist


def summed(rank, world_size):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t, group=dist.group.WORLD)
    dist.destroy_process_group()
    return t.item()


def test_spawn_takes_torch_multiprocessing_parameters_in_order():
    ours = list(inspect.signature(simdist.spawn).parameters)
    theirs = list(inspect.signature(mp.spawn).parameters)
    assert ours[: len(theirs)] == theirs
    assert simdist.spawn(summed, (4,), 4, True, False, "spawn") == [10.0] * 4


def test_spawn_options_reach_the_simulator():
    assert simdist.spawn(summed, args=(3,), nprocs=3, seed=5, detail="collectives") == [6.0] * 3
    with pytest.raises(TypeError, match="unexpected keyword"):
        simdist.spawn(summed, args=(3,), nprocs=3, no_such_option=1)


def test_spawn_refuses_join_false_and_unknown_backends():
    with pytest.raises(ValueError, match="join=False"):
        simdist.spawn(summed, args=(2,), nprocs=2, join=False)
    with pytest.raises(ValueError, match="backend='bogus' is not a known backend"):
        simdist.spawn(summed, args=(2,), nprocs=2, backend="bogus")


def test_is_available_and_group_world():
    assert simdist.is_available() is True
    assert simdist.group.WORLD is None  # stands for the default group, as group=None does
    assert not simdist.is_initialized()


def test_init_outside_a_simulation_says_how_to_launch():
    how = r"simdist.spawn\(fn, args=\(world_size,\), nprocs=world_size, backend='sim'\)"
    with pytest.raises(RuntimeError, match=how):
        dist.init_process_group("gloo", rank=0, world_size=1)


@pytest.fixture
def registered():
    """Register backends for one test: ``registered(name, target)``; they are removed afterwards."""
    from simdist.core import _registry

    names = []

    def register(name: str, target: str) -> None:
        simdist.register_backend(simdist.BackendSpec(name, target))
        names.append(name)

    yield register
    for name in names:
        _registry._REGISTRY.pop(name)


def test_spawn_launches_through_the_registry_for_every_name(registered):
    """'sim' is not special: the simulator's world registered under another name launches the same way."""
    registered("sim-again", "simdist.backends.sim:SimWorld")
    assert simdist.spawn(summed, args=(3,), nprocs=3, backend="sim-again", seed=1) == [6.0] * 3
    with pytest.raises(TypeError, match="unexpected keyword"):  # its options still reach the simulator
        simdist.spawn(summed, args=(3,), nprocs=3, backend="sim-again", no_such_option=1)


def test_spawn_refuses_backends_that_cannot_launch(registered):
    registered("no-launcher", "simdist.core._world:World")  # the base class: it cannot start ranks
    registered("not-a-world", "os:getcwd")
    with pytest.raises(ValueError, match=r"^backend='no-launcher' cannot launch ranks; use backend='sim'$"):
        simdist.spawn(summed, args=(2,), nprocs=2, backend="no-launcher")
    with pytest.raises(
        ValueError,
        match=r"backend 'not-a-world' is registered as 'os:getcwd', which is "
        r"<built-in function getcwd>, not a simdist World subclass",
    ):
        simdist.spawn(summed, args=(2,), nprocs=2, backend="not-a-world")


def test_each_backend_declares_spawn_on_its_world_class():
    """The registered world types launch through a classmethod of their own class body, not a function
    patched onto the class when the backend's package is imported."""
    from simdist.core import _registry

    declared = {}
    for name in ("sim", "socket", "gloo", "torch-nccl", "mpi"):
        world_type = _registry.backend_spec(name).load()
        owner = next(c for c in world_type.__mro__ if "spawn" in vars(c))
        assert isinstance(vars(owner)["spawn"], classmethod), (name, owner)
        declared[name] = world_type.spawn.__qualname__
    # the process backends start processes with torchrun's environment (the socket backend's launcher); the
    # core's ProcessWorld names no backend
    assert declared == {
        "sim": "SimWorld.spawn",
        "socket": "SocketWorld.spawn",
        "gloo": "TorchWorld.spawn",
        "torch-nccl": "TorchWorld.spawn",
        "mpi": "TorchWorld.spawn",
    }


def test_process_backends_share_the_process_world_base_and_declare_their_capabilities():
    """Capabilities are class attributes of ``World`` that each world type sets, never guessed with getattr."""
    from simdist.core import _registry
    from simdist.core._world import ProcessWorld, World

    kinds = {}
    for name in ("sim", "socket", "gloo", "torch-nccl", "mpi"):
        world_type = _registry.backend_spec(name).load()
        kinds[name] = (issubclass(world_type, ProcessWorld), world_type.process_world, world_type.needs_rendezvous)
    assert kinds == {
        "sim": (False, False, True),
        "socket": (True, True, True),
        "gloo": (True, True, True),
        "torch-nccl": (True, True, True),
        "mpi": (True, True, False),
    }
    assert "compute" in vars(World)  # a real world computes in real time: the base does nothing
