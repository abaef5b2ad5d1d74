"""The main job, ``streamlit run app.py``: every page and widget path, headless with Streamlit's AppTest.

A real browser visits every page in tests/app/test_browser.py.
"""

from __future__ import annotations

import json

import os
import re

import pytest

pytest.importorskip("streamlit", reason="the app extra (streamlit) is not installed")
from streamlit.testing.v1 import AppTest  # noqa: E402

from simdist import visualize as V  # noqa: E402

APP = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "app.py")
pytestmark = pytest.mark.timeout(300)


def page(name: str | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120).run()
    if name is not None:
        at.switch_page(f"app_pages/{name}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def button(at: AppTest, label: str):
    return next(b for b in at.button if b.label == label)


def ok(at: AppTest) -> AppTest:
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


# -- Collectives ----------------------------------------------------------------------------------------------


def test_first_screen_shows_a_ring_all_reduce_at_its_first_round():
    at = page()
    assert at.sidebar.selectbox(key="op").value == "all_reduce"
    assert at.sidebar.selectbox(key="algorithm").value == "ring"
    assert at.session_state.step == 1
    assert int(metric(at, "messages")) == 2 * 7 * 8  # ring: 2(p-1) rounds, p messages each
    assert "Round 1 of 14: 8 messages" in [s.value for s in at.subheader]
    assert at.get("progress")[0].proto.text == "round 1 of 14"  # numbered from 1, as the subheader
    assert any("a message's round is one more than" in c.value for c in at.caption)
    assert "round 1 marked" in timeline_chart(at)["layout"]["title"]["text"]


def timeline_chart(at: AppTest) -> dict:
    """The timeline's plotly figure as the page sent it."""
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    return next(c for c in charts if c["layout"]["title"]["text"].startswith("timeline on"))


def test_the_timeline_marks_the_round_shown_and_the_caption_says_when_cells_carry_numbers():
    at = page()
    button(at, "next ▶").click()
    ok(at)
    fig = timeline_chart(at)
    assert "round 2 marked" in fig["layout"]["title"]["text"]
    band = fig["layout"]["shapes"][0]
    trace = V.collective_run("all_reduce", "ring", 8, 512).trace
    arrows = [a for a in V.timeline(trace).arrows if a.round == 2]
    assert {(a.src, a.dst) for a in arrows} == set(V.step_graph(trace, 2).edges())  # counted another way
    assert band["x0"] == pytest.approx(min(a.t_start for a in arrows) * 1e6)
    assert band["x1"] == pytest.approx(max(a.t_end for a in arrows) * 1e6)
    marked = next(t for t in fig["data"] if t.get("name") == "round 2")
    assert sum(x is not None for x in marked["x"]) == 2 * len(arrows)
    captions = " ".join(c.value for c in at.caption)
    assert "try 64 B" in captions and "text: how many ranks" not in captions  # 512 B: 64 values a row, no text
    at.sidebar.select_slider(key="size").set_value("64 B")
    ok(at)
    captions = " ".join(c.value for c in at.caption)
    assert "text: how many ranks' inputs it sums" in captions
    buffers = next(json.loads(c.proto.spec) for c in at.get("plotly_chart") if "after round" in
                   json.loads(c.proto.spec)["layout"]["title"]["text"])  # fmt: skip
    assert buffers["data"][0]["texttemplate"] == "%{text}"


def test_previous_next_and_play_walk_through_every_step():
    at = page()
    start = at.session_state.step
    button(at, "next ▶").click()
    ok(at)
    assert at.session_state.step == start + 1
    button(at, "◀ previous").click()
    ok(at)
    assert at.session_state.step == start
    button(at, "▶ play").click()
    ok(at)
    assert at.session_state.step == 15 and not at.session_state.playing  # 14 rounds, then the result
    assert any("at the end" in s.value for s in at.subheader)
    assert not button(at, "▶ play").disabled  # enabled again: a second press plays to the result again
    button(at, "▶ play").click()
    ok(at)
    assert at.session_state.step == 15 and not at.session_state.playing
    button(at, "◀ previous").click()
    ok(at)
    assert "Round 14 of 14: 8 messages" in [s.value for s in at.subheader]


@pytest.mark.parametrize(
    "op", ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"]
)
def test_every_collective_and_algorithm_renders(op):
    at = page()
    at.sidebar.selectbox(key="op").select(op)
    ok(at)
    for algorithm in at.sidebar.selectbox(key="algorithm").options:
        at.sidebar.selectbox(key="algorithm").select(algorithm)
        ok(at)
        assert int(metric(at, "messages")) > 0


@pytest.mark.parametrize(
    "topology", ["switch", "ring", "fully_connected", "two_level", "dgx-a100-nvlink", "ib-hdr-4node"]
)
def test_world_16_at_1_mib_on_every_topology(topology):
    at = page()
    at.sidebar.slider(key="world").set_value(16)
    at.sidebar.select_slider(key="size").set_value("1 MiB")
    at.sidebar.selectbox(key="topology").select(topology)
    ok(at)
    assert int(metric(at, "messages")) == 2 * 15 * 16


# -- the other pages --------------------------------------------------------------------------------------------


def test_compare_algorithms_page_shows_formulas_and_crossovers():
    at = page("compare")
    assert len(at.table[0].value) == len(V.compare_algorithms("all_reduce", 2, [16]).curves)
    at.sidebar.selectbox(key="cmp_op").select("broadcast")
    at.sidebar.slider(key="cmp_world").set_value(4)
    at.sidebar.selectbox(key="cmp_topology").select("ring")
    ok(at)
    trust = " ".join(m.value for m in at.markdown)
    assert "Where the network decides" in trust and "Where the CPU decides" in trust


def tables(at: AppTest) -> list[list[dict]]:
    return [t.value.to_dict("records") for t in at.table]


@pytest.mark.parametrize("topology", ["switch", "two_level"])
def test_compare_page_defines_every_symbol_it_shows(topology):
    at = page("compare")
    at.sidebar.selectbox(key="cmp_topology").select(topology)
    for op in ("all_reduce", "all_gather", "broadcast"):
        at.sidebar.selectbox(key="cmp_op").select(op)
        ok(at)
        shown = tables(at)
        formulas = next(t for t in shown if t and "α-β cost" in t[0])
        symbols = {r["symbol"] for r in next(t for t in shown if t and "symbol" in t[0])}
        for row in formulas:
            assert set(V.formula_symbols(row["α-β cost"])) <= symbols, row
        assert {"α", "β", "p", "n"} <= symbols
        text = " ".join(m.value for m in at.markdown) + " ".join(c.value for c in at.caption)
        if topology == "two_level":
            assert "Why the lines sit below the points on two_level" in text
            assert at.sidebar.radio(key="cmp_slowest").options == ["ranks 0 and 1", "ranks 0 and 4 (the slowest pair)"]
        if op == "all_reduce" and topology == "switch":
            assert "ring, ring_pipelined and hierarchical take exactly the same time" in text
    if topology == "two_level":
        at.sidebar.radio(key="cmp_slowest").set_value(True)
        ok(at)


def test_deadlock_lab_shows_every_scenario():
    at = page("deadlocks")
    for name in V.SCENARIOS:
        at.selectbox(key="scenario").select(name)
        ok(at)
        program, report = at.code[0], at.code[1]
        assert program.value == V.scenario_source(name).rstrip("\n") and program.proto.show_line_numbers
        assert "no rank can proceed" in report.value and report.proto.wrap_lines
        lines = program.value.splitlines()
        table = next(m.value for m in at.markdown if m.value.startswith("| rank | line |"))
        found = re.findall(r"rank (\d+) is blocked in (\w+).* at program\.py:(\d+)", report.value)
        assert found
        for rank, op, line in found:
            assert f"dist.{op}(" in lines[int(line) - 1]  # the report's line of the program shown calls the op
            assert f"| **{rank}** | **{line}** |" in table  # and the table under it says the same
        assert "/" not in "".join(re.findall(r" at (\S+)", report.value))  # no library paths


def chart(at: AppTest, key: str) -> dict:
    """The plotly figure a chart element holds, as its JSON."""
    import json

    return json.loads(
        next(c for c in at.get("plotly_chart") if c.proto.id.endswith(key) or key in c.proto.id).proto.spec
    )


@pytest.mark.parametrize("world", [2, 8])
def test_ddp_page_counts_overlap_as_the_gradient_order_does(world):
    at = page("ddp")
    if world != 2:
        at.sidebar.slider(key="ddp_world").set_value(world)
        ok(at)
    run = V.ddp_run(world, (256,) * 5, 0.25)
    ready = {n: i for i, n in enumerate(run.ready[0])}
    launched = [max(ready[n] for b in run.buckets[: i + 1] for n in b.params) for i in range(len(run.buckets))]
    during = sum(at_ < len(ready) - 1 for at_ in launched)  # launched before the last gradient
    assert metric(at, "all-reduces started in backward") == f"{during} of {len(run.buckets)}"
    assert [r["parameters"] for r in at.table[0].value.to_dict("records")] == [", ".join(b.params) for b in run.buckets]
    names = [t.get("name", "") for t in chart(at, "ddp_gantt")["data"]]
    assert not [n for n in names if "construction" in n or n == "message that shared a link"]
    at.sidebar.checkbox(key="ddp_construction").check()
    at.sidebar.checkbox(key="ddp_contention").check()
    ok(at)
    names = [t.get("name", "") for t in chart(at, "ddp_gantt")["data"]]
    assert "DDP construction" in names
    assert ("message that shared a link" in names) == bool(V.timeline(run.trace).contention)


def test_ddp_page_with_one_bucket_overlaps_nothing():
    at = page("ddp")
    at.sidebar.slider(key="ddp_world").set_value(4)
    at.sidebar.slider(key="ddp_layers").set_value(2)
    at.sidebar.select_slider(key="ddp_width").set_value(64)
    at.sidebar.select_slider(key="ddp_cap").set_value(25.0)
    ok(at)
    assert metric(at, "all-reduces started in backward") == "0 of 1"  # one bucket: after backward


def test_traces_page_offers_downloads_and_shows_a_timeline():
    at = page("traces")
    labels = [b.proto.label for b in at.get("download_button")]
    assert labels == ["Download trace (Chrome/Perfetto JSON)", "Download trace (simdist JSON, for upload here)"]
    at.selectbox(key="tr_op").select("all_gather")
    at.slider(key="tr_world").set_value(8)
    ok(at)
    assert int(metric(at, "events")) > 0 and metric(at, "clock") == "virtual"
    assert int(metric(at, "messages")) == 7 * 8  # ring all_gather: p - 1 steps of p messages
    markdown = " ".join(m.value for m in at.markdown)
    assert "simdist run --backend sim --nproc-per-node 4 --trace run.json train.py" in markdown
    (calls,) = at.dataframe
    assert list(calls.value["times called"]) == [8]  # the all_gather, once per rank, at the line that called it


def test_the_deadlock_lab_says_how_to_test_and_trace_a_script_of_ones_own():
    at = page("deadlocks")
    ok(at)
    markdown = " ".join(m.value for m in at.markdown)
    assert "simdist test --nproc-per-node 4 train.py" in markdown and "--trace run.json" in markdown


@pytest.fixture
def walled_app(monkeypatch):
    """The app where bubblewrap is installed (else the test skips), started without ``SIMDIST_ALLOW_CODE``."""
    from simdist.visualize import bubblewrap

    if bubblewrap() is None:
        pytest.skip("bubblewrap is not installed here (apt-get install bubblewrap)")
    monkeypatch.delenv("SIMDIST_ALLOW_CODE", raising=False)


def test_your_code_needs_bubblewrap_or_the_opt_in(monkeypatch):
    from simdist.visualize import _sandbox

    monkeypatch.delenv("SIMDIST_ALLOW_CODE", raising=False)
    monkeypatch.setattr(_sandbox, "_bubblewrap", lambda: None)  # as where bubblewrap is not installed
    at = page("your_code")
    warning = at.warning[0].value
    assert "SIMDIST_ALLOW_CODE=1" in warning and "apt-get install bubblewrap" in warning and not at.button


def test_your_code_runs_pasted_code_in_a_separate_process(monkeypatch):
    from simdist.visualize import _sandbox

    monkeypatch.setenv("SIMDIST_ALLOW_CODE", "1")
    monkeypatch.setattr(_sandbox, "_bubblewrap", lambda: None)  # the contained process without bubblewrap
    at = page("your_code")
    assert "must not be served" in at.warning[0].value
    at.slider(key="code_world").set_value(3)
    at.button(key="run_code").click()
    ok(at)
    assert [row for row in at.table[0].value["returned"]] == ["[3.0, 3.0, 3.0, 3.0]"] * 3
    assert any("network" in c.value.lower() for c in at.caption)  # the page says whether the run had a network
    at.text_area(key="code").input("def main(rank):\n    raise ValueError('boom')\n")
    at.button(key="run_code").click()
    ok(at)
    assert "ValueError" in at.code[0].value


def test_with_bubblewrap_your_code_runs_in_its_sandbox_without_the_opt_in(walled_app):
    at = page("your_code")
    assert not at.warning
    at.slider(key="code_world").set_value(2)
    at.text_area(key="code").input("import os\n\ndef main(rank):\n    return [os.getcwd(), os.listdir()]\n")
    at.button(key="run_code").click()
    ok(at)
    assert [row for row in at.table[0].value["returned"]] == ["['/home/student', []]"] * 2  # the sandbox's own home
    assert any("bubblewrap's sandbox" in c.value for c in at.caption)


ONCE = """\
import simdist as dist


class Once:
    owner = None


def main(rank):
    if Once.owner is None:
        Once.owner = rank
    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()
    return Once.owner
"""


def test_your_code_runs_each_rank_as_a_process_when_asked(walled_app):
    at = page("your_code")
    at.slider(key="code_world").set_value(3)
    at.text_area(key="code").input(ONCE)
    at.radio(key="code_isolation").set_value("processes")
    at.button(key="run_code").click()
    ok(at)
    assert list(at.table[0].value["returned"]) == ["0", "1", "2"]  # a class attribute of its own per rank
    at.radio(key="code_isolation").set_value("threads")
    at.button(key="run_code").click()
    ok(at)
    assert len(set(at.table[0].value["returned"])) == 1  # one process: the first rank to set it wins


# -- Exercises ----------------------------------------------------------------------------------------------------
# The code editor is a component in its own frame: the browser tests type in it (tests/app/test_browser_sessions.py);
# here the page's plain text box, which sends the same code, stands in for it.


def plain(at: AppTest) -> AppTest:
    """The Exercises page with its plain text box instead of the code editor."""
    at.toggle(key="plain_box").set_value(True)
    return ok(at)


def editor_args(at: AppTest) -> dict:
    (editor,) = at.get("component_instance")
    return json.loads(editor.proto.json_args)


def test_exercises_open_in_a_code_editor_with_the_starter_and_keep_a_draft_across_exercises(monkeypatch):
    monkeypatch.setenv("SIMDIST_ALLOW_CODE", "1")
    at = page("exercises")
    args = editor_args(at)
    assert args["code"].startswith("import torch") and "def my_all_reduce(tensor):" in args["code"]
    assert args["lang"] == "python" and args["options"]["showLineNumbers"] and args["options"]["tabSize"] == 4
    assert [b["name"] for b in args["buttons"]] == ["Submit"] and args["buttons"][0]["commands"] == ["submit"]
    at = plain(at)  # what the student wrote, then another exercise and back: it is still there
    at.text_area(key="code_01_ring_all_reduce").input("# my ring\n")
    at.button(key="submit").click()
    ok(at)
    at.selectbox(key="exercise").select("Binomial-tree broadcast")
    ok(at)
    at.toggle(key="plain_box").set_value(False)
    ok(at)
    assert editor_args(at)["code"].startswith("import torch\nimport simdist")  # this exercise's starter
    at.selectbox(key="exercise").select("Ring all-reduce from send and recv")
    ok(at)
    assert editor_args(at)["code"] == "# my ring\n"


def test_without_a_sandbox_or_the_opt_in_the_editor_has_no_submit_button(monkeypatch):
    from simdist.visualize import _sandbox

    monkeypatch.delenv("SIMDIST_ALLOW_CODE", raising=False)
    monkeypatch.setattr(_sandbox, "_bubblewrap", lambda: None)
    assert editor_args(page("exercises"))["buttons"] == []


def test_exercises_show_the_task_hints_and_numbered_code_but_no_submit_without_a_sandbox_or_the_opt_in(monkeypatch):
    from simdist.visualize import _sandbox

    monkeypatch.delenv("SIMDIST_ALLOW_CODE", raising=False)
    monkeypatch.setattr(_sandbox, "_bubblewrap", lambda: None)  # as where bubblewrap is not installed
    at = plain(page("exercises"))
    names = at.selectbox(key="exercise").options
    assert len(names) == 6 and names[0] == "Ring all-reduce from send and recv"
    assert any("my_all_reduce(tensor)" in m.value for m in at.markdown)
    assert "def my_all_reduce(tensor):" in at.text_area(key="code_01_ring_all_reduce").value
    numbered = [c for c in at.code if c.proto.show_line_numbers]
    assert numbered and numbered[0].value.startswith("import torch")
    assert "SIMDIST_ALLOW_CODE=1" in at.warning[0].value and "apt-get install bubblewrap" in at.warning[0].value
    assert at.button(key="submit").disabled
    from simdist.exercises import load_all

    solution = {e.name: e.solution.strip() for e in load_all()}["01_ring_all_reduce"]
    shown = [m.value for m in at.markdown] + [c.value for c in at.code] + [t.value for t in at.text_area]
    assert all(solution not in text for text in shown)  # the model solution is never shown
    at.button(key="hint").click()
    ok(at)
    assert at.info[0].value.startswith("Hint 1: In world - 1 steps")


def test_a_submission_is_graded_in_a_separate_process_and_a_rare_mistake_is_explained(monkeypatch):
    monkeypatch.setenv("SIMDIST_ALLOW_CODE", "1")
    at = plain(page("exercises"))
    at.selectbox(key="exercise").select("A parameter server: receive from any source")
    ok(at)
    from simdist.exercises import load_all

    server = {e.name: e for e in load_all()}["05_parameter_server"]
    at.text_area(key="code_05_parameter_server").input(server.solution)
    at.button(key="submit").click()
    ok(at)
    assert at.success[0].value.startswith("Passed: passed")
    assert any("network" in c.value.lower() for c in at.caption)
    wrong = server.solution.replace("        grads[sender - 1] = grad\n", "        grads[_] = grad\n")
    at.text_area(key="code_05_parameter_server").input(wrong)
    at.button(key="submit").click()
    ok(at)
    assert at.error[0].value.startswith("Wrong result (world size 3): rank 0 returned")
    assert any("solution.py:9" in m.value for m in at.markdown)  # the decision, at the student's line
    assert any(c.value.startswith("choices:") for c in at.code)  # the replay token
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert any(c["layout"]["title"]["text"].startswith("timeline on") for c in charts)  # the failing run
    calls = at.dataframe[0].value  # what the failing run's receives held: rank 2's gradient came first
    assert list(calls["call"]) == [
        "solution.py:9 recv from any rank: [2, 2] (from rank 2)",
        "solution.py:9 recv from any rank: [1, 1] (from rank 1)",
    ] and list(calls["rank"]) == [0, 0]
    at.selectbox(key="exercise").select("Fix a deadlock: trade with both neighbours on a ring")
    ok(at)
    at.button(key="submit").click()  # the starter as it is: it deadlocks
    ok(at)
    assert at.error[0].value.startswith("Deadlock (world size 3): no rank can proceed")
    assert any(m.value.startswith("**Who waits for whom**") for m in at.markdown)
    assert len(at.get("plotly_chart")) == 1  # the wait-for graph (no message moved: no timeline)


def test_the_teachers_view_counts_submissions_and_failure_kinds_without_names(monkeypatch):
    """With SIMDIST_TEACHER=1 the page shows, per exercise, submissions, passes and the commonest failures of every
    session since the app started (the tally is the process's: other tests' submissions count too)."""
    monkeypatch.setenv("SIMDIST_ALLOW_CODE", "1")
    monkeypatch.setenv("SIMDIST_TEACHER", "1")
    from simdist.exercises import load_all

    server = {e.name: e for e in load_all()}["05_parameter_server"]
    title = "A parameter server: receive from any source"

    def row(at: AppTest) -> dict:
        table = at.table[0].value if at.table else None
        if table is None or title not in list(table["exercise"]):
            return {"submitted": 0, "passed": 0, "failures": ""}
        i = list(table["exercise"]).index(title)
        return {k: table[k].iloc[i] for k in ("submitted", "passed", "failures")}

    at = plain(page("exercises"))
    before = row(at)
    at.selectbox(key="exercise").select(title)
    ok(at)
    for source in (server.solution, server.starter):  # passes; receives nothing, so the workers wait: a deadlock
        at.text_area(key="code_05_parameter_server").input(source)
        at.button(key="submit").click()
        ok(at)
    ok(at)  # the view is drawn before the submit of a run: one more run shows both
    after = row(at)
    assert after["submitted"] == before["submitted"] + 2 and after["passed"] == before["passed"] + 1
    assert "deadlock" in after["failures"]
    assert set(at.table[0].value.columns) == {"exercise", "submitted", "passed", "failures"}  # no one's name


def test_with_bubblewrap_submitting_needs_no_opt_in_and_the_page_says_which_containment(walled_app):
    at = plain(page("exercises"))
    assert not at.warning
    at.button(key="submit").click()
    ok(at)
    assert at.error[0].value.startswith("Wrong result (world size 2)")  # the starter sums nothing
    assert any(c.value.startswith("Graded in bubblewrap's sandbox: no network") for c in at.caption)


def test_without_bubblewrap_but_with_the_opt_in_the_page_says_not_to_serve_it(monkeypatch):
    from simdist.visualize import _sandbox

    monkeypatch.setenv("SIMDIST_ALLOW_CODE", "1")
    monkeypatch.setattr(_sandbox, "_bubblewrap", lambda: None)
    at = plain(page("exercises"))
    assert "must not be served to others" in at.warning[0].value
    assert not at.button(key="submit").disabled
