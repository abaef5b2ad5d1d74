"""``init_device_mesh``: an n-dimensional grid of the world's ranks with a group along each dimension.

A subset of torch's ``DeviceMesh``: the grid, its groups for simdist's collectives, ranks and
coordinates, and one dimension by name. DTensor, FSDP2 and tensor parallelism need torch's own
``DeviceMesh``: on simulated ranks, ``torch.distributed.device_mesh.init_device_mesh`` runs as it is.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ._setup import get_rank, get_world_size, init_process_group, is_initialized, new_group
from ..core._checks import check_int
from ..core._entry import library_call

__all__ = ["init_device_mesh", "DeviceMesh"]


class DeviceMesh:
    """The world's ranks as a grid of ``shape`` (row-major, as torch's ``arange(n).reshape(shape)``).

    Made by :func:`init_device_mesh`. ``get_group(dim)`` is this rank's group along ``dim`` (the
    ranks that differ from it only in that coordinate), ``mesh["tp"]`` that dimension alone.
    """

    def __init__(self, device_type: str, mesh: torch.Tensor, names: tuple[str, ...] | None, groups: list[Any]):
        self.device_type = device_type
        self.mesh = mesh
        self.mesh_dim_names = names
        self._groups = groups

    @property
    def ndim(self) -> int:
        return self.mesh.ndim

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.mesh.shape)

    def _dim(self, mesh_dim: int | str | None) -> int:
        if mesh_dim is None:
            if self.ndim != 1:
                raise RuntimeError(
                    f"Found the DeviceMesh have {self.ndim} dimensions; pass mesh_dim (an index or a name)"
                )
            return 0
        if isinstance(mesh_dim, str):
            if not self.mesh_dim_names or mesh_dim not in self.mesh_dim_names:
                raise KeyError(f"mesh dimension {mesh_dim!r} is not one of mesh_dim_names={self.mesh_dim_names}")
            return self.mesh_dim_names.index(mesh_dim)
        dim = check_int(mesh_dim, "mesh_dim")
        if not 0 <= dim < self.ndim:
            raise IndexError(f"mesh_dim={dim} is out of range for a {self.ndim}-dimensional mesh")
        return dim

    def get_group(self, mesh_dim: int | str | None = None) -> Any:
        """This rank's group along ``mesh_dim`` (may be omitted on a 1-D mesh)."""
        return self._groups[self._dim(mesh_dim)]

    def get_all_groups(self) -> list[Any]:
        """This rank's group along each dimension, in order."""
        return list(self._groups)

    def size(self, mesh_dim: int | str | None = None) -> int:
        """The number of ranks in the mesh, or along ``mesh_dim``."""
        return self.mesh.numel() if mesh_dim is None else self.shape[self._dim(mesh_dim)]

    def get_rank(self) -> int:
        """This rank's global rank."""
        return get_rank()

    def get_coordinate(self) -> tuple[int, ...]:
        """This rank's index along each dimension (a tuple, as torch's)."""
        return tuple(int(i) for i in (self.mesh == get_rank()).nonzero()[0])

    def get_local_rank(self, mesh_dim: int | str | None = None) -> int:
        """This rank's index along ``mesh_dim`` (its rank in ``get_group(mesh_dim)``)."""
        return self.get_coordinate()[self._dim(mesh_dim)]

    def __getitem__(self, names: str | tuple[str, ...]) -> DeviceMesh:
        """The 1-D mesh along the dimension ``names`` names: this rank's row of the grid in that dimension."""
        if not isinstance(names, str):
            raise NotImplementedError(
                f"mesh[{names!r}]: simdist's DeviceMesh slices one dimension by name; several dimensions at once "
                "need torch's DeviceMesh (torch.distributed.device_mesh.init_device_mesh on simulated ranks)"
            )
        dim = self._dim(names)
        index = [slice(None) if d == dim else i for d, i in enumerate(self.get_coordinate())]
        return DeviceMesh(self.device_type, self.mesh[tuple(index)], (names,), [self._groups[dim]])

    def __repr__(self) -> str:
        names = f", mesh_dim_names={self.mesh_dim_names}" if self.mesh_dim_names else ""
        return f"DeviceMesh('{self.device_type}', {self.mesh.tolist()}{names})"


