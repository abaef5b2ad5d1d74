"""``DistributedSampler``: torch's per-rank dataset sampler, taking its world from simdist."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import Sampler

from ._setup import get_rank, get_world_size
from ..core._checks import check_int
from ..core._errors import NotInitializedError

__all__ = ["DistributedSampler"]


class DistributedSampler(Sampler[int]):
    """This rank's share of the indices of ``dataset``; the shares of all ranks are disjoint.

    Yields the same indices, in the same order, as ``torch.utils.data.DistributedSampler``
    with the same arguments. Every rank must pass the same ``seed``, ``shuffle`` and
    ``drop_last`` and call :meth:`set_epoch` with the same epoch. The indices (shuffled
    with ``torch.randperm`` seeded by ``seed + epoch`` if ``shuffle``) are padded by
    repeating them from the start up to a multiple of ``num_replicas`` or, with
    ``drop_last``, cut down to one; rank ``r`` takes every ``num_replicas``-th index from
    position ``r``.

    Args:
        dataset: Anything with ``__len__``; only its length is used.
        num_replicas: Number of ranks; ``simdist.get_world_size()`` if ``None``.
        rank: This rank, in ``[0, num_replicas - 1]``; ``simdist.get_rank()`` if ``None``.
        shuffle: Shuffle the indices (the same permutation on every rank).
        seed: Seed of the shuffle, added to the epoch.
        drop_last: Drop the tail instead of padding, so no index is yielded twice.

    Raises:
        NotInitializedError: ``num_replicas`` or ``rank`` is ``None`` and no process group is initialized.
        ValueError: ``num_replicas < 1`` or ``rank`` outside ``[0, num_replicas - 1]``.
        TypeError: ``dataset`` has no ``__len__``, or an integer argument is not an int.

    Example (``len(dataset) == 5``, 2 ranks, no shuffle)::

        >>> list(DistributedSampler(dataset, 2, 0, shuffle=False))  # rank 0
        [0, 2, 4]
        >>> list(DistributedSampler(dataset, 2, 1, shuffle=False))  # rank 1: 0 is the padding
        [1, 3, 0]
    """

    def __init__(
        self,
        dataset: Any,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        try:
            length = len(dataset)
        except TypeError:
            raise TypeError(
                f"dataset={type(dataset).__name__} object: expected a dataset with __len__ (a map-style dataset)"
            ) from None
        num_replicas = self._from_group("num_replicas", num_replicas, get_world_size)
        rank = self._from_group("rank", rank, get_rank)
        if num_replicas < 1:
            raise ValueError(f"num_replicas={num_replicas}: expected at least 1")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = check_int(seed, "seed")
        self.drop_last = drop_last
        self.epoch = 0
        # With drop_last, each rank gets the whole part of length / num_replicas; else it is rounded up.
        self.num_samples = length // num_replicas if drop_last else -(-length // num_replicas)
        self.total_size = self.num_samples * num_replicas

    @staticmethod
    def _from_group(name: str, value: int | None, query: Callable[[], int]) -> int:
        """``value`` checked as an int, or ``query()`` from the default process group if ``None``."""
        if value is not None:
            return check_int(value, name)
        try:
            return query()
        except NotInitializedError:
            raise NotInitializedError(
                f"DistributedSampler({name}=None) takes {name} from the default process group, which is not "
                f"initialized: call simdist.init_process_group() first or pass num_replicas and rank"
            ) from None

    def __iter__(self) -> Iterator[int]:
        length = len(self.dataset)
        if self.drop_last:
            fits = length >= self.total_size
        else:
            fits = length <= self.total_size and (length > 0 or self.total_size == 0)
        if not fits:
            raise RuntimeError(
                f"len(dataset)={length}: the sampler was built for {self.num_samples} indices on each of "
                f"{self.num_replicas} ranks; a dataset must keep its length"
            )
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            order = torch.randperm(length, generator=generator).tolist()
        else:
            order = list(range(length))
        # Position i of the padded (or cut) order is order[i % length]; this rank takes rank, rank + R, ...
        mine = [order[i % length] for i in range(self.rank, self.total_size, self.num_replicas)]
        return iter(mine)

    def __len__(self) -> int:
        """The number of indices each rank yields per epoch."""
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration shuffle with ``seed + epoch``; call it on every rank before each epoch."""
        self.epoch = check_int(epoch, "epoch")
