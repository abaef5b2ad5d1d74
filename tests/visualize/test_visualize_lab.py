"""The visualizer's deadlock scenarios, trace files, and its runner for pasted code (a child process with limits)."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch
from simdist.visualize import (
    collective_run,
    load_traces,
    summarize,
    trace_clock,
    trace_figure,
    wait_for,
    wait_for_figure,
)
from simdist.visualize._sandbox import code_allowed, run_code
from simdist.visualize._scenarios import PROGRAM, SCENARIOS, run_scenario, scenario_main, scenario_source, where_blocked

import simdist as dist

pytestmark = pytest.mark.timeout(120)

GOOD = """
import torch, simdist as dist

def main(rank):
    dist.init_process_group("gloo")
    t = torch.ones(4) * rank
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.tolist()
"""


BLOCKED = re.compile(r"^  rank (\d+) is blocked in (\w+)\b.* at (\S+):(\d+)$")


def _blocked_lines(report: str) -> dict[int, tuple[str, str, int]]:
    """``{rank: (op, file, line)}`` parsed from a DeadlockError's text."""
    found = {}
    for line in report.splitlines():
        m = BLOCKED.match(line)
        if m:
            found[int(m[1])] = (m[2], m[3], int(m[4]))
    return found


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_scenario_reports_the_lines_of_the_program_shown(name):
    err = run_scenario(name)
    assert isinstance(err, dist.DeadlockError) and err.schedule
    text, source = str(err), scenario_source(name).splitlines()
    assert os.sep + "visualize" not in text and "_scenarios.py" not in text  # no library path anywhere
    blocked = _blocked_lines(text)
    assert sorted(blocked) == sorted(b["rank"] for b in err.blocked) and blocked
    for rank, (op, file, line) in blocked.items():
        assert file == PROGRAM == "program.py"
        assert f"dist.{op}(" in source[line - 1], (rank, op, line, source[line - 1])  # the shown line calls it
    sites = re.findall(r" at (\S+:\d+)", text)
    assert sites and all(site.startswith("program.py:") for site in sites)
    rows = where_blocked(wait_for(err), scenario_source(name))
    assert {b.rank: b.line for b in rows if b.line is not None} == {r: v[2] for r, v in blocked.items()}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_program_shown_is_the_program_run(name):
    """Run as ``python program.py`` would (its last line runs it), the program gives the same report."""
    with pytest.raises(dist.DeadlockError) as info:
        scenario_main(name, module="__main__")
    assert str(info.value) == str(run_scenario(name))
    assert f"dist.simulate(main, {SCENARIOS[name].world})" in scenario_source(name)


def test_groups_are_called_by_the_names_the_program_gave_them():
    err = run_scenario("collectives in opposite orders")
    text = str(err)
    assert "collective 1 of group a)" in text and "collective 1 of group b)" in text
    assert "group 1" not in text and "group 2" not in text
    assert {b["rank"]: b["group_desc"] for b in err.blocked} == {0: "a", 1: "b"}
    g = wait_for(err)
    assert g.nodes[0]["call"] == "all_reduce on group a" and g.edges[0, 1]["waits_for"] == "all_reduce on group a"
    assert g.nodes[1]["call"] == "all_reduce on group b"
    assert "group 0" in str(run_scenario("head-to-head sends"))  # groups without a name keep their number


def _named_group_of_wrong_type(rank):
    dist.init_process_group("gloo")
    dist.new_group([0, 1], group_desc=7)


def test_a_group_name_must_be_a_string():
    with pytest.raises(dist.RankError) as info:
        dist.simulate(_named_group_of_wrong_type, 2, leaks="ignore")
    assert "group_desc must be a str" in str(info.value.__cause__) and "int (7)" in str(info.value.__cause__)


def test_a_collective_not_every_member_joined_shows_no_messages_of_its_own():
    err = run_scenario("point-to-point against a barrier")
    text = str(err)
    assert err.unmatched and all(" on group 0" in u for u in err.unmatched)  # the program's own messages only
    assert "in barrier" not in "".join(err.unmatched) and "0 bytes" not in text
    assert "rank 1 is blocked in barrier (collective 1 of group 0), waiting for ranks [0] to join it" in text
    assert "recv 0<-1 tag 0 (4 bytes, float32) on group 0 at program.py:" in text  # the program's own stays


