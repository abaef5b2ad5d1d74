"""``LibraryGroup``: collectives that a communication library runs (torch.distributed, NCCL).

A backend of this kind implements a dozen *primitives* on flat, contiguous buffers that
the library accepts as they are (the ``_lib_*`` methods). Everything else is written
here once, for every such backend:

- arrays are staged into flat buffers (views where they can be, copies written back
  where they cannot), and moved as bytes, so every dtype travels even where the library
  knows no such type;
- list arguments become slices of one buffer;
- a reduction the library cannot do on a dtype (``library_reduces`` says which) is done
  by exchanging the data and reducing locally with simdist's reductions, in rank order;
- ``ReduceOp.AVG`` becomes a sum and a division where the library has no average;
- the Work waits for the library's handles, then runs the write-backs.

``Options.algorithm`` names one of simdist's own algorithms; a library chooses its own,
so it is ignored here (see :meth:`LibraryGroup.note_algorithm`).
"""

from __future__ import annotations

import warnings
from abc import abstractmethod
from functools import partial
from typing import Any, Callable, Protocol, Sequence

from . import _arrays as A
from ._callsite import user_call_site
from ._group import Options, ProcessGroup
from ._reduce_op import ReduceOp
from ._work import DeferredWork, Work, chain

__all__ = ["LibraryGroup", "Handle"]


class Handle(Protocol):
    """What a primitive returns: the library's own handle on the operation it started."""

    def wait(self, timeout: float | None = None) -> Any: ...

    def is_completed(self) -> bool: ...


