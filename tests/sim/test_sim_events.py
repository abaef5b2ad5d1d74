"""The simulator writes its trace through one recorder (``backends/sim/_events.py``), and what it writes is whole."""

from __future__ import annotations

import ast
import math
import warnings
from pathlib import Path

import pytest
import torch

import simdist
from simdist import sim
from simdist.backends.sim import _events

pytestmark = pytest.mark.timeout(60)

SIM = Path(_events.__file__).parent


def _trace_writes(path: Path) -> list[str]:
    """``file:line`` of each call of ``<...>.trace.record(...)`` or ``<...>.trace.update(...)`` in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("record", "update")
            and isinstance(node.func.value, ast.Attribute)
            and node.func.value.attr == "trace"
        ):
            found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_module_of_the_simulator_but_the_recorder_writes_trace_rows():
    modules = sorted(SIM.glob("*.py"))
    assert len(modules) > 5
    writes = [w for p in modules if p.name != "_events.py" for w in _trace_writes(p)]
    assert writes == []


def _program(rank: int) -> float:
    simdist.init_process_group("gloo")
    t = torch.full((4,), float(rank + 1))
    if rank == 0:
        simdist.send(t, 1)
    else:
        simdist.recv(t, 0)
    sim.compute(seconds=0.5)
    simdist.all_reduce(t, algorithm="ring")
    simdist.destroy_process_group()
    return float(t[0])


def test_every_kind_of_event_comes_out_with_its_fields():
    res = simdist.simulate(_program, 2, record_steps=True, seed=0)
    assert res.values == [2.0, 2.0]  # rank 1 received rank 0's ones, then the sum of two ones
    by_kind: dict[str, list] = {}
    for e in res.trace.events:
        by_kind.setdefault(e.kind, []).append(e)
    # the user's send and receive: a span on each rank's lane, one message between them
    (send,), (recv,) = by_kind["send"], by_kind["recv"]
    assert (send.rank, send.peer, recv.rank, recv.peer, send.nbytes) == (0, 1, 1, 0, 16)
    user_messages = [m for m in by_kind["message"] if m.collective_id is None]
    assert [(m.rank, m.peer, m.op) for m in user_messages] == [(0, 1, "send")]
    # compute: 0.5 s on each rank
    assert sorted((c.rank, c.t_end - c.t_start) for c in by_kind["compute"]) == [(0, 0.5), (1, 0.5)]
    # ring all_reduce of 2 ranks: a reduce-scatter step and an all-gather step, one message a rank each
    coll = [m for m in by_kind["message"] if m.collective_id is not None]
    assert len(coll) == 4 and {m.algorithm for m in coll} == {"ring"}
    assert sorted(c.rank for c in by_kind["collective"]) == [0, 1]
    # each receive of the collective names the step whose wait completed it: steps 0 and 1 on each rank
    assert sorted((r.rank, r.step) for r in by_kind["received"]) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # snapshots: before any wait, after each of the two waits
    assert sorted((s.rank, s.step) for s in by_kind["step"]) == [(r, k) for r in (0, 1) for k in range(3)]


def _unwritten_receive(rank: int) -> list:
    """An all_gather into a buffer whose unwritten part holds signalling NaNs (as ``torch.empty`` may)."""
    simdist.init_process_group("gloo")
    out = torch.tensor([0x7F800001] * 4, dtype=torch.int32).view(torch.float32)  # float32 signalling NaNs
    simdist.all_gather_into_tensor(out, torch.full((2,), float(rank)))
    return out.tolist()


def test_a_buffer_of_signalling_nans_is_recorded_without_a_numpy_warning():
    """The step snapshots widen float32 to float64; an unwritten buffer's NaNs stay NaN, with no RuntimeWarning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "invalid value encountered in cast" would fail the run
        res = simdist.simulate(_unwritten_receive, 2, record_steps=True, seed=0)
    assert res.values == [[0.0, 0.0, 1.0, 1.0]] * 2
    steps = [e for e in res.trace.events if e.kind == "step" and e.snapshot is not None]
    first = [e.snapshot for e in steps if e.step == 0]
    assert first and all(sum(map(math.isnan, snap)) == 2 for snap in first), first  # half not yet received
