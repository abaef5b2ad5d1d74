"""The flight recorder: what every rank was doing when an operation timed out.

Each rank keeps its last ``N`` collectives (sequence number, op, group, shape, state,
call site, time of the last change). A daemon thread publishes the latest entry of every
group to the store at most every ``interval`` seconds, and a rank about to block in a
wait publishes it itself first (:meth:`FlightRecorder.flush`), so a rank that hangs is
seen where it hangs. A rank whose operation times out reads every member's entry, and
the failure records, in one request under one deadline, and says, for instance, "rank 2
was last seen 3.2 s ago: it completed #41 (barrier) and never entered #42 (all_reduce)
on group 0; its last call site is train.py:88"; a store that does not answer is named.

With ``SIMDIST_TRACE=DIR`` the recorder also keeps every collective and every waited
point-to-point send and receive as a trace event, in real seconds since rank 0's epoch
(published in the store), and writes
``DIR/rank{r}.trace.json`` when the process group is destroyed; ``simdist.Trace.merge``
joins the files, and the visualizer's Traces page shows them.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections import deque
from typing import Any

__all__ = ["FlightRecorder"]

_KEY = "simdist/flight/{rank}"
_FAILED = "simdist/failed/{rank}"  # a failed rank's record (see ._failures)
_REPORT_S = 2.0  # the deadline of the one request that reads every member's state
_PUBLISH_S = 1.0  # how long one publication may wait for the store: a wait that blocks publishes first
_EPOCH = "simdist/trace/epoch"
TRACE_ENV = "SIMDIST_TRACE"


class FlightRecorder:
    """The recent collectives of one rank, mirrored (coalesced) to the store."""

    def __init__(self, store: Any, rank: int, size: int = 64, interval: float = 0.1):
        self.store = store
        self.rank = rank
        self.entries: deque[dict] = deque(maxlen=size)
        self.latest: dict[int, dict] = {}  # by group (JSON writes the keys as strings)
        self.interval = interval
        self.lock = threading.Lock()
        self.dirty = False  # changed since the last publication (a flag: setting it must cost a collective nothing)
        self.closed = threading.Event()
        self.trace_dir = os.environ.get(TRACE_ENV) or None
        self.events: list | None = None
        if self.trace_dir:
            self.events, self.epoch = [], self._epoch()
        self.thread = threading.Thread(target=self._publish_loop, name="simdist-flight", daemon=True)
        self.thread.start()

    def _epoch(self) -> float:
        """Rank 0's wall clock at start, shared through the store: every rank's events count from it."""
        if self.rank == 0:
            now = time.time()
            self.store.set(_EPOCH, repr(now).encode())
            return now
        return float(self.store.get(_EPOCH).decode())

    def start(self, group: int, seq: int, op: str, shape: Any, call_site: str | None) -> dict:
        """Record that this rank entered collective ``seq`` of ``group``."""
        now = time.time()
        entry = {
            "group": group,
            "seq": seq,
            "op": op,
            "shape": shape,
            "state": "started",
            "site": call_site,
            "t0": now,
            "t": now,
        }
        with self.lock:
            self.entries.append(entry)
            self.latest[group] = entry
        self.dirty = True
        return entry

    def complete(self, entry: dict, algorithm: str | None = None) -> None:
        with self.lock:
            entry["state"] = "completed"
            entry["t"] = time.time()
            if self.events is not None:
                from simdist.core import Event

                self.events.append(
                    Event(
                        rank=self.rank,
                        kind="collective",
                        op=entry["op"],
                        group=entry["group"],
                        t_start=entry["t0"] - self.epoch,
                        t_end=time.time() - self.epoch,
                        collective_id=entry["seq"],
                        call_site=entry["site"],
                        algorithm=algorithm,
                    )
                )
        self.dirty = True

    @property
    def tracing(self) -> bool:
        """Whether this rank writes a trace (``SIMDIST_TRACE`` is set)."""
        return self.events is not None

    def p2p(
        self, kind: str, group: int, peer: int | None, tag: int, nbytes: int, t0: float, call_site: str | None
    ) -> None:
        """Record (tracing only) a point-to-point ``kind`` (``'send'``/``'recv'``) begun at wall time ``t0``, done now."""
        if self.events is None:
            return
        from simdist.core import Event

        event = Event(
            rank=self.rank,
            kind=kind,
            op=kind,
            group=group,
            peer=peer,
            tag=tag,
            nbytes=nbytes,
            t_start=t0 - self.epoch,
            t_end=time.time() - self.epoch,
            call_site=call_site,
        )
        with self.lock:
            self.events.append(event)

    def recent(self) -> list[dict]:
        """This rank's last operations, oldest first."""
        with self.lock:
            return [dict(e) for e in self.entries]

    def _publish_loop(self) -> None:
        while not self.closed.wait(self.interval):
            if self.dirty:
                self.dirty = False
                self._publish()

    def _publish(self) -> None:
        with self.lock:
            data = json.dumps(self.latest, sort_keys=True, default=str).encode()
        try:
            self.store.set(_KEY.format(rank=self.rank), data, timeout=_PUBLISH_S, strict=True)
        except Exception:  # noqa: BLE001 - the recorder must never break the job it watches
            pass

    def flush(self) -> None:
        """Publish the latest state now, in the calling thread, if it changed since the last publication."""
        if self.dirty and not self.closed.is_set():
            self.dirty = False
            self._publish()

    def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        self.thread.join(2)
        if self.events is not None:
            self.write_trace()

    def write_trace(self) -> str:
        """Write this rank's trace to ``DIR/rank{r}.trace.json``; return the path."""
        from simdist.core import Trace

        os.makedirs(self.trace_dir, exist_ok=True)
        path = os.path.join(self.trace_dir, f"rank{self.rank}.trace.json")
        meta = {
            "backend": "socket",
            "rank": self.rank,
            "clock": "real seconds since rank 0 joined the job (wall clocks of the hosts)",
        }
        with self.lock:
            trace = Trace(list(self.events), meta)
        with open(path, "w", encoding="utf-8") as f:
            f.write(trace.to_json())
        return path

    def report(self, group: int, ranks: tuple[int, ...], seq: int, op: str) -> str:
        """What each member of ``group`` was doing, as seen from this rank stuck in ``seq`` (``op``).

        Every member's state and failure record come in one request that must be answered
        within 2 s; a store that does not answer is named, and no rank is blamed for it.
        """
        others = [r for r in ranks if r != self.rank]
        head = f"rank {self.rank} timed out in #{seq} ({op}) on group {group}"
        keys = [_KEY.format(rank=r) for r in others] + [_FAILED.format(rank=r) for r in others]
        try:
            found = self.store.multi_get(keys, timeout=_REPORT_S) if keys else {}
        except Exception as exc:  # noqa: BLE001 - an unreachable store is itself the finding
            where = f"{self.store.host}:{self.store.port}"
            return (
                f"{head}; the store at {where} is unreachable (no answer within {_REPORT_S:g} s: {exc}), so the "
                f"states of rank(s) {others} are unknown; the process serving it may be frozen or gone"
            )
        now = time.time()
        lines = []
        for r in others:
            failed = found.get(_FAILED.format(rank=r))
            if failed is not None:
                lines.append(f"rank {r} failed: {_failure_error(failed)}")
                continue
            raw = found.get(_KEY.format(rank=r))
            if raw is None:
                lines.append(
                    f"rank {r} published no state (it never reached a collective, or is frozen or died before it could)"
                )
                continue
            try:
                entry = json.loads(raw.decode()).get(str(group))
            except (UnicodeDecodeError, ValueError, AttributeError):
                lines.append(f"rank {r} published an unreadable state {raw[:60]!r}")
                continue
            lines.append(_describe(r, entry, group, seq, op, now))
        return head + (":\n  " + "\n  ".join(lines) if lines else "")


