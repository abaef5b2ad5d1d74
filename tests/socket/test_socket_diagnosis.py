"""Hang diagnosis on the socket backend: where each rank was, how long ago, in one request.

A rank whose collective times out reports every member's last published state with its age
("last seen 3.2 s ago after all_reduce #60"), read with the failure records in one request
under one deadline; a store that does not answer is named as unreachable.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from simdist.backends.socket._flight import FlightRecorder
from simdist.core import free_port
from simdist.backends.socket._store import StoreClient, StoreServer
from simdist.backends.socket._store_wire import Op
from test_socket_failfast import event, run_job

pytestmark = pytest.mark.timeout(180)

SECRET = b"diagnosis-test-secret"


class CountingClient(StoreClient):
    """A real store client that counts the requests it makes, by op."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.requests: list[Op] = []

    def _request(self, req, timeout, what, margin=5.0):
        self.requests.append(req.op)
        return super()._request(req, timeout, what, margin)


def _state(seq: int, state: str, age: float) -> bytes:
    t = time.time() - age
    return json.dumps(
        {
            "0": {
                "group": 0,
                "seq": seq,
                "op": "all_reduce",
                "shape": [4],
                "state": state,
                "site": "train.py:12",
                "t0": t,
                "t": t,
            }
        }
    ).encode()


def test_every_state_comes_in_one_request_with_its_age():
    with StoreServer("127.0.0.1", 0, SECRET) as server:
        store = CountingClient("127.0.0.1", server.port, SECRET, timeout=30)
        store.set("simdist/flight/1", _state(60, "completed", 2.5))
        store.set("simdist/flight/2", _state(61, "started", 0.4))
        store.set("simdist/failed/3", json.dumps({"rank": 3, "error": "ValueError: boom"}).encode())
        recorder = FlightRecorder(store, 0)
        try:
            store.requests.clear()
            start = time.monotonic()
            text = recorder.report(0, tuple(range(8)), 61, "all_reduce")  # ranks 4..7 published nothing
            elapsed = time.monotonic() - start
        finally:
            recorder.close()
            store.close()
    print(f"report of 7 ranks (4 silent) in {elapsed * 1000:.1f} ms:\n{text}")
    assert store.requests == [Op.MULTI_GET]
    assert elapsed < 1.0  # one request; fetching silent ranks one by one took 1 s each
    assert "rank 1 completed #60 (all_reduce) and never entered #61 (all_reduce) on group 0" in text
    age1 = float(re.search(r"rank 1 .*last seen ([0-9.]+) s ago after all_reduce #60", text).group(1))
    age2 = float(re.search(r"rank 2 .*last seen ([0-9.]+) s ago in all_reduce #61", text).group(1))
    assert 2.4 <= age1 <= 2.5 + elapsed + 0.1 and 0.3 <= age2 <= 0.4 + elapsed + 0.1
    assert "rank 3 failed: ValueError: boom" in text
    for r in range(4, 8):
        assert f"rank {r} published no state" in text


def wait_stopped(pid: int, limit: float = 10.0) -> None:
    """Return once every thread of process ``pid`` is stopped (``T`` in ``/proc``).

    ``SIGSTOP`` takes effect when the kernel next runs each thread: on a busy machine a thread
    can still answer a request after ``os.kill`` has returned.
    """
    deadline = time.monotonic() + limit

    def states() -> set[str]:
        found = set()
        for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
            try:
                found.add(stat.read_text().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:  # a thread that has just ended
                pass
        return found

    while states() - {"T", "t"}:
        assert time.monotonic() < deadline, f"process {pid} did not stop within {limit} s: {states()}"
        time.sleep(0.01)


def test_a_frozen_store_is_named_unreachable():
    env = {**os.environ, "SIMDIST_SECRET": SECRET.decode()}
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "simdist.backends.socket._store", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert "listening" in server.stdout.readline()
        store = StoreClient("127.0.0.1", port, SECRET, timeout=60)
        recorder = FlightRecorder(store, 0)
        os.kill(server.pid, signal.SIGSTOP)
        wait_stopped(server.pid)
        start = time.monotonic()
        text = recorder.report(0, (0, 1, 2), 7, "barrier")
        elapsed = time.monotonic() - start
        recorder.close()
        store.close()
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.kill()
        server.wait()
    print(f"frozen store reported after {elapsed:.2f} s: {text}")
    assert f"the store at 127.0.0.1:{port} is unreachable" in text
    assert "rank(s) [1, 2] are unknown" in text and "may have died" not in text
    assert elapsed < 5.0  # one deadline of 2 s, not the store's 60 s timeout


def test_a_rank_sleeping_after_60_all_reduces_is_reported_with_its_age():
    events, _, _ = run_job("sleep", op_timeout=6.0, stop_after=60.0)
    slept_at = event(events, 1, "sleep")["t"]
    reports = [e for r in (0, 2) for e in events[r] if e["event"] == "error" and e["type"] == "DistTimeoutError"]
    assert reports, events
    text, at = reports[0]["text"], reports[0]["t"]
    print(text)
    found = re.search(
        r"rank 1 completed #60 \(all_reduce\) and never entered #61 \(all_reduce\) on group 0 "
        r"\(last seen ([0-9.]+) s ago after all_reduce #60\)",
        text,
    )
    assert found, text
    age = float(found.group(1))
    # the state is as old as rank 1's sleep, give or take its last publication and the report's own time
    assert abs(age - (at - slept_at)) < 1.5, (age, at - slept_at)
