"""The socket backend's ProcessGroup: ``simdist.algorithms`` over real connections."""

from __future__ import annotations

import itertools
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from simdist.core import arrays as A
from simdist import algorithms
from simdist.algorithms import AlgorithmicGroup, CollectiveCall
from simdist.core import DistTimeoutError
from simdist.core import Options
from simdist.core import CompletedWork, DeferredWork, Work

from ._checked import check_collective

__all__ = ["SocketGroup"]

_P2P = 0


def _ctx(group_id: int, seq: int) -> int:
    """The context of collective ``seq`` of a group (``seq`` 0 is the group's point-to-point traffic)."""
    return (group_id << 40) | seq


class SocketGroup(AlgorithmicGroup):
    """One process's handle on a group of processes connected by a ``PeerNetwork``."""

    backend = "socket"
    network = {"alpha": 150e-6, "beta": 1 / 2e9, "gamma": 1 / 5e9}
    """What the automatic choice of algorithm assumes, measured on loopback between two
    processes of a 2-core machine: 150 µs per message (one-way latency of a small message
    through ``PeerNetwork``, 140-210 µs; streamed messages cost about 50 µs each), 2 GB/s (a
    Python TCP stream, BENCHMARKS.md section d) and 5 GB/s for reducing (``torch.add_`` of
    64 MiB float32 on one thread, out of cache)."""

    def __init__(
        self,
        peers: Any,
        rank: int,
        ranks: Sequence[int],
        group_id: int,
        timeout: float,
        recorder: Any = None,
        checked: bool = True,
    ):
        super().__init__(rank, ranks, group_id)
        self.checked = checked
        self.peers = peers
        self.recorder = recorder
        self.timeout = timeout
        self._seqs = itertools.count(1)  # the number of each collective call (next() is atomic)
        self.worker: ThreadPoolExecutor | None = None
        self._machines: tuple[str, ...] | None = None  # the machine of each group rank, once asked

    def _hosts(self) -> tuple[str, ...]:
        """The machine (its address) of each group rank, read from the store once; every rank reads the same."""
        if self._machines is None:
            self._machines = tuple(self.peers.hosts(self.ranks))
        return self._machines

    def _run_collective(self, call: CollectiveCall, opts: Options) -> Work:
        seq = next(self._seqs)
        hosts = self._hosts() if call.algorithm == "hierarchical" else None
        transport = self.peers.transport(self.ranks, self.rank, _ctx(self.group_id, seq), self.timeout, hosts)
        recorder = self.recorder
        entry = (
            None
            if recorder is None
            else recorder.start(self.group_id, seq, call.op, call.signature.get("shape"), call.call_site)
        )
        if not opts.async_op:
            self._run(call, transport, seq, entry)
            return CompletedWork(call.outputs)
        if self.worker is None:
            self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"simdist-group-{self.group_id}")
        future = self.worker.submit(self._run, call, transport, seq, entry)
        return DeferredWork(future.result, future.done, call.outputs)

    def _run(self, call: CollectiveCall, transport: Any, seq: int, entry: dict | None) -> None:
        """Run collective ``seq`` on ``transport`` to its end (checked first where the check is on); ``entry``:
        its flight-recorder entry, completed at the end."""
        recorder = self.recorder
        try:
            if self.checked:
                check_collective(transport, self, seq, call)
            algorithms.run_blocking(call.start(transport), transport)
            transport.give_back()
        except DistTimeoutError as exc:
            if recorder is None:
                raise
            report = recorder.report(self.group_id, self.ranks, seq, call.op)
            raise DistTimeoutError(f"{report}\n({exc})") from exc
        call.complete()
        if entry is not None:
            recorder.complete(entry, call.algorithm)

    def send(self, tensor: Any, dst: int, opts: Options) -> Work:
        buf = A.stage_in(tensor)
        t0 = time.time()
        handle = self.peers.isend(buf, self.ranks[dst], _ctx(self.group_id, _P2P), opts.tag or 0)
        return self._p2p_work(handle, [tensor], None, opts, None, ("send", self.ranks[dst], A.nbytes(buf), t0))

    def recv(self, tensor: Any, src: int | None, opts: Options) -> Work:
        buf, back = A.stage_out(tensor)
        peer = None if src is None else self.ranks[src]
        t0 = time.time()
        handle = self.peers.irecv(buf, peer, _ctx(self.group_id, _P2P), opts.tag or 0)
        source = (lambda: handle.source) if peer is None else peer
        return self._p2p_work(handle, [tensor], back, opts, source, ("recv", source, A.nbytes(buf), t0))

    def _p2p_work(self, handle: Any, outputs: list, back: Any, opts: Options, source: Any, record: tuple) -> Work:
        """The work of a send or receive; ``record`` (kind, peer, bytes, start) goes to the trace once it is waited."""
        peers = self.peers
        recorder = self.recorder if self.recorder is not None and self.recorder.tracing else None

        def finish(timeout: float | None) -> None:
            peers.wait([handle], self.timeout if timeout is None else timeout)
            if back is not None:
                back()
            if recorder is not None:
                kind, peer, nbytes, t0 = record
                peer = peer() if callable(peer) else peer
                recorder.p2p(kind, self.group_id, peer, opts.tag or 0, nbytes, t0, opts.call_site)

        return DeferredWork(finish, lambda: bool(getattr(handle, "done", False)), outputs, source)

    def destroy(self) -> None:
        if self.worker is not None:
            self.worker.shutdown(wait=True)
            self.worker = None