def _failure_error(raw: bytes) -> str:
    try:
        return str(json.loads(raw.decode())["error"])
    except (UnicodeDecodeError, ValueError, KeyError, TypeError):
        return repr(raw[:200])


def _age(entry: dict, now: float) -> str:
    t = entry.get("t", entry.get("t0"))
    if not isinstance(t, (int, float)) or not math.isfinite(t):
        return "at an unknown time"
    return f"{max(now - t, 0.0):.1f} s ago"


def _describe(rank: int, entry: dict | None, group: int, seq: int, op: str, now: float) -> str:
    if entry is None:
        return f"rank {rank} never entered a collective on group {group}"
    k, state, site, what = entry["seq"], entry["state"], entry.get("site") or "?", entry["op"]
    seen = f"last seen {_age(entry, now)} {'after' if state == 'completed' else 'in'} {what} #{k}"
    if k < seq:
        did = f"completed #{k} ({what})" if state == "completed" else f"is still in #{k} ({what})"
        return (
            f"rank {rank} {did} and never entered #{seq} ({op}) on group {group} ({seen}); its last call site is {site}"
        )
    if k == seq:
        return f"rank {rank} is in #{seq} ({what}) too, state {state}, at {site} ({seen})"
    return f"rank {rank} is ahead, at #{k} ({what}) at {site} ({seen})"
