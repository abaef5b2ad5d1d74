"""A tiny in-memory Transport that runs one algorithm generator per rank, for tests.

``run(size, make, seed=None)`` calls ``make(t)`` for each rank's transport ``t`` and
advances the generators until all finish. Channels are FIFO queues keyed by
``(src, dst, tag)``; a send completes only when a matching receive is posted
(synchronous, so latent deadlocks show). The bytes move as late as the contract allows:
just before either side is resumed from a ``yield`` that waits on the transfer, so an
algorithm that touches a buffer before waiting on it gets caught.

Without a seed, ranks advance round-robin; with a seed, a seeded ``random.Random``
picks the next runnable rank at every step, so tests can check order independence.
Anything that would hang or is out of contract raises ``AssertionError`` with details.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from simdist.core import _arrays as A

__all__ = ["Message", "Loopback", "run"]


@dataclass(eq=False)
class _Op:
    kind: str  # "send" or "recv"
    rank: int
    peer: int
    tag: int
    buf: Any
    chunk: int | None
    step: int  # the poster's number of yields so far
    matched: "_Op | None" = None
    copied: bool = False
    waited: bool = False

    def describe(self) -> str:
        arrow = "->" if self.kind == "send" else "<-"
        return (
            f"rank {self.rank} {self.kind} {arrow} {self.peer} tag={self.tag} "
            f"{A.dtype_name(self.buf)}[{A.numel(self.buf)}] chunk={self.chunk}"
        )


@dataclass(frozen=True)
class Message:
    """One delivered message, in the order messages were matched."""

    src: int
    dst: int
    tag: int
    nbytes: int
    chunk: int | None
    step: int  # the sender's step (number of yields before it posted the send)
    recv_step: int  # the receiver's step when it posted the receive


@dataclass
class _Rank:
    rank: int
    gen: Iterator[list] | None = None
    waiting: list[_Op] = field(default_factory=list)
    posted: list[_Op] = field(default_factory=list)
    steps: int = 0
    done: bool = False


class _Endpoint:
    """The Transport one rank's algorithm sees."""

    def __init__(self, hub: "Loopback", rank: int) -> None:
        self._hub = hub
        self.rank = rank
        self.size = hub.size

    def isend(self, buf: Any, peer: int, tag: int = 0, *, chunk: int | None = None) -> _Op:
        return self._hub._post("send", self.rank, buf, peer, tag, chunk)

    def irecv(self, buf: Any, peer: int, tag: int = 0, *, chunk: int | None = None) -> _Op:
        return self._hub._post("recv", self.rank, buf, peer, tag, chunk)

    def wait(self, handles: Any) -> None:  # pragma: no cover - generators yield instead
        raise AssertionError("the loopback transport runs generators; yield handles instead")


class Loopback:
    """Runs ``size`` algorithm generators against each other in memory."""

    def __init__(self, size: int, seed: int | None = None) -> None:
        self.size = size
        self.messages: list[Message] = []
        self._rng = random.Random(seed) if seed is not None else None
        self._ranks = [_Rank(r) for r in range(size)]
        self._sends: dict[tuple[int, int, int], deque[_Op]] = {}
        self._recvs: dict[tuple[int, int, int], deque[_Op]] = {}

    # -- posting and matching -------------------------------------------------
    def _post(self, kind: str, rank: int, buf: Any, peer: int, tag: int, chunk: int | None) -> _Op:
        assert A.is_array(buf), f"rank {rank} {kind}: buffer is {type(buf).__name__}, not an array"
        assert len(A.shape_of(buf)) == 1, f"rank {rank} {kind}: buffer shape {A.shape_of(buf)} is not flat"
        assert isinstance(peer, int) and 0 <= peer < self.size, f"rank {rank} {kind}: bad peer {peer!r}"
        assert peer != rank, f"rank {rank} {kind}s to itself (tag {tag})"
        assert isinstance(tag, int) and tag >= 0, f"rank {rank} {kind}: tag {tag!r} is not a non-negative int"
        assert chunk is None or (isinstance(chunk, int) and chunk >= 0), f"bad chunk {chunk!r}"
        op = _Op(kind, rank, peer, tag, buf, chunk, self._ranks[rank].steps)
        self._ranks[rank].posted.append(op)
        src, dst = (rank, peer) if kind == "send" else (peer, rank)
        mine, theirs = (self._sends, self._recvs) if kind == "send" else (self._recvs, self._sends)
        key = (src, dst, tag)
        queue = theirs.get(key)
        if queue:
            other = queue.popleft()
            self._match(op if kind == "send" else other, other if kind == "send" else op)
        else:
            mine.setdefault(key, deque()).append(op)
        return op

    def _match(self, s: _Op, r: _Op) -> None:
        sb, rb = A.nbytes(s.buf), A.nbytes(r.buf)
        assert sb == rb and A.dtype_name(s.buf) == A.dtype_name(r.buf), (
            f"size mismatch: {s.describe()} ({sb} bytes) matched {r.describe()} ({rb} bytes)"
        )
        s.matched, r.matched = r, s
        self.messages.append(Message(s.rank, r.rank, s.tag, sb, s.chunk, s.step, r.step))

    def _deliver(self, op: _Op) -> None:
        s = op if op.kind == "send" else op.matched
        if not s.copied:
            A.copy_(s.matched.buf, s.buf)
            s.copied = s.matched.copied = True

    # -- scheduling -----------------------------------------------------------
    def _runnable(self, r: _Rank) -> bool:
        return not r.done and all(op.matched is not None for op in r.waiting)

    def _advance(self, r: _Rank) -> None:
        for op in r.waiting:
            self._deliver(op)
            op.waited = True
        try:
            handles = next(r.gen)
        except StopIteration:
            r.done = True
            r.waiting = []
            unwaited = [op.describe() for op in r.posted if not op.waited]
            assert not unwaited, f"rank {r.rank} finished without waiting on: {unwaited}"
            return
        assert isinstance(handles, list), f"rank {r.rank} yielded {type(handles).__name__}, not a list"
        for op in handles:
            assert isinstance(op, _Op) and op.rank == r.rank, f"rank {r.rank} yielded a foreign handle {op!r}"
        r.waiting = list(handles)
        r.steps += 1

    def run(self, make: Callable[[_Endpoint], Any]) -> "Loopback":
        for r in self._ranks:
            r.gen = iter(make(_Endpoint(self, r.rank)))
        turn = 0
        while True:
            runnable = [r for r in self._ranks if self._runnable(r)]
            if not runnable:
                break
            if self._rng is None:
                # round robin: the first runnable rank at or after ``turn``
                r = min(runnable, key=lambda x: (x.rank - turn) % self.size)
                turn = r.rank + 1
            else:
                r = self._rng.choice(runnable)
            self._advance(r)
        stuck = [r for r in self._ranks if not r.done]
        if stuck:
            lines = ["deadlock: no rank can run"]
            for r in stuck:
                waits = [op.describe() + ("" if op.matched else " (unmatched)") for op in r.waiting]
                lines.append(f"  rank {r.rank} after step {r.steps} waits on {waits}")
            raise AssertionError("\n".join(lines))
        pending = [op.describe() for q in (*self._sends.values(), *self._recvs.values()) for op in q]
        assert not pending, f"unmatched at exit: {pending}"
        return self


def run(size: int, make: Callable[[_Endpoint], Any], seed: int | None = None) -> Loopback:
    """Run ``make(t)`` (an algorithm generator) on every rank; return the finished Loopback."""
    return Loopback(size, seed).run(make)
