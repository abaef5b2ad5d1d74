"""Collectives checked across ranks before data moves (on unless ``SIMDIST_CHECK_COLLECTIVES=0``).

Before the k-th collective on a group moves any data, its ranks all-gather a 16-byte digest
of their signature (:mod:`simdist.core._signatures`: op, dtype, shape or counts, root, reduce op,
algorithm, async or not, plus the group's id and ranks and the sequence number ``k``), with
the same all-gather algorithms as user data, on the collective's own context under tags
above every algorithm's. Every rank then holds every digest, so all ranks reach the same
verdict and none is left waiting. When the digests differ, the ranks all-gather the lengths
of their encoded signatures, then the encodings (with call sites) padded to the longest,
and every rank raises the :class:`~simdist.CollectiveMismatchError` that the simulator
raises for the same program: group rank 0's call against the first rank whose call differs.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from simdist import algorithms
from simdist.core import decode_signature, encode_signature, mismatch_error, signature_digest

__all__ = ["CHECK_ENV", "CHECK_KEY", "agreed_checks", "check_collective", "checks_enabled"]

CHECK_ENV = "SIMDIST_CHECK_COLLECTIVES"
"""``0`` turns the check off for a job (every rank must say the same; ``1``, the default, keeps it)."""

CHECK_KEY = "simdist/check_collectives"
"""The store key where rank 0 publishes its setting for the other ranks to compare."""

_TAG = 1 << 62
"""Check messages carry tags from here on: above every algorithm's, so they never match data."""

_CALL_SITE = "call_site"


def checks_enabled() -> bool:
    """Whether ``$SIMDIST_CHECK_COLLECTIVES`` leaves the check on (unset, ``1``) or turns it off (``0``).

    Raises:
        ValueError: any other value, naming the variable, the value and the accepted ones.
    """
    value = os.environ.get(CHECK_ENV, "1").strip()
    if value not in ("0", "1"):
        raise ValueError(
            f"environment variable {CHECK_ENV}={value!r} must be '1' (check collectives across "
            "ranks, the default) or '0' (skip the check for speed)"
        )
    return value == "1"


def agreed_checks(store: Any, rank: int) -> bool:
    """This rank's setting, once it is known to match rank 0's (published in the store).

    Raises:
        ValueError: this rank's ``$SIMDIST_CHECK_COLLECTIVES`` differs from rank 0's (a checked
            rank would wait for check messages that an unchecked rank never sends).
    """
    mine = checks_enabled()
    if rank == 0:
        store.set(CHECK_KEY, b"1" if mine else b"0")
        return mine
    theirs = store.get(CHECK_KEY) == b"1"
    if theirs != mine:
        raise ValueError(
            f"environment variable {CHECK_ENV} is {int(mine)!r} on rank {rank} but {int(theirs)!r} on "
            "rank 0: every rank must use the same setting"
        )
    return mine


class _CheckTransport:
    """A collective's transport with the check's tags (``_TAG + tag``), for running an algorithm."""

    __slots__ = ("inner", "rank", "size")

    def __init__(self, inner: Any):
        self.inner, self.rank, self.size = inner, inner.rank, inner.size

    def isend(self, buf: Any, peer: int, tag: int = 0, *, chunk: int | None = None) -> Any:
        return self.inner.isend(buf, peer, _TAG + tag)

    def irecv(self, buf: Any, peer: int, tag: int = 0, *, chunk: int | None = None) -> Any:
        return self.inner.irecv(buf, peer, _TAG + tag)

    def wait(self, handles: Any) -> None:
        self.inner.wait(handles)


def _all_gather(t: _CheckTransport, mine: np.ndarray, network: dict) -> np.ndarray:
    """Every rank's ``mine`` (equal sizes), one row per group rank."""
    out = np.zeros((t.size, mine.size), dtype=mine.dtype)
    name = algorithms.choose("all_gather", out.nbytes, t.size, **network)
    algorithms.run_blocking(algorithms.get("all_gather", name)(t, mine, out.reshape(-1)), t)
    return out


def check_collective(transport: Any, group: Any, seq: int, call: Any) -> None:
    """Return once every rank of ``group`` has called collective ``seq`` with the same signature.

    Raises:
        CollectiveMismatchError: on every rank of the group alike, naming the differing fields,
            the two ranks (global ranks), their values and call sites.
    """
    if transport.size == 1:
        return
    t = _CheckTransport(transport)
    signature = {**call.signature, "group": group.group_id, "ranks": tuple(group.ranks), "seq": seq}
    digest = np.frombuffer(signature_digest(signature), dtype=np.uint8)
    digests = _all_gather(t, digest, group.network)
    if (digests == digests[0]).all():
        return
    record = encode_signature({**signature, _CALL_SITE: call.call_site})
    lengths = _all_gather(t, np.array([len(record)], dtype=np.int64), group.network)[:, 0]
    padded = np.zeros(int(lengths.max()), dtype=np.uint8)
    padded[: len(record)] = np.frombuffer(record, dtype=np.uint8)
    records = _all_gather(t, padded, group.network)
    calls = []
    for rank, n, row in zip(group.ranks, lengths, records):
        theirs = decode_signature(row[:n].tobytes())
        site = theirs.pop(_CALL_SITE, None)
        calls.append((rank, theirs, site))
    first = calls[0]
    for other in calls[1:]:
        err = mismatch_error(group.group_id, seq, first, other)
        if err is not None:
            raise err
    raise AssertionError(f"collective {seq} on group {group.group_id}: digests differ but signatures agree: {calls}")
