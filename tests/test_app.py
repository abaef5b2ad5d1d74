"""The main job, ``streamlit run app.py``: every page and widget path, headless with Streamlit's AppTest.

A real browser visits every page in tests/test_browser.py.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("streamlit", reason="the app extra (streamlit) is not installed")
from streamlit.testing.v1 import AppTest  # noqa: E402

from simdist import visualize as V  # noqa: E402

APP = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "app.py")
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


def test_first_screen_shows_a_ring_all_reduce_mid_flight():
    at = page()
    assert at.sidebar.selectbox(key="op").value == "all_reduce"
    assert at.sidebar.selectbox(key="algorithm").value == "ring"
    assert at.session_state.step == len(V.steps(V.collective_run("all_reduce", "ring", 8, 4096).trace)) // 2
    assert int(metric(at, "messages")) == 2 * 7 * 8  # ring: 2(p-1) rounds, p messages each
    assert "Round 7 of 14: 8 messages" in [s.value for s in at.subheader]
    assert at.get("progress")[0].proto.text == "step 7 of 14"  # numbered from 1
    assert any("a message's round is one more than" in c.value for c in at.caption)


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


@pytest.mark.parametrize("op", ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all",
                                "gather", "scatter"])
def test_every_collective_and_algorithm_renders(op):
    at = page()
    at.sidebar.selectbox(key="op").select(op)
    ok(at)
    for algorithm in at.sidebar.selectbox(key="algorithm").options:
        at.sidebar.selectbox(key="algorithm").select(algorithm)
        ok(at)
        assert int(metric(at, "messages")) > 0


@pytest.mark.parametrize("topology", ["switch", "ring", "fully_connected", "two_level"])
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


def test_deadlock_lab_shows_every_scenario():
    at = page("deadlocks")
    for name in V.SCENARIOS:
        at.selectbox(key="scenario").select(name)
        ok(at)
        assert "no rank can proceed" in at.code[1].value and "_scenarios.py:" in at.code[1].value
        assert V.SCENARIOS[name].fn.__name__ in at.code[0].value


def test_ddp_page_shows_buckets_and_overlap():
    at = page("ddp")
    started, total = metric(at, "bucket all-reduces started during backward").split(" of ")
    assert int(started) >= 1 and int(total) == len(at.table[0].value)
    at.sidebar.slider(key="ddp_world").set_value(4)
    at.sidebar.slider(key="ddp_layers").set_value(2)
    at.sidebar.select_slider(key="ddp_width").set_value(64)
    at.sidebar.select_slider(key="ddp_cap").set_value(25.0)
    ok(at)
    assert metric(at, "bucket all-reduces started during backward") == "0 of 1"  # one bucket: after backward


def test_traces_page_offers_downloads_and_shows_a_timeline():
    at = page("traces")
    labels = [b.proto.label for b in at.get("download_button")]
    assert labels == ["Download trace (Chrome/Perfetto JSON)", "Download trace (simdist JSON, for upload here)"]
    at.selectbox(key="tr_op").select("all_gather")
    at.slider(key="tr_world").set_value(8)
    ok(at)
    assert int(metric(at, "events")) > 0


def test_your_code_needs_the_opt_in(monkeypatch):
    monkeypatch.delenv("SIMDIST_ALLOW_CODE", raising=False)
    at = page("your_code")
    assert "SIMDIST_ALLOW_CODE=1" in at.warning[0].value and not at.button


def test_your_code_runs_pasted_code_in_a_separate_process(monkeypatch):
    monkeypatch.setenv("SIMDIST_ALLOW_CODE", "1")
    at = page("your_code")
    at.slider(key="code_world").set_value(3)
    at.button(key="run_code").click()
    ok(at)
    assert [row for row in at.table[0].value["returned"]] == ["[3.0, 3.0, 3.0, 3.0]"] * 3
    at.text_area(key="code").input("def main(rank):\n    raise ValueError('boom')\n")
    at.button(key="run_code").click()
    ok(at)
    assert "ValueError" in at.code[0].value
