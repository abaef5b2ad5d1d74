"""The trace's packed storage: events read back exactly, numpy columns, snapshots shared, streaming to a file."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import simdist
from simdist.core import _trace
from simdist.core._trace import DTYPE, NONE32, Event, Trace
from simdist.visualize._traces import load_traces

pytestmark = pytest.mark.timeout(120)

ODD_EVENTS = [
    Event(0, "message", "all_reduce", 3, 1, -7, 4096, 0.5, 1.25, 12, 0, 2, "a.py:3", "ring"),
    Event(1, "send", "send", 0, 0, None, 0, 0.0, 0.0),
    Event(2, "step", "all_reduce", None, None, 2**40, 8, 1.0, 1.0, 0, 5, None, None, "ring", [1.5, -2.0, 3.25]),
    Event(2, "step", "all_gather", 1, None, None, 0, 1.0, 1.0, 1, 0, None, None, None, [1, 2, 2**62]),
    Event(2, "work", "all_gather", 1, None, None, 0, 1.0, 1.0, 1, 1, None, None, None, [0.0, 3, True]),
    Event(3, "step", "broadcast", 0, None, None, 0, 2.0, 2.0, 2, 0, None, None, None, [2**70, 1]),
    Event(3, "step", "broadcast", 0, None, None, 0, 2.0, 2.0, 2, 1, None, None, None, [True, False]),
    Event(3, "step", "broadcast", 0, None, None, 0, 2.0, 2.0, 2, 2, None, None, None, []),
    Event(3, "compute", "forward", 0, None, None, 0, 2.0, 3.5, call_site="train.py:40"),
]


def test_events_read_back_as_they_were_added():
    trace = Trace(ODD_EVENTS, {"world_size": 4})
    assert trace.events == ODD_EVENTS
    assert [type(v) for v in trace.events[4].snapshot] == [float, int, bool]
    assert [type(v) for v in trace.events[3].snapshot] == [int, int, int]
    back = Trace.from_json(trace.to_json())
    assert back.events == ODD_EVENTS and back.meta == {"world_size": 4}
    assert trace.duration() == 3.5 == max(e.t_end for e in ODD_EVENTS)


def test_an_event_added_is_copied():
    e = Event(0, "compute", "x", t_end=1.0)
    trace = Trace([e])
    e.t_end = 9.0
    assert trace.events[0].t_end == 1.0


def test_a_field_of_the_wrong_type_is_refused_by_name():
    with pytest.raises(ValueError, match="event field"):
        Trace([Event(0, "message", "send", nbytes=1.5)])
    with pytest.raises(TypeError, match="expected a str"):
        Trace([Event(0, 7, "send")])


def ring(rank: int, n: int) -> float:
    simdist.init_process_group("gloo")
    t = torch.arange(n, dtype=torch.float32) + rank
    simdist.all_reduce(t, algorithm="ring")
    simdist.barrier()
    simdist.destroy_process_group()
    return float(t.sum())


def test_columns_agree_with_the_events():
    res = simdist.simulate(ring, 4, (16,), leaks="ignore")
    cols = res.trace.columns()
    events = res.trace.events
    assert cols.dtype == DTYPE and len(cols) == len(events) == len(res.trace)
    strings = np.array(res.trace.strings)
    kinds = strings[cols["kind"]]
    assert list(kinds) == [e.kind for e in events]
    messages = cols[kinds == "message"]
    assert len(messages) == sum(e.kind == "message" for e in events) == 4 * 2 * 3 + 4 * 2  # ring + barrier
    assert messages["nbytes"].sum() == sum(e.nbytes for e in events if e.kind == "message")
    assert list(cols["peer"]) == [NONE32 if e.peer is None else e.peer for e in events]
    assert np.array_equal(cols["t_end"], [e.t_end for e in events])


def test_equal_snapshots_of_a_rank_are_stored_once():
    res = simdist.simulate(ring, 8, (4,), leaks="ignore")  # 4 values on 8 ranks: most steps change none
    prev, changed, total = {}, 0, 0
    for e in res.trace:
        if e.snapshot is not None:
            key = (e.rank, e.collective_id, e.kind)
            changed += prev.get(key) != e.snapshot
            total += 1
            prev[key] = e.snapshot
    assert len(res.trace._snaps) == changed < total
    # each rank's final step holds its final buffer
    last = {}
    for e in res.trace:
        if e.kind == "step":
            last[e.rank] = e.snapshot
    expected = (torch.arange(4, dtype=torch.float32) * 8 + sum(range(8))).tolist()
    assert all(v == expected for v in last.values())


@pytest.fixture
def small_flush(monkeypatch):
    monkeypatch.setattr(_trace, "_FLUSH", 40 * _trace.DTYPE.itemsize)  # write out every 40 events


def test_a_streamed_trace_is_the_trace_kept_in_memory(tmp_path, small_flush):
    path = tmp_path / "run.json"
    kept = simdist.simulate(ring, 6, (32,), leaks="ignore", seed=3)
    streamed = simdist.simulate(ring, 6, (32,), leaks="ignore", seed=3, trace_file=path)
    assert len(streamed.trace.columns()) == 0  # all of it went to the file
    assert len(streamed.trace) == len(kept.trace) and streamed.trace.duration() == kept.trace.duration()
    assert streamed.trace.events == kept.trace.events
    loaded = Trace.load(path)
    assert loaded.events == kept.trace.events and loaded.meta == kept.trace.meta
    assert loaded.to_chrome_json() == kept.trace.to_chrome_json()
    assert json.loads(path.read_text())["format"] == "simdist-trace-1"
    # the visualizer's upload reads the file as it reads a downloaded trace
    got = load_traces([("run.json", path.read_bytes())])
    assert not got.problems and got.trace.events == Trace.merge([kept.trace]).events


def stuck(rank: int) -> None:
    simdist.init_process_group("gloo")
    t = torch.ones(4)
    simdist.all_reduce(t)
    if rank == 0:
        simdist.recv(t, 1)  # rank 1 never sends: a deadlock
    simdist.destroy_process_group()


def test_a_streamed_trace_is_finished_when_the_run_fails(tmp_path, small_flush):
    path = tmp_path / "failed.json"
    with pytest.raises(simdist.DeadlockError) as info:
        simdist.simulate(stuck, 3, trace_file=path)
    loaded = Trace.load(path)
    assert loaded.meta["schedule"] == info.value.schedule
    assert sum(e.kind == "collective" for e in loaded.events) == 3


def test_trace_file_must_be_a_path():
    with pytest.raises(TypeError, match="stream=42"):
        simdist.simulate(ring, 2, (4,), trace_file=42)


def test_a_stream_keeps_only_a_bounded_tail_and_what_is_held(tmp_path, small_flush):
    trace = Trace(stream=tmp_path / "t.json")
    held = trace.record(0, "received", "all_reduce", 0, 1, 0, 8, hold=True)
    most = 0
    for i in range(1000):
        trace.record(i % 4, "message", "send", 0, (i + 1) % 4, 0, 8, float(i), float(i) + 1)
        most = max(most, len(trace.columns()))
    assert most > 900  # nothing after a held event is written out
    trace.update(held, step=0, t_start=2.0, t_end=2.0)
    most = 0
    for i in range(1000):
        trace.record(i % 4, "message", "send", 0, (i + 1) % 4, 0, 8, float(i), float(i) + 1)
        most = max(most, len(trace.columns()))
    assert most <= 2 * 40 + 1
    trace.close()
    events = Trace.load(tmp_path / "t.json").events
    assert len(events) == 2001 and events[0].step == 0 and events[0].t_end == 2.0
    assert [e.t_start for e in events[1:1001]] == [float(i) for i in range(1000)]


def test_update_only_reaches_a_held_event():
    trace = Trace()
    i = trace.record(0, "received", "all_reduce", 0, 1, 0, 8, hold=True)
    j = trace.record(0, "step", "all_reduce")
    trace.update(i, step=2, t_start=0.5, t_end=0.5)
    assert trace.events[0].step == 2 and trace.events[0].t_end == 0.5 and trace.duration() == 0.5
    with pytest.raises(ValueError, match="not held"):
        trace.update(j, step=1, t_start=0.0, t_end=0.0)