@library_call
def init_device_mesh(
    device_type: str,
    mesh_shape: tuple[int, ...],
    *,
    mesh_dim_names: tuple[str, ...] | None = None,
    backend_override: Any = None,
) -> DeviceMesh:
    """A grid of every rank of the world, of ``mesh_shape``, with a simdist group along each dimension.

    Every rank calls it, with the same arguments; ranks fill the grid in row-major order, as in
    torch. It initializes the default process group if that was not done, as torch's does. It
    is a subset of torch's: its mesh gives ``get_group``, ``get_all_groups``, ``size``,
    ``get_rank``, ``get_local_rank``, ``get_coordinate``, ``mesh``, ``ndim``, ``shape`` and
    ``mesh["name"]`` for one dimension, for simdist's collectives. Not supported, each with a
    ``NotImplementedError`` naming it: ``backend_override`` and slicing several dimensions at
    once. DTensor and FSDP2 take torch's ``DeviceMesh`` only: for them, call
    ``torch.distributed.device_mesh.init_device_mesh`` (it runs on simulated ranks).

    Args:
        device_type: ``"cpu"``, ``"cuda"``, ...: kept as ``mesh.device_type``; tensors stay where they are.
        mesh_shape: the size of each dimension; their product is the world size.
        mesh_dim_names: a unique name per dimension, or ``None``.
        backend_override: must be ``None`` (not supported).

    Returns:
        The ``DeviceMesh``.

    Raises:
        RuntimeError: ``mesh_shape`` does not hold the world, the names repeat or do not match
            its length, or ``device_type`` carries an index (``"cuda:0"``), as torch raises.
        NotImplementedError: ``backend_override`` is given.

    Example:
        >>> import simdist, torch
        >>> def fn(rank):
        ...     mesh = simdist.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        ...     t = torch.tensor([rank])
        ...     simdist.all_reduce(t, group=mesh.get_group("tp"))
        ...     return mesh.get_coordinate(), int(t)
        >>> simdist.simulate(fn, 4).values
        [((0, 0), 1), ((0, 1), 1), ((1, 0), 5), ((1, 1), 5)]
    """
    if backend_override is not None:
        raise NotImplementedError(
            "init_device_mesh(backend_override=...): simdist's mesh makes every dimension's groups with the "
            "default group's backend; torch's DeviceMesh (torch.distributed.device_mesh) takes per-dimension backends"
        )
    shape = tuple(check_int(n, f"mesh_shape[{i}]", minimum=1) for i, n in enumerate(mesh_shape))
    if mesh_dim_names is not None:
        if len(set(mesh_dim_names)) != len(mesh_dim_names):
            raise RuntimeError(
                f"Each mesh_dim_name must be unique. Found repeated mesh_dim_name in mesh_dim_names {mesh_dim_names}"
            )
        if len(shape) != len(mesh_dim_names):
            raise RuntimeError(
                "mesh_shape and mesh_dim_names should have same length! "
                f"Found len(mesh_dim_names): {len(mesh_dim_names)} and len(mesh_shape):{len(shape)}."
            )
    if device_type and not device_type.isalpha():
        raise RuntimeError(
            f"Device type with index is not supported but got {device_type}. "
            "If you maintained a 'torch.device' object, it's recommended to pass in 'device.type'."
        )
    if not is_initialized():
        init_process_group()
    world = get_world_size()
    if math.prod(shape) != world:
        raise RuntimeError(f"mesh_shape={shape} holds {math.prod(shape)} ranks; the mesh must hold the world's {world}")
    mesh = torch.arange(world).reshape(shape)
    groups = []
    for dim in range(len(shape)):
        rows = mesh.movedim(dim, -1).reshape(-1, shape[dim]).tolist()  # every group along dim, in order
        made = [new_group(row) for row in rows]
        groups.append(next(g for g, row in zip(made, rows) if get_rank() in row))
    return DeviceMesh(device_type, mesh, tuple(mesh_dim_names) if mesh_dim_names else None, groups)
