"""Buffer races: a rank writing to the buffer of its own send or receive while it is in flight.

``isend(t)`` promises not to write ``t`` until the send has completed, ``irecv(t)`` the
same until the receive has. The simulator checks both promises in one way, under every
schedule:

- when the operation is posted, its buffer is copied;
- a send's message carries that copy, so a receiver never sees a later write;
- a receive is delivered into a buffer of its own and lands in the rank's tensor only
  when the rank learns that it has completed;
- at that moment (``wait()``, ``is_completed()`` answering ``True``, or the end of the
  run for an operation never waited for) the rank's buffer is compared with the copy
  taken at post. A byte that differs was written while the operation was in flight:
  :class:`~simdist.BufferRaceError` on that rank, naming the call that posted it.

A receive posted into memory that an operation still in flight uses (an ``isend``'s or
another ``irecv``'s buffer), and a send posted from memory that a receive in flight will
write, race as well, whenever the operations are waited for: :func:`posted_over` reports
such a post at once (two sends may read one buffer).

Neither the comparison nor the data depends on when the message was delivered, so a
program races under every schedule or under none. Blocking ``send``/``recv`` are not
checked: nothing of the rank runs while they are in flight.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from simdist.core import arrays as A
from simdist.core import user_call_site
from simdist.core import BufferRaceError

__all__ = ["BufferCheck", "posted_over", "unsettled_race"]
__tracebackhide__ = True  # pytest shows a failure's frames in the user's code, not simdist's


class BufferCheck:
    """The check of one asynchronous send or receive of rank ``rank`` (see the module's docstring).

    ``posted`` is the buffer the engine sends from (a send: the copy taken at post) or
    delivers into (a receive: a buffer of its own, copied into ``target`` by :meth:`settle`; a send has
    no ``target``).
    """

    __slots__ = ("back", "before", "call_site", "kind", "posted", "rank", "target", "tensor")

    def __init__(
        self, kind: str, tensor: Any, target: Any, back: Callable[[], None] | None, rank: int, call_site: str | None
    ):
        self.kind = kind
        self.tensor = tensor
        self.rank = rank
        self.call_site = call_site
        self.before = A.stage_copy(tensor)
        self.target = target
        self.back = back
        self.posted = self.before if kind == "send" else A.empty(self.before, A.numel(self.before))

    def settle(self, when: str) -> BufferRaceError | None:
        """The race if the rank's buffer differs from its copy taken at post, else ``None`` (a receive then lands).

        ``when`` names the moment the rank learned of the completion (``'wait()'``); the
        user's line that is running is added to it.
        """
        changed = A.changed_bytes(self.before, A.stage_in(self.tensor))
        if changed is not None:
            return self.error(changed, f"{when} at {user_call_site()}")
        if self.kind == "recv":
            A.copy_(self.target, self.posted)
            if self.back is not None:
                self.back()
        return None

    def error(self, changed: tuple[int, int], when: str) -> BufferRaceError:
        """The report of bytes ``changed`` (first, last) between the post and ``when``."""
        op = "isend" if self.kind == "send" else "irecv"
        size = A.itemsize(self.before)
        first, last = changed
        where = f" at {self.call_site}" if self.call_site else ""
        advice = (
            "wait() for the send before writing to its buffer, or send a copy (isend(t.clone()))"
            if op == "isend"
            else "wait() for the receive before writing to its buffer: the write and the received data would race"
        )
        return BufferRaceError(
            f"rank {self.rank}: buffer race on the {op}{where}: bytes {first}..{last} (elements "
            f"{first // size}..{last // size}, {A.dtype_name(self.before)}) of its buffer changed between the "
            f"{op} and its completion, seen at {when}; {advice}",
            rank=self.rank,
            op=op,
            call_site=self.call_site,
            changed=changed,
        )


def unsettled_race(worlds: Any) -> BufferRaceError | None:
    """The first race among the checks no rank settled (operations never waited for), by rank then post order."""
    for world in worlds:
        for check in world.open_checks.values():
            changed = A.changed_bytes(check.before, A.stage_in(check.tensor))
            if changed is not None:
                return check.error(changed, "the end of the run (it was never waited for)")
    return None


def posted_over(checks: Any, kind: str, tensor: Any, rank: int, call_site: str | None) -> BufferRaceError | None:
    """The race of posting a ``kind`` (``'send'``/``'recv'``) on ``tensor`` over an operation of ``checks`` in flight
    (a :class:`BufferCheck` by work key) whose memory it shares, where one of the two writes it; else ``None``."""
    for check in checks.values():
        if (kind == "recv" or check.kind == "recv") and A.shares_memory(tensor, check.tensor):
            op, other = ("isend" if k == "send" else "irecv" for k in (kind, check.kind))
            first, last = A.overlap_span(tensor, A.stage_in(check.tensor)) or (0, A.numel(check.before))
            size = A.itemsize(check.before)
            where = f" at {check.call_site}" if check.call_site else ""
            verb = "writes to" if kind == "recv" else "reads"
            return BufferRaceError(
                f"rank {rank}: buffer race: the {op} at {call_site or user_call_site()} {verb} the buffer of an "
                f"earlier {other}{where} (elements {first}..{last - 1}), which is still in flight; wait() for that "
                f"{other} before posting this {op}, or use another buffer",
                rank=rank,
                op=other,
                call_site=check.call_site,
                changed=(first * size, last * size - 1),
            )
    return None
