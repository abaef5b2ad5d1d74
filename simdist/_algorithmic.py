"""``AlgorithmicGroup``: collectives built from ``simdist.algorithms`` over a Transport.

The simulator and the socket backend share this class. It stages arrays into flat
buffers, packs list arguments, picks an algorithm and describes the call as a
:class:`CollectiveCall`; the backend only decides how messages travel
(:meth:`AlgorithmicGroup._run_collective`).
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from . import _arrays as A
from . import algorithms
from ._group import Options, ProcessGroup
from ._reduce_op import ReduceOp
from ._work import Work, chain

__all__ = ["AlgorithmicGroup", "CollectiveCall"]


@dataclass(eq=False)
class CollectiveCall:
    """One rank's part in one collective, ready for a backend to run.

    Attributes:
        op: the collective's name (``'all_reduce'``).
        algorithm: the chosen algorithm's name.
        signature: the fields that must agree on every rank (dtype, shape, op, root, ...).
        start: makes the algorithm's generator for a Transport.
        oneshot: computes every rank's result at once from all ranks' calls (fast mode).
        nbytes: the size the cost model charges for.
        finish: run once the data is in place (write-backs, the division of AVG).
        outputs: what ``Work.result()`` returns.
        snapshot: the flat buffer whose values the trace may record after each step.
        args: the staged buffers, read by ``oneshot`` across ranks.
        staged: the bytes of each new flat buffer this rank allocates around the algorithm to
            hold list arguments (the simulator charges their first touch, ``Topology.setup``).
        copied: the bytes this rank copies between list arguments and those buffers.
    """

    op: str
    algorithm: str
    signature: dict[str, Any]
    start: Callable[[Any], Any]
    oneshot: Callable[[list["CollectiveCall"]], None]
    nbytes: int
    finish: Callable[[], None]
    outputs: list
    snapshot: Any = None
    args: dict[str, Any] = field(default_factory=dict)
    call_site: str | None = None
    staged: tuple[int, ...] = ()
    copied: int = 0


class AlgorithmicGroup(ProcessGroup):
    """A ProcessGroup whose collectives are ``simdist.algorithms`` over a Transport.

    ``network`` holds the ``alpha``/``beta`` that the automatic choice of algorithm
    assumes (empty: the defaults of :func:`simdist.algorithms.choose`).
    """

    network: dict[str, float] = {}

    @abstractmethod
    def _run_collective(self, call: CollectiveCall, opts: Options) -> Work:
        """Start ``call`` on this rank and return its Work."""

    def _pick(self, op: str, opts: Options, nbytes: int, equal_counts: bool = True) -> str:
        name = opts.algorithm or self.default_algorithms.get(op)
        if name is None:
            return algorithms.choose(op, nbytes, self.size, equal_counts=equal_counts, **self.network)
        algorithms.get(op, name)
        return name

    def _signature(self, op: str, algorithm: str, opts: Options, x: Any, **extra: Any) -> dict:
        sig = {"op": op, "dtype": A.dtype_name(x), "shape": A.shape_of(x), "algorithm": algorithm}
        sig["async_op"] = bool(opts.async_op)
        if opts.op is not None:
            sig["reduce_op"] = opts.op.name
        if opts.root is not None:
            sig["root"] = self.ranks[opts.root]
        sig.update(extra)
        return sig

    def _call(self, op, opts, x, nbytes, make, oneshot, finish, outputs, snapshot, args, equal_counts=True,
              staged=(), copied=0, **extra):
        algo = self._pick(op, opts, nbytes, equal_counts)
        if op == "all_to_all" and algo == "bruck":
            _check_bruck(args["send"], args["recv"])
        fn = algorithms.get(op, algo)
        call = CollectiveCall(
            op=op,
            algorithm=algo,
            signature=self._signature(op, algo, opts, x, **extra),
            start=lambda t: make(fn, t),
            oneshot=oneshot,
            nbytes=nbytes,
            finish=finish,
            outputs=outputs,
            snapshot=snapshot,
            args=args,
            call_site=opts.call_site,
            staged=staged,
            copied=copied,
        )
        return self._run_collective(call, opts)

    # --- collectives -------------------------------------------------------------

    def all_reduce(self, tensor: Any, opts: Options) -> Work:
        red = opts.op or ReduceOp.SUM
        A.check_reduce_op(tensor, red)
        buf, back = A.stage_out(tensor)
        base = ReduceOp.SUM if red is ReduceOp.AVG else red
        avg = (lambda: A.average_(buf, self.size)) if red is ReduceOp.AVG else None
        return self._call(
            "all_reduce",
            opts,
            tensor,
            A.nbytes(buf),
            make=lambda fn, t: fn(t, buf, base),
            oneshot=lambda calls: algorithms.oneshot.all_reduce([c.args["buf"] for c in calls], base),
            finish=chain(avg, back),
            outputs=[tensor],
            snapshot=buf,
            args={"buf": buf},
        )

    def broadcast(self, tensor: Any, opts: Options) -> Work:
        buf, back = A.stage_out(tensor)
        root = opts.root
        return self._call(
            "broadcast",
            opts,
            tensor,
            A.nbytes(buf),
            make=lambda fn, t: fn(t, buf, root),
            oneshot=lambda calls: algorithms.oneshot.broadcast([c.args["buf"] for c in calls], root),
            finish=chain(back),
            outputs=[tensor],
            snapshot=buf,
            args={"buf": buf},
        )

    def reduce(self, tensor: Any, opts: Options) -> Work:
        red = opts.op or ReduceOp.SUM
        A.check_reduce_op(tensor, red)
        buf, back = A.stage_out(tensor)
        root = opts.root
        base = ReduceOp.SUM if red is ReduceOp.AVG else red
        avg = None
        if red is ReduceOp.AVG and self.rank == root:
            avg = lambda: A.average_(buf, self.size)  # noqa: E731
        return self._call(
            "reduce",
            opts,
            tensor,
            A.nbytes(buf),
            make=lambda fn, t: fn(t, buf, base, root),
            oneshot=lambda calls: algorithms.oneshot.reduce([c.args["buf"] for c in calls], base, root),
            finish=chain(avg, back),
            outputs=[tensor],
            snapshot=buf,
            args={"buf": buf},
        )

    def all_gather(self, output_list: list, tensor: Any, opts: Options) -> Work:
        inp = A.stage_in(tensor)
        out = A.zeros(inp, A.numel(inp) * self.size)
        split = A.split_into(out, output_list)
        return self._gathered("all_gather", opts, tensor, inp, out, split, output_list, _staging([out], [out]))

    def all_gather_into_tensor(self, output: Any, input: Any, opts: Options) -> Work:
        inp = A.stage_in(input)
        out, back = A.stage_out(output)
        return self._gathered("all_gather", opts, input, inp, out, chain(back), [output], {})

    def _gathered(self, op, opts, x, inp, out, finish, outputs, staging):
        return self._call(
            op,
            opts,
            x,
            A.nbytes(inp) * self.size,
            make=lambda fn, t: fn(t, inp, out),
            oneshot=lambda calls: algorithms.oneshot.all_gather(
                [c.args["inp"] for c in calls], [c.args["out"] for c in calls]
            ),
            finish=finish,
            outputs=outputs,
            snapshot=out,
            args={"inp": inp, "out": out},
            **staging,
        )

    def gather(self, tensor: Any, gather_list: list | None, opts: Options) -> Work:
        root = opts.root
        inp = A.stage_in(tensor)
        out = A.zeros(inp, A.numel(inp) * self.size) if self.rank == root else None
        finish = A.split_into(out, gather_list) if out is not None else chain()
        return self._call(
            "gather",
            opts,
            tensor,
            A.nbytes(inp) * self.size,
            make=lambda fn, t: fn(t, inp, out, root),
            oneshot=lambda calls: algorithms.oneshot.gather(
                [c.args["inp"] for c in calls], calls[root].args["out"], root
            ),
            finish=finish,
            outputs=list(gather_list or []),
            snapshot=out if out is not None else inp,
            args={"inp": inp, "out": out},
            **_staging([out], [out]),
        )

    def scatter(self, tensor: Any, scatter_list: list | None, opts: Options) -> Work:
        root = opts.root
        out, back = A.stage_out(tensor)
        inp = A.concat(scatter_list) if self.rank == root else None
        return self._call(
            "scatter",
            opts,
            tensor,
            A.nbytes(out) * self.size,
            make=lambda fn, t: fn(t, inp, out, root),
            oneshot=lambda calls: algorithms.oneshot.scatter(
                calls[root].args["inp"], [c.args["out"] for c in calls], root
            ),
            finish=chain(back),
            outputs=[tensor],
            snapshot=out,
            args={"inp": inp, "out": out},
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

    def _reduce_scatter(self, output, inp, counts, opts, staging, **extra):
        red = opts.op or ReduceOp.SUM
        A.check_reduce_op(output, red)
        out, back = A.stage_out(output)
        base = ReduceOp.SUM if red is ReduceOp.AVG else red
        avg = (lambda: A.average_(out, self.size)) if red is ReduceOp.AVG else None
        return self._call(
            "reduce_scatter",
            opts,
            output,
            A.nbytes(inp),
            make=lambda fn, t: fn(t, inp, out, counts, base),
            oneshot=lambda calls: algorithms.oneshot.reduce_scatter(
                [c.args["inp"] for c in calls], [c.args["out"] for c in calls], counts, base
            ),
            finish=chain(avg, back),
            outputs=[output],
            snapshot=out,
            args={"inp": inp, "out": out},
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
        return self._all_to_all(output_list[0], inp, out, send, recv, split, output_list, opts, False, staging)

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
        return self._all_to_all(output, inp, out, send, recv, chain(back), [output], opts, equal, staging)

    def _all_to_all(self, x, inp, out, send, recv, finish, outputs, opts, equal, staging):
        return self._call(
            "all_to_all",
            opts,
            x,
            A.nbytes(inp),
            make=lambda fn, t: fn(t, inp, out, send, recv),
            oneshot=lambda calls: algorithms.oneshot.all_to_all(
                [c.args["inp"] for c in calls],
                [c.args["out"] for c in calls],
                [c.args["send"] for c in calls],
                [c.args["recv"] for c in calls],
            ),
            finish=finish,
            outputs=outputs,
            snapshot=out,
            args={"inp": inp, "out": out, "send": send, "recv": recv},
            equal_counts=equal,
            shape=None,
            **staging,
        )

    def barrier(self, opts: Options) -> Work:
        scratch = _BARRIER_SCRATCH
        return self._call(
            "barrier",
            opts,
            scratch,
            0,
            make=lambda fn, t: fn(t, scratch),
            oneshot=lambda calls: None,
            finish=chain(),
            outputs=[],
            snapshot=None,
            args={},
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
