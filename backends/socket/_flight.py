"""The flight recorder: what every rank was doing when an operation timed out.

Each rank keeps its last ``N`` collectives (sequence number, op, group, shape, state,
call site). A daemon thread publishes the latest entry of every group to the store
at most every ``interval`` seconds (never on the operation's path). A rank whose
operation times out reads every member's entry and says, for instance, "rank 2
completed #41 (barrier) and never entered #42 (all_reduce) on group 0; its last call
site is train.py:88".
"""

from __future__ import annotations

import json
import threading
from collections import deque
from typing import Any

__all__ = ["FlightRecorder"]

_KEY = "simdist/flight/{rank}"


class FlightRecorder:
    """The recent collectives of one rank, mirrored (coalesced) to the store."""

    def __init__(self, store: Any, rank: int, size: int = 64, interval: float = 0.1):
        self.store = store
        self.rank = rank
        self.entries: deque[dict] = deque(maxlen=size)
        self.latest: dict[str, dict] = {}
        self.interval = interval
        self.lock = threading.Lock()
        self.dirty = threading.Event()
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._publish_loop, name="simdist-flight", daemon=True)
        self.thread.start()

    def start(self, group: int, seq: int, op: str, shape: Any, call_site: str | None) -> dict:
        """Record that this rank entered collective ``seq`` of ``group``."""
        entry = {"group": group, "seq": seq, "op": op, "shape": shape, "state": "started", "site": call_site}
        with self.lock:
            self.entries.append(entry)
            self.latest[str(group)] = entry
        self.dirty.set()
        return entry

    def complete(self, entry: dict) -> None:
        with self.lock:
            entry["state"] = "completed"
        self.dirty.set()

    def recent(self) -> list[dict]:
        """This rank's last operations, oldest first."""
        with self.lock:
            return [dict(e) for e in self.entries]

    def _publish_loop(self) -> None:
        while not self.closed.is_set():
            if self.dirty.wait(self.interval) and not self.closed.is_set():
                self.dirty.clear()
                self._publish()
                self.closed.wait(self.interval)

    def _publish(self) -> None:
        with self.lock:
            data = json.dumps(self.latest, sort_keys=True, default=str).encode()
        try:
            self.store.set(_KEY.format(rank=self.rank), data)
        except Exception:  # noqa: BLE001 - the recorder must never break the job it watches
            pass

    def close(self) -> None:
        self.closed.set()
        self.dirty.set()
        self.thread.join(2)

    def report(self, group: int, ranks: tuple[int, ...], seq: int, op: str) -> str:
        """What each member of ``group`` was doing, as seen from this rank stuck in ``seq`` (``op``)."""
        self._publish()
        lines = []
        for r in ranks:
            if r == self.rank:
                continue
            try:
                raw = self.store.get(_KEY.format(rank=r), timeout=1.0)
                entry = json.loads(raw.decode()).get(str(group))
            except Exception:  # noqa: BLE001 - a rank that published nothing is itself the finding
                lines.append(f"rank {r} published no state (it may have died or never reached a collective)")
                continue
            lines.append(_describe(r, entry, group, seq, op))
        head = f"rank {self.rank} timed out in #{seq} ({op}) on group {group}"
        return head + (":\n  " + "\n  ".join(lines) if lines else "")


def _describe(rank: int, entry: dict | None, group: int, seq: int, op: str) -> str:
    if entry is None:
        return f"rank {rank} never entered a collective on group {group}"
    k, state, site = entry["seq"], entry["state"], entry.get("site") or "?"
    if k < seq:
        what = f"completed #{k} ({entry['op']})" if state == "completed" else f"is still in #{k} ({entry['op']})"
        return f"rank {rank} {what} and never entered #{seq} ({op}) on group {group}; its last call site is {site}"
    if k == seq:
        return f"rank {rank} is in #{seq} ({entry['op']}) too, state {state}, at {site}"
    return f"rank {rank} is ahead, at #{k} ({entry['op']}) at {site}"