class LibraryGroup(ProcessGroup):
    """A ProcessGroup whose operations are calls of a communication library.

    Subclasses translate: :meth:`library_buffer` turns a flat staged buffer into one the
    library accepts, :meth:`library_reduces` says which reductions it does natively, and
    the ``_lib_*`` primitives start one library call each and return its handle. Ranks
    given to primitives are group ranks.
    """

    # --- what a backend provides ----------------------------------------------------

    def library_buffer(self, flat: Any, written: bool) -> tuple[Any, Callable[[], None] | None]:
        """A buffer the library accepts holding ``flat``'s values, and, if it is a copy that
        the operation writes, the step that copies it back into ``flat``."""
        return flat, None

    @abstractmethod
    def library_reduces(self, buf: Any, op: ReduceOp) -> bool:
        """Whether the library itself reduces library buffer ``buf`` (its dtype, on its device) with ``op``."""

    @abstractmethod
    def _lib_all_reduce(self, buf: Any, op: ReduceOp) -> Handle: ...

    @abstractmethod
    def _lib_broadcast(self, buf: Any, root: int) -> Handle: ...

    @abstractmethod
    def _lib_reduce(self, buf: Any, op: ReduceOp, root: int) -> Handle:
        """Reduce into ``buf`` on ``root``; ``buf`` on the other ranks keeps its values."""

    @abstractmethod
    def _lib_all_gather(self, out: Any, inp: Any) -> Handle:
        """``out`` (``size`` times ``inp``'s length) gets every rank's ``inp`` in rank order."""

    @abstractmethod
    def _lib_reduce_scatter(self, out: Any, inp: Any, op: ReduceOp) -> Handle:
        """``out`` gets block ``rank`` of the reduction of every rank's ``inp`` (``size`` blocks)."""

    @abstractmethod
    def _lib_gather(self, out: Any | None, inp: Any, root: int) -> Handle: ...

    @abstractmethod
    def _lib_scatter(self, out: Any, inp: Any | None, root: int) -> Handle: ...

    @abstractmethod
    def _lib_all_to_all(self, out: Any, recv: list[int], inp: Any, send: list[int]) -> Handle:
        """Send ``send[i]`` consecutive elements of ``inp`` to rank ``i``; receive ``recv[i]`` from it."""

    @abstractmethod
    def _lib_send(self, buf: Any, peer: int, tag: int) -> Handle: ...

    @abstractmethod
    def _lib_recv(self, buf: Any, peer: int | None, tag: int) -> tuple[Handle, Callable[[], int]]:
        """Start a receive; return its handle and a function giving the sender's group rank."""

    @abstractmethod
    def _lib_barrier(self) -> Handle: ...

    def _lib_batch(self, ops: list[tuple[str, Any, int, int]]) -> list[Handle]:
        """Start ``(kind, buffer, peer, tag)`` sends and receives together; one handle each."""
        return [
            self._lib_send(buf, peer, tag) if kind == "send" else self._lib_recv(buf, peer, tag)[0]
            for kind, buf, peer, tag in ops
        ]

    def note_algorithm(self, op: str, opts: Options) -> None:
        """Warn once per group and op that ``algorithm=`` names one of simdist's algorithms, not the library's."""
        name = opts.algorithm or self.default_algorithms.get(op)
        noted = self.__dict__.setdefault("_noted_algorithms", set())
        if name is not None and op not in noted:
            noted.add(op)
            filename, _, line = (opts.call_site or user_call_site()).rpartition(":")
            warnings.warn_explicit(
                f"{op}(algorithm={name!r}) is ignored on backend {self.backend!r}: the library chooses "
                "its own algorithms (algorithm= picks among simdist's, on 'sim' and 'socket')",
                UserWarning,
                filename,
                int(line) if line.isdigit() else 0,
            )

    # --- staging ----------------------------------------------------------------------

    def _input(self, x: Any) -> Any:
        return self.library_buffer(A.stage_in(x), written=False)[0]

    def _output(self, x: Any) -> tuple[Any, Callable[[], None]]:
        """A library buffer holding ``x``'s values, and the steps that write results back into ``x``."""
        flat, back = A.stage_out(x)
        buf, lib_back = self.library_buffer(flat, written=True)
        return buf, chain(lib_back, back)

    def _reduction(self, buf: Any, op: ReduceOp) -> tuple[ReduceOp | None, Callable[[], None] | None]:
        """The op to give the library for ``buf`` (``None``: reduce locally), and a step to run after."""
        if self.library_reduces(buf, op):
            return op, None
        if op is ReduceOp.AVG and self.library_reduces(buf, ReduceOp.SUM):
            return ReduceOp.SUM, lambda: A.average_(buf, self.size)
        return None, None

    def _reduce_blocks(self, dst: Any, blocks: Any, n: int, op: ReduceOp) -> Callable[[], None]:
        """A step that writes into ``dst`` the reduction of the ``size`` consecutive ``n``-element
        blocks of ``blocks``, in rank order (then divided, for AVG)."""

        def run() -> None:
            A.copy_(dst, A.narrow(blocks, 0, n))
            for k in range(1, self.size):
                A.reduce_(dst, A.narrow(blocks, k * n, n), op)
            if op is ReduceOp.AVG:
                A.average_(dst, self.size)

        return run

    def _gathered_reduction(self, buf: Any, op: ReduceOp) -> tuple[Handle, Callable[[], None]]:
        """For a reduction the library lacks: gather every rank's ``buf``; return the gather's
        handle and the step that then reduces the copies into ``buf``."""
        n = A.numel(buf)
        everyone = A.empty(buf, n * self.size)
        handle = self._lib_all_gather(A.byte_view(everyone), A.byte_view(buf))
        return handle, self._reduce_blocks(buf, everyone, n, op)

    def _work(
        self,
        handles: Sequence[Handle],
        *steps: Callable[[], None] | None,
        outputs: list,
        source: Callable[[], int] | None = None,
    ) -> Work:
        """A Work that waits for ``handles``, then runs ``steps`` (write-backs) once."""
        after = chain(*steps)

        def finish(timeout: float | None) -> None:
            for h in handles:
                h.wait(timeout)
            after()

        return DeferredWork(finish, lambda: all(h.is_completed() for h in handles), outputs, source)

    # --- point to point -------------------------------------------------------------------

    def send(self, tensor: Any, dst: int, opts: Options) -> Work:
        buf = self._input(tensor)
        return self._work([self._lib_send(A.byte_view(buf), dst, opts.tag or 0)], outputs=[tensor])

    def recv(self, tensor: Any, src: int | None, opts: Options) -> Work:
        buf, back = self._output(tensor)
        handle, sender = self._lib_recv(A.byte_view(buf), src, opts.tag or 0)
        return self._work([handle], back, outputs=[tensor], source=lambda: self.ranks[sender()])

    def batch_p2p(self, ops: Sequence[tuple[str, Any, int, Options]]) -> list[Work]:
        prepared = []  # (kind, library buffer, peer, tag, write-back, the user's tensor)
        for kind, tensor, peer, opts in ops:
            buf, back = (self._input(tensor), None) if kind == "send" else self._output(tensor)
            prepared.append((kind, A.byte_view(buf), peer, opts.tag or 0, back, tensor))
        handles = self._lib_batch([p[:4] for p in prepared])
        return [
            self._work([h], back, outputs=[tensor], source=partial(self.ranks.__getitem__, peer))
            for h, (kind, _, peer, _, back, tensor) in zip(handles, prepared)
        ]

    # --- collectives ------------------------------------------------------------------------

    def broadcast(self, tensor: Any, opts: Options) -> Work:
        self.note_algorithm("broadcast", opts)
        buf, back = self._output(tensor)
        return self._work([self._lib_broadcast(A.byte_view(buf), opts.root_rank)], back, outputs=[tensor])

    def all_reduce(self, tensor: Any, opts: Options) -> Work:
        self.note_algorithm("all_reduce", opts)
        op = opts.op or ReduceOp.SUM
        buf, back = self._output(tensor)
        lib_op, after = self._reduction(buf, op)
        if lib_op is not None:
            return self._work([self._lib_all_reduce(buf, lib_op)], after, back, outputs=[tensor])
        handle, reduce_here = self._gathered_reduction(buf, op)
        return self._work([handle], reduce_here, back, outputs=[tensor])

    def reduce(self, tensor: Any, opts: Options) -> Work:
        self.note_algorithm("reduce", opts)
        op, root = opts.op or ReduceOp.SUM, opts.root_rank
        buf, back = self._output(tensor)
        lib_op, after = self._reduction(buf, op)
        mine = self.rank == root
        if lib_op is not None:
            return self._work([self._lib_reduce(buf, lib_op, root)], after if mine else None, back, outputs=[tensor])
        handle, reduce_here = self._gathered_reduction(buf, op)
        return self._work([handle], reduce_here if mine else None, back, outputs=[tensor])

    def all_gather(self, output_list: list, tensor: Any, opts: Options) -> Work:
        self.note_algorithm("all_gather", opts)
        inp = self._input(tensor)
        out = A.empty(inp, A.numel(inp) * self.size)
        handle = self._lib_all_gather(A.byte_view(out), A.byte_view(inp))
        return self._work([handle], A.split_into(out, output_list), outputs=output_list)

    def all_gather_into_tensor(self, output: Any, input: Any, opts: Options) -> Work:
        self.note_algorithm("all_gather", opts)
        inp = self._input(input)
        out, back = self._output(output)
        return self._work([self._lib_all_gather(A.byte_view(out), A.byte_view(inp))], back, outputs=[output])

    def gather(self, tensor: Any, gather_list: list | None, opts: Options) -> Work:
        self.note_algorithm("gather", opts)
        inp = self._input(tensor)
        root, gather_list = opts.root_rank, gather_list or []
        if self.rank != root:
            return self._work([self._lib_gather(None, A.byte_view(inp), root)], outputs=[])
        out = A.empty(inp, A.numel(inp) * self.size)
        handle = self._lib_gather(A.byte_view(out), A.byte_view(inp), root)
        return self._work([handle], A.split_into(out, gather_list), outputs=list(gather_list))

    def scatter(self, tensor: Any, scatter_list: list | None, opts: Options) -> Work:
        self.note_algorithm("scatter", opts)
        out, back = self._output(tensor)
        inp = None
        if self.rank == opts.root_rank:
            inp = A.byte_view(self.library_buffer(A.concat(scatter_list or []), written=False)[0])
        return self._work([self._lib_scatter(A.byte_view(out), inp, opts.root_rank)], back, outputs=[tensor])

    def reduce_scatter(self, output: Any, input_list: list, opts: Options) -> Work:
        counts = [A.numel(x) for x in input_list]
        return self._reduce_scatter(output, A.concat(input_list), counts, opts)

    def reduce_scatter_tensor(self, output: Any, input: Any, opts: Options) -> Work:
        return self._reduce_scatter(output, A.stage_in(input), [A.numel(output)] * self.size, opts)

    def _reduce_scatter(self, output: Any, flat_in: Any, counts: list[int], opts: Options) -> Work:
        """Block ``i`` (``counts[i]`` elements) of every rank's input, reduced, lands on rank ``i``."""
        self.note_algorithm("reduce_scatter", opts)
        op = opts.op or ReduceOp.SUM
        inp = self.library_buffer(flat_in, written=False)[0]
        out, back = self._output(output)
        lib_op, after = self._reduction(out, op)
        if lib_op is not None and len(set(counts)) == 1:
            return self._work([self._lib_reduce_scatter(out, inp, lib_op)], after, back, outputs=[output])
        # Uneven blocks, or a reduction the library lacks: each rank receives its block from
        # every rank and reduces them itself.
        n = counts[self.rank]
        blocks = A.empty(out, n * self.size)
        size = A.itemsize(out)
        handle = self._lib_all_to_all(
            A.byte_view(blocks), [n * size] * self.size, A.byte_view(inp), [c * size for c in counts]
        )
        return self._work([handle], self._reduce_blocks(out, blocks, n, op), back, outputs=[output])

    def all_to_all(self, output_list: list, input_list: list, opts: Options) -> Work:
        self.note_algorithm("all_to_all", opts)
        inp = self.library_buffer(A.concat(input_list), written=False)[0]
        out = A.empty(inp, sum(A.numel(x) for x in output_list))
        size = A.itemsize(inp)
        handle = self._lib_all_to_all(
            A.byte_view(out),
            [A.numel(x) * size for x in output_list],
            A.byte_view(inp),
            [A.numel(x) * size for x in input_list],
        )
        return self._work([handle], A.split_into(out, output_list), outputs=output_list)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts) -> Work:
        self.note_algorithm("all_to_all", opts)
        flat_in = A.stage_in(input)
        if A.may_overlap(input, output):  # in place: keep what is sent apart from what is received
            flat_in = A.concat([flat_in])
        inp = self.library_buffer(flat_in, written=False)[0]
        out, back = self._output(output)
        size = A.itemsize(inp)
        send = [c * size for c in A.split_counts(input, input_split_sizes, self.size)]
        recv = [c * size for c in A.split_counts(output, output_split_sizes, self.size)]
        handle = self._lib_all_to_all(A.byte_view(out), recv, A.byte_view(inp), send)
        return self._work([handle], back, outputs=[output])

    def barrier(self, opts: Options) -> Work:
        return self._work([self._lib_barrier()], outputs=[])
