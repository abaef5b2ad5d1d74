"""Fast failure: a rank that fails is recorded in the store, and every wait looks for the record.

A failed rank's record is ``simdist/failed/{rank}``, JSON ``{"rank", "error", "time", "how",
"cause"}``, written once (the first record wins) by whichever learns of the failure first:

* the rank itself, when ``destroy_process_group`` runs while an exception propagates
  (``try: ... finally: destroy_process_group()``) or an exception reaches ``sys.excepthook``
  (``how`` "exception"; ``error`` is ``"ValueError: boom"``);
* the store, carrying out the last will of the rank's store connection (``Op.WILL``) when
  the process ends without a goodbye: ``os._exit``, a signal, a crash (``how`` "will");
* a launcher that saw the process end (``how`` "launcher"; it may replace a will's text
  with what it saw, such as the signal);
* the rank that watches it (:class:`Heartbeat`), when its heartbeat stood still for the
  liveness interval: a frozen process, a host cut off (``how`` "liveness").

The first record of the job is also ``simdist/first-failure``.

A rank that fails because another failed (its error is a ``PeerLostError`` naming that
rank) records it as its ``cause``: reports follow causes back to the rank that failed first.

Every wait (a collective's or a receive's in ``PeerNetwork.wait``, :meth:`JobStore.get` and
:meth:`JobStore.wait`, ``destroy_process_group``'s goodbye) reads that one key every ``POLL_S``
seconds; once it exists, the records of the ranks it depends on, and raises
:class:`~simdist.PeerLostError` naming the rank and its error. The store's load is thus
linear in the number of ranks: a blocked rank reads one key per poll, a heartbeat one
counter per beat and three keys of one other rank per poll. A goodbye of the peer network
(a CLOSE frame with tag ``FAILING``) tells connected peers at once.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterable
from typing import Any

from simdist.core import DistError, DistTimeoutError, PeerLostError

from ._store import StoreClient

__all__ = [
    "BEAT_S",
    "FAILING",
    "Heartbeat",
    "LIVENESS_ENV",
    "POLL_S",
    "FailureMonitor",
    "FirstFailure",
    "JobStore",
    "caused_by",
    "failure_text",
    "launcher_saw",
    "liveness_s",
    "will_value",
]

POLL_S = 0.5
"""Seconds between two reads of the failure records while a wait blocks."""
BEAT_S = 1.0
"""Seconds between two heartbeats of a rank (:class:`Heartbeat`)."""
LIVENESS_ENV = "SIMDIST_LIVENESS"
"""Seconds without a heartbeat after which a waiting rank declares a peer lost (default 10)."""
FAILING = 1
"""The tag of the CLOSE frame of a rank that leaves because it failed (0: an orderly goodbye)."""
_FAILED = "simdist/failed/{rank}"
_BYE = "simdist/bye/{rank}"
_ALIVE = "simdist/alive/{rank}"  # a counter each rank's heartbeat adds to
_HOST = "simdist/host/{rank}"
_FIRST = "simdist/first-failure"  # the job's first failure record: what a wait reads, and a launcher waits on
_READ_S = 2.0  # the deadline of one read of the records: past it, the store is unreachable
_MAX_TEXT = 2000
_MAX_WAIT_S = 10.0 * 24 * 3600  # a launcher waits for a failure as long as the job runs


def failure_text(exc: BaseException | None) -> str | None:
    """``"ValueError: boom"`` for an exception that ends a rank; ``None`` for none or a clean exit.

    A ``SystemExit`` raised while handling another exception (``raise SystemExit(1) from
    None`` in an ``except`` block) is described by that exception.
    """
    if exc is None:
        return None
    if isinstance(exc, SystemExit):
        if exc.code in (None, 0):
            return None
        if exc.__context__ is not None and not isinstance(exc.__context__, SystemExit):
            return failure_text(exc.__context__)
        return f"exited with status {exc.code}" if isinstance(exc.code, int) else f"SystemExit: {exc.code}"
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= _MAX_TEXT else text[:_MAX_TEXT] + " ..."


def caused_by(exc: BaseException | None) -> int | None:
    """The rank whose failure ``exc`` reports (a ``PeerLostError``'s ``rank``), if any."""
    if isinstance(exc, SystemExit) and exc.__context__ is not None:
        exc = exc.__context__
    return exc.rank if isinstance(exc, PeerLostError) else None


def _record(
    rank: int, error: str, how: str, when: float | None, cause: int | None = None, host: str | None = None
) -> bytes:
    record = {"rank": rank, "error": error, "time": when, "how": how, "cause": cause, "host": host}
    return json.dumps(record).encode()


def will_value(rank: int, host: str | None = None) -> bytes:
    """The record the store writes for ``rank`` (on ``host``) when its connection ends without a goodbye."""
    return _record(
        rank, "its process ended without destroy_process_group (os._exit, a signal or a crash)", "will", None,
        host=host,
    )  # fmt: skip


def host_of(store: StoreClient) -> str:
    """This machine as the job knows it: its host name and the address its connection to ``store`` leaves from."""
    return f"{socket.gethostname()} ({store.local_address})"


def _parse(rank: int, raw: bytes) -> dict:
    try:
        record = json.loads(raw.decode())
        return record if isinstance(record, dict) and "error" in record else {"error": repr(raw[:200])}
    except (UnicodeDecodeError, ValueError):
        return {"error": repr(raw[:200])}


def describe(rank: int, record: dict) -> str:
    """``"rank 1 failed: ValueError: boom (on host lab2 (10.0.0.2))"`` (or how it ended) from its record."""
    host = record.get("host")
    return f"rank {rank} failed: {record.get('error')}" + (f" (on host {host})" if host else "")


def _named(rank: int, record: dict) -> tuple[int, str]:
    return rank, describe(rank, record)


def liveness_s() -> float:
    """Seconds without a heartbeat that make a peer lost: ``$SIMDIST_LIVENESS``, default 10."""
    raw = os.environ.get(LIVENESS_ENV, "10")
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value >= 2 * BEAT_S:
        raise ValueError(f"{LIVENESS_ENV}={raw!r}: expected seconds, at least {2 * BEAT_S:g} (two heartbeats)")
    return value


class Heartbeat:
    """This rank's sign of life and its watch on the job: a daemon thread, on a store connection of its own,
    adds 1 to ``simdist/alive/{rank}`` every ``BEAT_S`` seconds and, every ``POLL_S`` seconds, reads in one
    request whether any rank failed (``simdist/first-failure``) and the next rank's counter, until
    :meth:`stop`.

    A process that is frozen (SIGSTOP, a debugger) or whose host lost its link keeps its TCP
    connections open, so nothing else tells the others. Each rank watches the next one still in the
    job (rank + 1, skipping those that failed or said goodbye, around the ring): a counter that stands
    still for :func:`liveness_s` seconds makes the watcher record that rank as failed (``how``
    "liveness"), whatever the operations' timeout. Every rank is watched by one other, and a blocked
    wait asks the heartbeat rather than the store (:meth:`JobStore.failures`), so the store's load
    grows with the number of ranks, not its square: three requests per rank per second, of at most
    four keys.

    Args:
        host, port, secret: the job's store.
        rank, world_size: this rank and the number of ranks.
    """

    def __init__(self, host: str, port: int, secret: Any, rank: int, world_size: int = 1):
        self._address = (host, port, secret)
        self._client = StoreClient(host, port, secret, timeout=_READ_S)
        self._client.set(_HOST.format(rank=rank), host_of(self._client).encode())
        self._rank, self._world_size, self.liveness = rank, world_size, liveness_s()
        self._key = _ALIVE.format(rank=rank)
        self._client.add(self._key, 1)
        self.failure_seen = False  # a failure record exists (``simdist/first-failure``)
        self.answered_at = time.monotonic()  # the store's latest answer
        self.store_error: DistError | None = None  # why the store stopped answering
        self._watched = (rank + 1) % world_size
        self._seen: tuple[bytes | None, float] = (None, time.monotonic())  # its counter, when first seen
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"simdist-heartbeat-{rank}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        beat_at = time.monotonic() + BEAT_S
        while not self._stopped.wait(POLL_S):
            try:
                if self.store_error is not None:  # connect again: a store that was only slow answers again
                    self._client.close()
                    self._client = StoreClient(*self._address, timeout=_READ_S, connect_timeout=_READ_S)
                    self.store_error = None
                    if self._stopped.is_set():  # stopped meanwhile: the new connection goes too
                        self._client.close()
                        return
                if time.monotonic() >= beat_at:
                    self._client.add(self._key, 1)
                    beat_at = time.monotonic() + BEAT_S
                self._watch()
            except (DistError, OSError) as exc:  # the store is gone, frozen or cut off: the waits say so
                self.store_error = exc if isinstance(exc, DistError) else DistError(str(exc))

    def _watch(self) -> None:
        """Read whether a rank failed, and the watched rank's counter; record the watched rank as failed
        once its counter stood still for ``liveness`` seconds."""
        watched = self._watched
        keys = [_FIRST, *(k.format(rank=watched) for k in (_ALIVE, _BYE, _FAILED))]
        found = self._client.multi_get(keys if watched != self._rank else keys[:1])
        now = self.answered_at = time.monotonic()
        self.failure_seen = self.failure_seen or _FIRST in found
        if watched == self._rank:
            return  # every other rank failed or left
        if keys[2] in found or keys[3] in found:  # gone in order, or failed: watch the next one
            self._watched, self._seen = (watched + 1) % self._world_size, (None, now)
            return
        beats = found.get(keys[1])
        if beats is None or beats != self._seen[0]:  # not started yet, or alive
            self._seen = (beats, now)
            return
        silent = now - self._seen[1]
        if silent > self.liveness:
            host = self._client.multi_get([_HOST.format(rank=watched)]).get(_HOST.format(rank=watched), b"")
            error = (
                f"no sign of life for {silent:.1f} s (more than {LIVENESS_ENV}={self.liveness:g}): "
                "its process is stopped or frozen, or its host unreachable"
            )
            record = _record(watched, error, "liveness", time.time(), host=host.decode(errors="replace") or None)
            self._client.compare_set(keys[3], b"", record)
            self._client.compare_set(_FIRST, b"", record)
            self.failure_seen = True

    def check(self) -> bool | None:
        """Whether a rank failed, as of the latest read (at most ``POLL_S`` s ago); ``None`` when the heartbeat
        has not read for longer than a poll and a read's deadline without the store having failed it: this
        process was stopped or starved of CPU, so the caller reads the store itself.

        Raises:
            DistError: the store did not answer the heartbeat's latest read (within 2 s). The heartbeat
                connects again meanwhile: a store that answers again ends the silence; the waits give up
                after the liveness interval.
        """
        silent = time.monotonic() - self.answered_at
        if self.store_error is not None and silent > POLL_S:
            raise DistError(f"the store at {self._client.host}:{self._client.port} is unreachable ({self.store_error})")
        if silent > POLL_S + _READ_S:
            return None
        return self.failure_seen

    @property
    def running(self) -> bool:
        """Until :meth:`stop` (a heartbeat that lost the store runs on: :meth:`check` says so)."""
        return not self._stopped.is_set()

    def stop(self) -> None:
        self._stopped.set()
        self._client.close()


class JobStore(StoreClient):
    """The job's store client as a rank holds it: its ``get`` and ``wait`` also watch for failed ranks.

    Args:
        rank, world_size: this rank and the number of ranks (records of the others are read).
        The rest as :class:`StoreClient`.
    """

    def __init__(self, host: str, port: int, secret: Any, *, rank: int, world_size: int, **options: Any):
        super().__init__(host, port, secret, **options)
        self.rank, self.world_size = rank, world_size
        self.liveness = liveness_s()
        self.heartbeat: Heartbeat | None = None  # set once the rank's heartbeat runs

    def others(self) -> list[int]:
        return [r for r in range(self.world_size) if r != self.rank]

    def record_failure(self, error: str, cause: int | None = None) -> None:
        """Record this rank's failure (unless one is recorded), caused by rank ``cause``'s if given; a
        store that cannot take it is ignored, so the original error is the one that propagates."""
        cause = None if cause == self.rank else cause
        record = _record(self.rank, error, "exception", time.time(), cause, host=host_of(self))
        try:
            self.compare_set(_FAILED.format(rank=self.rank), b"", record, timeout=_READ_S)
            self.compare_set(_FIRST, b"", record, timeout=_READ_S)
        except (DistError, OSError):
            pass

    def leave_will(self) -> None:
        """Have the store record this rank as failed (and as the job's first failure, if none is yet) if
        its connection ends without a goodbye."""
        value = will_value(self.rank, host_of(self))
        self.will(_FAILED.format(rank=self.rank), value)
        self.will(_FIRST, value)

    def failures(self, ranks: Iterable[int] | None = None, *, fresh: bool = False) -> dict[int, dict]:
        """The failure records of ``ranks`` (default: every other rank); ``fresh``: read from the store
        now, not as of the heartbeat's latest read.

        While no rank failed, this asks the rank's :class:`Heartbeat` (once it runs), which reads the
        job's first failure (``simdist/first-failure``) every ``POLL_S`` s; before it runs, or when it has
        not read for a while (this process was stopped or starved), that one key. The records of ``ranks``
        are read once it exists.

        Raises:
            DistError: the store is unreachable (it did not answer within 2 s, or the connection broke).
        """
        ranks = self.others() if ranks is None else [r for r in ranks if r != self.rank]
        if not ranks:
            return {}
        try:
            beat = self.heartbeat if self.heartbeat is not None and self.heartbeat.running and not fresh else None
            seen = beat.check() if beat is not None else None  # None: this read asks the store itself
            if seen is False or (seen is None and not self.multi_get([_FIRST], timeout=_READ_S)):
                return {}
            found = self.multi_get([_FAILED.format(rank=r) for r in ranks], timeout=_READ_S)
        except DistError as exc:
            raise DistError(f"rank {self.rank}: the store at {self.host}:{self.port} is unreachable ({exc})") from exc
        return {r: _parse(r, found[_FAILED.format(rank=r)]) for r in ranks if _FAILED.format(rank=r) in found}

    def check_failures(self, ranks: Iterable[int] | None, what: str) -> None:
        """Raise ``PeerLostError`` for the first failed rank among ``ranks`` (default: every other rank)."""
        failed = self.failures(ranks)
        if failed:
            raise self._lost(failed, what)

    def _lost(self, failed: dict[int, dict], what: str) -> PeerLostError:
        """The error that reports the first of the ``failed`` ranks' failures to ``what`` on this rank."""
        rank, record = first_failure(failed)
        return PeerLostError(f"rank {self.rank}: {what}: {describe(rank, record)}", rank=rank)

    def _sliced(self, wait: Any, keys: Any, timeout: float | None, what: str) -> Any:
        """``wait(keys, slice)`` in slices of ``POLL_S`` seconds, reading the failure records between them."""
        total = self._timeout(timeout)
        deadline = time.monotonic() + total
        while True:
            left = deadline - time.monotonic()
            try:
                return wait(keys, min(POLL_S, max(left, 0.0)))
            except DistTimeoutError as exc:
                self.check_failures(None, what)
                if deadline - time.monotonic() <= 0:
                    raise DistTimeoutError(f"{what} timed out after {total:g} s: {exc}") from None

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """The value of ``key``, waiting until it exists; a failed rank ends the wait within ``POLL_S`` s.

        Raises:
            PeerLostError: another rank failed meanwhile (named, with its error).
            DistTimeoutError: ``key`` did not appear within ``timeout`` seconds.
        """
        return self._sliced(super().get, key, timeout, f"get({key!r})")

    def wait(self, keys: list[str], timeout: float | None = None) -> None:
        """Return once every key in ``keys`` exists; a failed rank ends the wait within ``POLL_S`` s.

        Raises:
            PeerLostError: another rank failed meanwhile (named, with its error).
            DistTimeoutError: some keys are still missing after ``timeout`` seconds.
        """
        self._sliced(super().wait, keys, timeout, f"wait({list(keys)!r})")

    def say_goodbye(self) -> None:
        """Withdraw the will and mark this rank as gone (``destroy_process_group``)."""
        self.will("", b"")
        self.set(_BYE.format(rank=self.rank), b"")

    def wait_goodbyes(self, timeout: float) -> None:
        """Wait until every rank has said goodbye (the rank that serves the store).

        Once a rank failed without saying goodbye, the store still serves the others, for at most the
        liveness interval, until each has said goodbye or failed: a rank blocked in an operation reads the
        failure within a poll of its heartbeat (later on a loaded machine), and a store that stopped first
        would leave it only "unreachable" to report.

        Raises:
            PeerLostError: a rank failed without saying goodbye (it died): it never will.
            DistTimeoutError: some ranks neither said goodbye nor failed within ``timeout``.
        """
        byes = [_BYE.format(rank=r) for r in range(self.world_size)]
        deadline = time.monotonic() + timeout
        grace_end: float | None = None  # once a rank failed: until when the others may still read it
        while True:
            try:
                StoreClient.wait(self, byes, min(POLL_S, max(deadline - time.monotonic(), 0.0)))
                return
            except DistTimeoutError:
                pass
            present = self.multi_get(byes, timeout=_READ_S)
            missing = [r for r in range(self.world_size) if _BYE.format(rank=r) not in present]
            failed = self.failures(missing, fresh=True)
            if failed:
                grace_end = grace_end or time.monotonic() + self.liveness
                if set(failed) == set(missing) or time.monotonic() >= min(grace_end, deadline):
                    raise self._lost(failed, "destroy_process_group")
            if time.monotonic() >= deadline:
                raise DistTimeoutError(
                    f"rank(s) {missing} did not call destroy_process_group within timeout={timeout} s"
                )


def first_failure(failed: dict[int, dict], rank: int | None = None) -> tuple[int, dict]:
    """The failure to report: ``rank``'s (default: the earliest root, a record with no cause,
    records without a time such as wills after timed ones), its cause followed back as far as known."""
    if rank is None:
        rank = min(
            failed,
            key=lambda r: (
                failed[r].get("cause") in failed,
                failed[r].get("time") is None,
                failed[r].get("time") or 0,
                r,
            ),
        )
    seen = {rank}
    while failed[rank].get("cause") in failed and failed[rank]["cause"] not in seen:
        rank = failed[rank]["cause"]
        seen.add(rank)
    return rank, failed[rank]


class FailureMonitor:
    """What ``PeerNetwork.wait`` consults while it blocks: the failure records, and the flight recorder.

    Args:
        store: the job's store.
        recorder: the flight recorder, asked to publish this rank's state once a wait blocks.
    """

    def __init__(self, store: JobStore, recorder: Any = None):
        self.store = store
        self.recorder = recorder
        self.liveness = store.liveness  # seconds of silence that make a peer, or the store, lost

    def failures(self, ranks: Iterable[int | None], *, fresh: bool = False) -> dict[int, tuple[int, str]]:
        """``{rank: (root, "rank 1 failed: ValueError: boom")}`` for the failed ones of ``ranks`` (``None``:
        any rank), ``root`` the rank whose failure caused ``rank``'s; the first item is the one to report.
        ``fresh``: as :meth:`JobStore.failures`.

        Raises:
            DistError: the store is unreachable.
        """
        ranks = set(ranks)
        failed = self.store.failures(None if None in ranks else sorted(ranks), fresh=fresh)
        if not failed:
            return {}
        first = first_failure(failed)[0]
        return {r: _named(*first_failure(failed, r)) for r in [first, *failed]}

    def answered_at(self, default: float) -> float:
        """When the store last answered this rank's heartbeat (``default`` without a heartbeat)."""
        heartbeat = self.store.heartbeat
        return min(heartbeat.answered_at, default) if heartbeat is not None and heartbeat.running else default

    def blocked(self) -> None:
        """A wait is about to block: publish this rank's latest state (what a report on a hang reads)."""
        if self.recorder is not None:
            self.recorder.flush()


def launcher_saw(host: str, port: int, secret: Any, world_size: int, rank: int, how: str) -> str | None:
    """A launcher saw ``rank``'s process end (``how``: "was killed by SIGKILL (exit code -9)"): record it
    for the other ranks where the rank recorded nothing better, and return the failure to report
    (``"rank 0 failed: ValueError: boom"``), the first one in the job's store; ``None`` if the store
    is gone or holds none.
    """
    key, text = _FAILED.format(rank=rank), f"its process {how}"
    try:
        with StoreClient(host, port, secret, timeout=_READ_S, connect_timeout=1.0) as store:
            current = store.multi_get([key]).get(key)
            if current is None:  # nothing recorded: the launcher's record, with the launcher's host
                record = _record(rank, text, "launcher", time.time(), host=host_of(store))
                store.compare_set(key, b"", record)
                store.compare_set(_FIRST, b"", record)
            elif _parse(rank, current).get("how") == "will":  # what the launcher saw says more than the will
                record = _record(rank, text, "launcher", time.time(), host=_parse(rank, current).get("host"))
                store.compare_set(key, current, record)
                store.compare_set(_FIRST, current, record)
            found = store.multi_get([_FAILED.format(rank=r) for r in range(world_size)])
    except (DistError, OSError, ValueError):
        return None
    failed = {r: _parse(r, found[_FAILED.format(rank=r)]) for r in range(world_size) if _FAILED.format(rank=r) in found}
    return describe(*first_failure(failed)) if failed else None


class FirstFailure:
    """A launcher's watch on a job's store: ``text`` becomes the first failure a rank records
    (``"rank 0 failed: ValueError: boom"``) the moment it is recorded, so the launcher can name it
    even once the store (served by rank 0) is gone. A daemon thread waits for it.
    """

    def __init__(self, host: str, port: int, secret: Any, connect_timeout: float = 600.0):
        self.text: str | None = None
        self._args = (host, port, secret, connect_timeout)
        threading.Thread(target=self._watch, name="simdist-first-failure", daemon=True).start()

    def _watch(self) -> None:
        host, port, secret, connect_timeout = self._args
        try:
            with StoreClient(host, port, secret, timeout=_MAX_WAIT_S, connect_timeout=connect_timeout) as store:
                raw = store.get(_FIRST)
        except (DistError, OSError, ValueError):
            return
        record = _parse(-1, raw)
        self.text = describe(record.get("rank", "?"), record)