def _text_boxes_apart(fig) -> None:
    """Every text box inside the plot area and none closer than 4 px to another (as laid out)."""
    boxes = fig.layout.meta["boxes"]
    width, height = fig.layout.xaxis.range[1], fig.layout.yaxis.range[1]
    for x, y, w, h in boxes:
        assert 0 <= x - w / 2 and x + w / 2 <= width and 0 <= y - h / 2 and y + h / 2 <= height, (x, y, w, h)
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            apart = abs(a[0] - b[0]) >= (a[2] + b[2]) / 2 + 4 or abs(a[1] - b[1]) >= (a[3] + b[3]) / 2 + 4
            assert apart, (a, b)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_wait_for_figure_text_is_large_and_nothing_overlaps(name):
    err = run_scenario(name)
    g = wait_for(err)
    fig = wait_for_figure(g)
    texts = [a for a in fig.layout.annotations if a.text]
    assert all(a.font.size >= 14 for a in texts) and fig.layout.width == 720
    labels = {a.text for a in texts}
    for u, v in g.edges:  # every arrow says what its rank waits for
        assert f"waits for<br>{g.edges[u, v]['waits_for']}" in labels
    for b in err.blocked:
        assert any(
            f"<b>rank {b['rank']}</b>" in t and b["call_site"].replace("program.py", "program.py") in t for t in labels
        )
    assert len(fig.layout.meta["boxes"]) == g.number_of_nodes() + g.number_of_edges()
    _text_boxes_apart(fig)


def _ring_of_recvs(rank, world):
    dist.init_process_group("gloo")
    dist.recv(torch.zeros(1), src=(rank + 1) % world)


@pytest.mark.parametrize("world", [3, 5, 8])
def test_wait_for_figure_keeps_labels_apart_on_larger_rings(world):
    with pytest.raises(dist.DeadlockError) as info:
        dist.simulate(_ring_of_recvs, world, args=(world,))
    fig = wait_for_figure(wait_for(info.value))
    _text_boxes_apart(fig)
    assert fig.layout.height > 200


LOADED = 90.0  # s of wall time for code that is not about the time limit: a child importing torch on a loaded machine


def test_pasted_code_runs_in_a_child_process_and_returns_its_trace():
    res = run_code(GOOD, 3, timeout=LOADED)
    assert res.ok and res.values == ("[3.0, 3.0, 3.0, 3.0]",) * 3
    assert len(dist.Trace.from_json(res.trace_json).of_kind("collective")) == 3


def test_pasted_code_is_stopped_at_its_time_limit():
    res = run_code("def main(rank):\n    while True:\n        pass\n", 2, timeout=3)
    assert not res.ok and "did not finish within 3 s" in res.error


def test_pasted_code_is_stopped_at_its_memory_limit():
    res = run_code("x = bytearray(8 << 30)\ndef main(rank):\n    pass\n", 1, memory_mb=1024, timeout=LOADED)
    assert not res.ok and "MemoryError" in res.error


def test_pasted_code_errors_come_back_as_text():
    res = run_code(
        "import simdist as dist, torch\ndef main(rank):\n    dist.init_process_group('gloo')\n"
        "    dist.recv(torch.zeros(1), src=1 - rank)\n",
        2,
        timeout=LOADED,
    )
    assert not res.ok and res.error.startswith("DeadlockError")
    assert "define main(rank)" in run_code("x = 1\n", 1, timeout=LOADED).error
    with pytest.raises(ValueError, match="world=0"):
        run_code(GOOD, 0)


def test_running_pasted_code_needs_an_explicit_opt_in(monkeypatch):
    monkeypatch.delenv("SIMDIST_ALLOW_CODE", raising=False)
    assert not code_allowed()
    monkeypatch.setenv("SIMDIST_ALLOW_CODE", "1")
    assert code_allowed()


# -- trace files: real runs and simulated ones ---------------------------------------------------------------------

SENDS_PER_RANK = 2


def traced_socket_program(rank, world_size):
    """3 all_reduces, ``SENDS_PER_RANK`` sends to the right neighbour (and as many receives), a barrier."""
    dist.init_process_group("gloo")
    t = torch.ones(100)
    for _ in range(3):
        dist.all_reduce(t)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    for _ in range(SENDS_PER_RANK):
        if rank % 2 == 0:
            dist.send(t, dst=right)
            dist.recv(t, src=left)
        else:
            dist.recv(t)  # from any rank: the trace names the sender
            dist.send(t, dst=right)
    dist.barrier()
    dist.destroy_process_group()


