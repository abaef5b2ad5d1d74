"""``ScratchPool``: the scratch buffers of finished collectives, lent again to later ones.

A repeated small collective then allocates nothing. An allocation is a torch call that
lets another thread of the process take the GIL, the thread that reads the peer's
message among them, before the collective's first send: a one-float all_reduce between
two processes spent 10-40 µs more on its way with a new buffer than with a kept one
(BENCHMARKS.md (q2)). Large buffers are not kept: their allocation is small beside their
transfer, and a pool of them would hold memory the program may want.
"""

from __future__ import annotations

from typing import Any

from simdist.core import arrays as A

__all__ = ["ScratchPool"]


class ScratchPool:
    """Flat scratch buffers kept by kind, dtype, device and length; safe to share between threads."""

    MAX_BYTES = 1 << 18
    """The largest buffer kept."""
    KEEP = 2
    """Buffers kept of one kind, dtype, device and length (two collectives may run at once: a group's
    asynchronous one on its worker thread, another on the caller's)."""
    KINDS = 64
    """Distinct keys kept before the pool forgets them all (a program of ever new sizes keeps little)."""

    def __init__(self) -> None:
        self._free: dict[tuple, list] = {}

    def take(self, like: Any, numel: int) -> tuple[tuple | None, Any]:
        """``(key, buffer)``: a kept buffer of ``numel`` elements of ``like``'s kind, dtype and device, else a
        new one; ``key`` is what :meth:`give` needs to keep it afterwards (``None``: too large to keep)."""
        if numel * A.itemsize(like) > self.MAX_BYTES:
            return None, A.empty(like, numel)
        key = (type(like), like.dtype, getattr(like, "device", None), numel)
        free = self._free.get(key)
        if free:
            try:
                return key, free.pop()
            except IndexError:  # another thread took the last one meanwhile
                pass
        return key, A.empty(like, numel)

    def give(self, key: tuple | None, buf: Any) -> None:
        """Keep ``buf`` (from :meth:`take`, no longer in use: every message that read or wrote it completed)."""
        if key is None:
            return
        free = self._free.get(key)
        if free is None:
            if len(self._free) >= self.KINDS:
                self._free.clear()
            free = self._free.setdefault(key, [])
        if len(free) < self.KEEP:
            free.append(buf)
