"""simdist visualizer: ``streamlit run app.py``.

A thin shell: the pages live in ``app_pages/`` and draw only what ``simdist.visualize``
computes from traces of the in-process simulator (no server, GPU or second process needed).
"""

# Sessions run on threads of one process. plotly looks pandas up in sys.modules without
# importing it: a page drawing a chart while another session's first table was importing
# pandas found it half-initialized (AttributeError: partially initialized module 'pandas').
import pandas  # noqa: F401 - imported whole before any page draws
import streamlit as st

# The tab's icon is an emoji, drawn by the browser; a ":material/...:" one would be fetched from
# fonts.gstatic.com (tests/app/test_classroom.py checks that the app makes no request elsewhere).
st.set_page_config(page_title="simdist visualizer", page_icon="🔀", layout="wide")
pages = [
    st.Page("app_pages/collectives.py", title="Collectives", icon=":material/hub:", default=True),
    st.Page("app_pages/compare.py", title="Compare algorithms", icon=":material/stacked_line_chart:"),
    st.Page("app_pages/deadlocks.py", title="Deadlock lab", icon=":material/block:"),
    st.Page("app_pages/ddp.py", title="DDP", icon=":material/model_training:"),
    st.Page("app_pages/exercises.py", title="Exercises", icon=":material/school:"),
    st.Page("app_pages/traces.py", title="Traces", icon=":material/timeline:"),
    st.Page("app_pages/your_code.py", title="Your code", icon=":material/code:"),
]
st.navigation(pages).run()
