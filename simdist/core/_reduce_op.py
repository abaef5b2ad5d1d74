"""``ReduceOp``: the element-wise reductions of the reducing collectives."""

from __future__ import annotations

import enum

__all__ = ["ReduceOp", "as_reduce_op"]


class ReduceOp(enum.Enum):
    """An element-wise reduction, as ``torch.distributed.ReduceOp``.

    ``AVG`` is the sum divided by the group size (floating-point dtypes only).
    On ``bool`` data ``SUM``/``MAX``/``BOR`` are logical or, ``PRODUCT``/``MIN``/``BAND``
    logical and, ``BXOR`` logical xor. The bitwise ops need integer or bool data.
    """

    SUM = "sum"
    AVG = "avg"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"

    def __repr__(self) -> str:
        return f"ReduceOp.{self.name}"


def as_reduce_op(op: object, argname: str = "op") -> ReduceOp:
    """Return ``op`` as a :class:`ReduceOp`; also accepts torch's ``ReduceOp`` values and names."""
    if isinstance(op, ReduceOp):
        return op
    name = op if isinstance(op, str) else getattr(op, "name", None)
    if isinstance(name, str) and name.upper() in ReduceOp.__members__:
        return ReduceOp[name.upper()]
    raise ValueError(
        f"{argname}={op!r} is not a reduction; expected one of "
        + ", ".join(f"ReduceOp.{m}" for m in ReduceOp.__members__)
    )
