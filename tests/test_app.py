"""The main job, ``streamlit run app.py``, executed headlessly by Streamlit's AppTest."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("streamlit", reason="the app extra (streamlit) is not installed")
from streamlit.testing.v1 import AppTest  # noqa: E402

APP = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "app.py")


def _metric(at, label):
    return next(m.value for m in at.metric if m.label == label)


@pytest.mark.timeout(120)
def test_first_screen_runs_an_all_reduce():
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception
    assert _metric(at, "replay token") == "random:0"
    assert int(_metric(at, "messages")) > 0
    results = at.dataframe[1].value
    assert list(results["result"]) == [str([sum(float(i + 100 * r) for r in range(4)) for i in range(4)])] * 4


@pytest.mark.timeout(120)
@pytest.mark.parametrize("op", ["broadcast", "all_to_all", "barrier"])
def test_changing_the_collective_and_world_size(op):
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.sidebar.selectbox[0].select(op)
    at.sidebar.slider[0].set_value(8)
    at.run()
    assert not at.exception
    assert len(at.dataframe[1].value) == 8
    if op == "broadcast":
        assert set(at.dataframe[1].value["result"]) == {str([0.0, 1.0, 2.0, 3.0])}


@pytest.mark.timeout(120)
def test_trace_download_is_offered():
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception
    (button,) = at.get("download_button")
    assert button.proto.label == "Download trace (Chrome/Perfetto JSON)"
