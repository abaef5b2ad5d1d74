"""``AlgorithmicGroup``: collectives built from ``simdist.algorithms`` over a Transport.

The simulator and the socket backend share this class. It stages arrays into flat
buffers, packs list arguments, picks an algorithm and describes the call as a
:class:`CollectiveCall`: plain data (the algorithm, its arguments as a typed tuple, the
steps that finish the call), which the backend runs, deciding only how messages travel
(:meth:`AlgorithmicGroup._run_collective`). A tensor passed to ``simdist.all_reduce``
is staged into ``CollectiveCall.args``, handed to ``CollectiveCall.function`` by
:meth:`CollectiveCall.start` with the backend's transport, and written back by the
steps of ``CollectiveCall.finish``.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

import numpy as np

from ..core import _arrays as A
from . import _select as algorithms  # get, choose, ACROSS_MACHINES_BYTES
from ..core._group import Options, ProcessGroup
from ..core._reduce_op import ReduceOp
from ..core._work import Work
from ._args import (
    AllGatherArgs,
    AllReduceArgs,
    AllToAllArgs,
    BarrierArgs,
    BroadcastArgs,
    GatherArgs,
    ReduceArgs,
    ReduceScatterArgs,
    ScatterArgs,
)

__all__ = ["AlgorithmicGroup", "CollectiveCall"]


@dataclass(eq=False)
class CollectiveCall:
    """One rank's part in one collective, ready for a backend to run.

    Attributes:
        op: the collective's name (``'all_reduce'``).
        algorithm: the chosen algorithm's name.
        function: the algorithm (``simdist.algorithms.get(op, algorithm)``), called as
            ``function(transport, *args)``; ``None`` for a call that moves no data of its own.
        args: the algorithm's arguments after the transport, a typed tuple of
            :mod:`simdist.algorithms._args` (its buffers are the staged, flat ones); every rank's
            together give :func:`simdist.algorithms.oneshot.run` the results at once.
        signature: the fields that must agree on every rank (dtype, shape, op, root, ...).
        nbytes: the size the cost model charges for.
        outputs: what ``Work.result()`` returns.
        finish: the steps that run, in order, once the data is in place (the division of AVG,
            write-backs into the caller's arrays).
        snapshot: the flat buffer whose values the trace may record after each step.
        call_site: the user's ``file:line``.
        staged: the bytes of each new flat buffer this rank allocates around the algorithm to
            hold list arguments (the simulator charges their first touch, ``Topology.setup``).
        copied: the bytes this rank copies between list arguments and those buffers.
    """

    op: str
    algorithm: str
    function: Callable[..., Iterator[list]] | None
    args: NamedTuple | tuple
    signature: dict[str, Any]
    nbytes: int
    outputs: list
    finish: list[Callable[[], None]] = field(default_factory=list)
    snapshot: Any = None
    call_site: str | None = None
    staged: tuple[int, ...] = ()
    copied: int = 0

    def start(self, transport: Any) -> Iterator[list]:
        """The algorithm's generator on ``transport``: the handles of each step it waits for."""
        assert self.function is not None, f"{self.op} moves no data of its own"
        return self.function(transport, *self.args)

    def complete(self) -> None:
        """Run the :attr:`finish` steps: the call's results are then in the caller's arrays."""
        for step in self.finish:
            step()


class AlgorithmicGroup(ProcessGroup):
    """A ProcessGroup whose collectives are ``simdist.algorithms`` over a Transport.

    ``network`` holds the ``alpha``/``beta`` that the automatic choice of algorithm
    assumes (empty: the defaults of :func:`simdist.algorithms.choose`).
    """

    network: dict[str, float] = {}

    def set_default_algorithm(self, op: str, algorithm: str | None) -> None:
        """Use ``algorithm`` for every ``op`` on this group that does not name one (``None``: automatic).

        Raises:
            ValueError: ``op`` has no algorithm of that name (:func:`simdist.algorithms.get` names them).
        """
        if algorithm is not None:
            algorithms.get(op, algorithm)
        super().set_default_algorithm(op, algorithm)

    @abstractmethod
    def _run_collective(self, call: CollectiveCall, opts: Options) -> Work:
        """Start ``call`` on this rank and return its Work."""

    def _pick(self, op: str, opts: Options, nbytes: int, equal_counts: bool = True) -> str:
        name = opts.algorithm or self.default_algorithms.get(op)
        if name is None:
            hosts = self._hosts() if op == "all_reduce" and nbytes >= algorithms.ACROSS_MACHINES_BYTES else None
            return algorithms.choose(op, nbytes, self.size, equal_counts=equal_counts, hosts=hosts, **self.network)
        algorithms.get(op, name)
        return name

    def _hosts(self) -> tuple | None:
        """The machine of each group rank, where the backend knows them (the automatic choice of an
        all_reduce across machines reads them: :func:`simdist.algorithms.choose`); ``None``: it does not."""
        return None

    def _signature(self, op: str, algorithm: str, opts: Options, x: Any, **extra: Any) -> dict:
        sig: dict[str, Any] = {
            "op": op,
            "dtype": A.dtype_name(x),
            "shape": A.shape_of(x),
            "algorithm": algorithm,
            "async_op": bool(opts.async_op),
        }
        if opts.op is not None:
            sig["reduce_op"] = opts.op._name_  # (the enum's ``name`` property costs two calls at every collective)
        if opts.root is not None:
            sig["root"] = self.ranks[opts.root]
        if extra:
            sig.update(extra)
        return sig

    def _call(
        self,
        op: str,
        opts: Options,
        x: Any,
        nbytes: int,
        args: NamedTuple,
        finish: list,
        outputs: list,
        snapshot: Any,
        equal_counts: bool = True,
        staged: tuple[int, ...] = (),
        copied: int = 0,
        **extra: Any,
    ) -> Work:
        """Start this rank's part of collective ``op`` on the staged buffers ``args``: its Work.

        ``finish`` lists the steps after the algorithm (``None`` entries skipped); ``extra`` adds fields to
        the signature that every rank must agree on; ``staged``/``copied`` are what the list arguments cost.
        """
        algo = self._pick(op, opts, nbytes, equal_counts)
        if isinstance(args, AllToAllArgs) and algo == "bruck":
            _check_bruck(args.send, args.recv)
        call = CollectiveCall(
            op=op,
            algorithm=algo,
            function=algorithms.get(op, algo),
            args=args,
            signature=self._signature(op, algo, opts, x, **extra),
            nbytes=nbytes,
            outputs=outputs,
            finish=[step for step in finish if step is not None],
            snapshot=snapshot,
            call_site=opts.call_site,
            staged=staged,
            copied=copied,
        )
        return self._run_collective(call, opts)

    def _averaged(self, red: ReduceOp, buf: Any, here: bool = True) -> tuple[ReduceOp, Callable[[], None] | None]:
        """The op the algorithm runs for ``red``, and the step that finishes it: ``AVG`` runs as ``SUM``, then
        ``buf`` is divided by the group's size (on this rank if ``here``: a reduce's root)."""
        if red is not ReduceOp.AVG:
            return red, None
        return ReduceOp.SUM, (partial(A.average_, buf, self.size) if here else None)

    # --- collectives -------------------------------------------------------------
    # (the reduce op was checked against the array by the public API, for every backend)

    def all_reduce(self, tensor: Any, opts: Options) -> Work:
        buf, back = A.stage_out(tensor)
        op, avg = self._averaged(opts.op or ReduceOp.SUM, buf)
        return self._call(
            "all_reduce", opts, tensor, A.nbytes(buf), AllReduceArgs(buf, op), [avg, back], [tensor], snapshot=buf
        )

    def broadcast(self, tensor: Any, opts: Options) -> Work:
        buf, back = A.stage_out(tensor)
        return self._call(
            "broadcast", opts, tensor, A.nbytes(buf), BroadcastArgs(buf, opts.root_rank), [back], [tensor], snapshot=buf
        )

    def reduce(self, tensor: Any, opts: Options) -> Work:
        buf, back = A.stage_out(tensor)
        op, avg = self._averaged(opts.op or ReduceOp.SUM, buf, here=self.rank == opts.root_rank)
        return self._call(
            "reduce",
            opts,
            tensor,
            A.nbytes(buf),
            ReduceArgs(buf, op, opts.root_rank),
            [avg, back],
            [tensor],
            snapshot=buf,
        )

    def all_gather(self, output_list: list, tensor: Any, opts: Options) -> Work:
        inp = A.stage_in(tensor)
        out = A.zeros(inp, A.numel(inp) * self.size)
        split = A.split_into(out, output_list)
        return self._gathered(opts, tensor, inp, out, [split], output_list, _staging([out], [out]))

    def all_gather_into_tensor(self, output: Any, input: Any, opts: Options) -> Work:
        inp = A.stage_in(input)
        out, back = A.stage_out(output)
        return self._gathered(opts, input, inp, out, [back], [output], {})

    def _gathered(self, opts: Options, x: Any, inp: Any, out: Any, finish: list, outputs: list, staging: dict) -> Work:
        return self._call(
            "all_gather",
            opts,
            x,
            A.nbytes(inp) * self.size,
            AllGatherArgs(inp, out),
            finish,
            outputs,
            snapshot=out,
            **staging,
        )

    def gather(self, tensor: Any, gather_list: list | None, opts: Options) -> Work:
        root = opts.root_rank
        inp = A.stage_in(tensor)
        out = A.zeros(inp, A.numel(inp) * self.size) if self.rank == root else None
        finish = [A.split_into(out, gather_list or [])] if out is not None else []
        return self._call(
            "gather",
            opts,
            tensor,
            A.nbytes(inp) * self.size,
            GatherArgs(inp, out, root),
            finish,
            list(gather_list or []),
            snapshot=out if out is not None else inp,
            **_staging([out], [out]),
        )

    def scatter(self, tensor: Any, scatter_list: list | None, opts: Options) -> Work:
        root = opts.root_rank
        out, back = A.stage_out(tensor)
        inp = A.concat(scatter_list or []) if self.rank == root else None
        return self._call(
            "scatter",
            opts,
            tensor,
            A.nbytes(out) * self.size,
            ScatterArgs(inp, out, root),
            [back],
            [tensor],
            snapshot=out,
            **_staging([inp], [inp]),
        )

    def reduce_scatter(self, output: Any, input_list: list, opts: Options) -> Work:
        # Outputs may differ in size between ranks (uneven counts); the counts, which every
        # rank must agree on, stand for the shape in the cross-rank check.
        inp = A.concat(input_list)
        counts = [A.numel(x) for x in input_list]
        return self._reduce_scatter(output, inp, counts, opts, _staging([inp], [inp]), shape=None)

    def reduce_scatter_tensor(self, output: Any, input: Any, opts: Options) -> Work:
        return self._reduce_scatter(output, A.stage_in(input), [A.numel(output)] * self.size, opts, {})

    def _reduce_scatter(
        self, output: Any, inp: Any, counts: list[int], opts: Options, staging: dict, **extra: Any
    ) -> Work:
        out, back = A.stage_out(output)
        op, avg = self._averaged(opts.op or ReduceOp.SUM, out)
        return self._call(
            "reduce_scatter",
            opts,
            output,
            A.nbytes(inp),
            ReduceScatterArgs(inp, out, counts, op),
            [avg, back],
            [output],
            snapshot=out,
            counts=tuple(counts),
            **staging,
            **extra,
        )

    def all_to_all(self, output_list: list, input_list: list, opts: Options) -> Work:
        inp = A.concat(input_list)
        out = A.zeros(inp, sum(A.numel(x) for x in output_list))
        send = [A.numel(x) for x in input_list]
        recv = [A.numel(x) for x in output_list]
        # Only counts known to be equal on every rank may let the automatic choice pick Bruck:
        # a rank cannot see the other ranks' lists, so lists never count as equal.
        split = A.split_into(out, output_list)
        staging = _staging([inp, out], [inp, out])
        return self._all_to_all(
            output_list[0], AllToAllArgs(inp, out, send, recv), [split], output_list, opts, False, staging
        )

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts) -> Work:
        inp = A.stage_in(input)
        staging = {}
        if A.may_overlap(input, output):  # in place: the algorithms would overwrite blocks not yet sent
            inp = A.concat([inp])
            staging = _staging([inp], [inp])
        out, back = A.stage_out(output)
        send = A.split_counts(input, input_split_sizes, self.size)
        recv = A.split_counts(output, output_split_sizes, self.size)
        equal = output_split_sizes is None and input_split_sizes is None
        return self._all_to_all(output, AllToAllArgs(inp, out, send, recv), [back], [output], opts, equal, staging)

    def _all_to_all(
        self, x: Any, args: AllToAllArgs, finish: list, outputs: list, opts: Options, equal: bool, staging: dict
    ) -> Work:
        return self._call(
            "all_to_all",
            opts,
            x,
            A.nbytes(args.inp),
            args,
            finish,
            outputs,
            snapshot=args.out,
            equal_counts=equal,
            shape=None,
            **staging,
        )

    def barrier(self, opts: Options) -> Work:
        return self._call(
            "barrier",
            opts,
            _BARRIER_SCRATCH,
            0,
            BarrierArgs(_BARRIER_SCRATCH),
            [],
            [],
            snapshot=None,
            dtype=None,
            shape=None,
        )


def _staging(new: Sequence[Any], copied: Sequence[Any]) -> dict[str, Any]:
    """``staged`` and ``copied`` of a :class:`CollectiveCall` whose rank allocates the buffers ``new`` and
    copies each of ``copied`` once (``None``: a buffer this rank does not have)."""
    return {
        "staged": tuple(A.nbytes(b) for b in new if b is not None),
        "copied": sum(A.nbytes(b) for b in copied if b is not None),
    }


def _check_bruck(send: Sequence[int], recv: Sequence[int]) -> None:
    """Bruck moves equal blocks: reject uneven counts on every level of detail, before any message."""
    if len(set(send) | set(recv)) > 1:
        raise ValueError(
            f"algorithm='bruck' needs equal counts for every rank; got send counts {list(send)!r:.80} and "
            f"receive counts {list(recv)!r:.80} (use 'pairwise' or 'direct' for uneven counts)"
        )


_BARRIER_SCRATCH = np.zeros(1, dtype=np.uint8)
"""What barrier messages are cut from (they carry zero bytes of it, so it is never written)."""