def real_run_files(tmp_path, monkeypatch, world=2) -> list:
    """The trace files of ``traced_socket_program`` run on the socket backend (one process per rank)."""
    monkeypatch.setenv("SIMDIST_TRACE", str(tmp_path))
    dist.spawn(traced_socket_program, args=(world,), nprocs=world, backend="socket")
    files = sorted(tmp_path.glob("rank*.trace.json"))
    assert len(files) == world
    return files


def _count(files, kind: str) -> int:
    """Rows of ``kind`` in the files, read straight from their JSON (not through simdist.Trace)."""
    n = 0
    for f in files:
        raw = json.loads(f.read_text())
        at = raw["fields"].index("kind")
        n += sum(1 for row in raw["events"] if row[at] == kind)
    return n


def test_a_real_runs_trace_says_wall_clock_time_and_counts_its_messages(tmp_path, monkeypatch):
    files = real_run_files(tmp_path, monkeypatch)
    sends, recvs = _count(files, "send"), _count(files, "recv")
    assert sends == recvs == 2 * SENDS_PER_RANK  # each rank's sends, as the program makes them
    loaded = load_traces([(f.name, f.read_bytes()) for f in files])
    assert loaded.problems == () and loaded.names == ("rank0.trace.json", "rank1.trace.json")
    assert all(e.peer == 1 - e.rank and e.nbytes == 400 for e in loaded.trace.of_kind("send", "recv"))
    summary = summarize(loaded.trace)
    assert (summary.clock, summary.ranks, summary.messages, summary.collectives) == ("real", 2, sends, 4)
    fig = trace_figure(loaded.trace)
    assert "wall clock" in fig.layout.xaxis.title.text and "virtual" not in fig.layout.xaxis.title.text
    assert fig.layout.title.text.startswith("real run") and f"{sends} messages" in fig.layout.title.text
    bars = [b for tr in fig.data if tr.type == "bar" for b in tr.base]
    last_ms = max(e.t_end for e in loaded.trace) * 1e3
    assert bars and max(bars) <= last_ms + 1e-9  # the axis is in milliseconds of the run


def test_a_simulated_trace_says_virtual_time_and_counts_every_message():
    world = 4
    trace = collective_run("all_reduce", "ring", world, 4096).trace
    summary = summarize(trace)
    assert summary.clock == trace_clock(trace) == "virtual"
    assert summary.messages == 2 * (world - 1) * world  # ring: 2(p-1) steps of p messages
    assert summary.collectives == 1 and summary.ranks == world
    fig = trace_figure(trace)
    assert (
        fig.layout.xaxis.title.text.startswith("virtual time")
        and f"{summary.messages} messages" in fig.layout.title.text
    )


def test_a_bad_file_among_several_is_named_and_the_others_kept(tmp_path, monkeypatch):
    files = real_run_files(tmp_path, monkeypatch)
    good = [(f.name, f.read_bytes()) for f in files]
    sim = collective_run("all_reduce", "ring", 2, 64).trace
    bad = [
        ("notes.json", b'{"hello": 1}'),
        ("broken.json", b"{not json"),
        ("perfetto.json", sim.to_chrome_json()),
        ("image.json", b"\xff\xd8\xff"),
        ("simulated.json", sim.to_json()),
    ]
    loaded = load_traces(good[:1] + bad + good[1:] + good[:1])
    assert loaded.names == ("rank0.trace.json", "rank1.trace.json")
    assert len(loaded.trace) == sum(len(dist.Trace.from_json(data.decode())) for _, data in good)
    why = dict(loaded.problems)
    assert list(why) == [
        "notes.json",
        "broken.json",
        "perfetto.json",
        "image.json",
        "simulated.json",
        "rank0.trace.json",
    ]
    assert "not a simdist trace" in why["notes.json"] and "not JSON" in why["broken.json"]
    assert "Perfetto" in why["perfetto.json"] and "UTF-8" in why["image.json"]
    assert "clock is virtual" in why["simulated.json"] and "rank 0 is already in" in why["rank0.trace.json"]
    nothing = load_traces(bad[:2])
    assert nothing.trace is None and [n for n, _ in nothing.problems] == ["notes.json", "broken.json"]
