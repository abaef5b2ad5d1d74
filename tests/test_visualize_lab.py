"""The visualizer's deadlock scenarios and its runner for pasted code (a child process with limits)."""

from __future__ import annotations

import pytest

import simdist as dist
from simdist.visualize._sandbox import code_allowed, run_code
from simdist.visualize._scenarios import SCENARIOS, run_scenario, scenario_source

pytestmark = pytest.mark.timeout(120)

GOOD = '''
import torch, simdist as dist

def main(rank):
    dist.init_process_group("gloo")
    t = torch.ones(4) * rank
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.tolist()
'''


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_scenario_deadlocks_with_a_report(name):
    err = run_scenario(name)
    assert isinstance(err, dist.DeadlockError) and err.schedule
    assert "_scenarios.py" in str(err)  # the report names the scenario's lines
    assert f"def {SCENARIOS[name].fn.__name__}(rank)" in scenario_source(name)


def test_an_unknown_scenario_is_a_clear_error():
    with pytest.raises(ValueError, match="name='nope' is not a scenario"):
        run_scenario("nope")


def test_pasted_code_runs_in_a_child_process_and_returns_its_trace():
    res = run_code(GOOD, 3)
    assert res.ok and res.values == ("[3.0, 3.0, 3.0, 3.0]",) * 3
    assert len(dist.Trace.from_json(res.trace_json).of_kind("collective")) == 3


def test_pasted_code_is_stopped_at_its_time_limit():
    res = run_code("def main(rank):\n    while True:\n        pass\n", 2, timeout=3)
    assert not res.ok and "did not finish within 3 s" in res.error


def test_pasted_code_is_stopped_at_its_memory_limit():
    res = run_code("x = bytearray(8 << 30)\ndef main(rank):\n    pass\n", 1, memory_mb=1024)
    assert not res.ok and "MemoryError" in res.error


def test_pasted_code_errors_come_back_as_text():
    res = run_code("import simdist as dist, torch\ndef main(rank):\n    dist.init_process_group('gloo')\n"
                   "    dist.recv(torch.zeros(1), src=1 - rank)\n", 2)
    assert not res.ok and res.error.startswith("DeadlockError")
    assert "define main(rank)" in run_code("x = 1\n", 1).error
    with pytest.raises(ValueError, match="world=0"):
        run_code(GOOD, 0)


def test_running_pasted_code_needs_an_explicit_opt_in(monkeypatch):
    monkeypatch.delenv("SIMDIST_ALLOW_CODE", raising=False)
    assert not code_allowed()
    monkeypatch.setenv("SIMDIST_ALLOW_CODE", "1")
    assert code_allowed()
