"""Exercises: read a task, write the code, submit it; simdist grades it under every schedule within a bound."""

import os
from types import SimpleNamespace

import networkx as nx
import streamlit as st
from code_editor import code_editor

import simdist
from simdist import exercises
from simdist import visualize as V


SUBMIT_BUTTON = {  # the editor's own Submit (its "submit" command, as Ctrl+Enter)
    "name": "Submit",
    "feather": "Play",
    "primary": True,
    "hasText": True,
    "showWithIcon": True,
    "alwaysOn": True,
    "commands": ["submit"],
    "style": {"bottom": "0.44rem", "right": "0.4rem"},
}
EDITOR_OPTIONS = {  # line numbers, Tab indents by 4; no completion pop-up to take an Enter meant for a new line
    "showLineNumbers": True,
    "tabSize": 4,
    "useSoftTabs": True,
    "enableLiveAutocompletion": False,
    "enableBasicAutocompletion": False,
    "enableSnippets": False,
}

EDITOR_PROPS = {  # Ace's own props, after the component's
    "theme": "chrome",  # (the component's Streamlit-like themes load their font from fonts.googleapis.com)
    "scrollMargin": [0, 0, 0, 0],  # (with a margin, an edit drew the line numbers off their lines)
}


@st.cache_data(show_spinner=False)
def catalogue() -> dict:
    """name -> (title, task, starter, hints, worlds, the file's text): what a student may see, and what grading reads."""
    return {
        e.name: (e.title, e.task, e.starter, e.hints, e.worlds, e.path.read_text(encoding="utf-8"))
        for e in exercises.load_all()
    }


@st.cache_resource
def tally() -> exercises.Tally:
    """The submissions of every session since the app started (counts only)."""
    return exercises.Tally()


st.title("Exercises")
shown = catalogue()
if os.environ.get(exercises.TEACHER_ENV) == "1":
    with st.expander("Teacher's view: submissions since the app started (no names are kept)", expanded=True):
        rows = tally().rows()
        for row in rows:
            row["exercise"] = shown[row["exercise"]][0] if row["exercise"] in shown else row["exercise"]
        if rows:
            st.table(rows)
        else:
            st.caption("No submission yet.")
name = st.selectbox("exercise", list(shown), format_func=lambda n: shown[n][0], key="exercise")
title, task, starter, hints, worlds, text = shown[name]
st.markdown(task)
st.caption(f"Graded on world sizes {', '.join(map(str, worlds))}, under every schedule up to a bound, then more.")

seen = st.session_state.setdefault("hints_seen", {}).get(name, 0)
for i, hint in enumerate(hints[:seen]):
    st.info(f"Hint {i + 1}: {hint}")
if seen < len(hints) and st.button(f"show a hint ({seen + 1} of {len(hints)})", key="hint"):
    st.session_state.hints_seen[name] = seen + 1
    st.rerun()

walled = V.bubblewrap() is not None
allowed = walled or V.code_allowed()
drafts = st.session_state.setdefault("drafts", {})  # name -> the code as last sent: kept across exercises
draft = drafts.get(name, starter.strip() + "\n")
if st.session_state.get("plain_box"):
    with st.form(f"submission_{name}", border=False):  # the code reaches the server when submitted, not per edit
        source = st.text_area("your code", draft, height=320, key=f"code_{name}")
        submitted = st.form_submit_button("Submit", type="primary", key="submit", disabled=not allowed)
    with st.expander("your code with line numbers (the verdict names these lines as solution.py:N)"):
        st.code(source, language="python", line_numbers=True)
else:
    st.caption("Your code (the verdict names its lines as solution.py:N). Ctrl+Enter submits it too.")
    sent = code_editor(
        draft,
        lang="python",
        height=[16, 40],
        buttons=[SUBMIT_BUTTON] if allowed else [],
        options=EDITOR_OPTIONS,
        response_mode=["blur"],  # the code also reaches the server when the editor loses the focus: kept as a draft
        props=EDITOR_PROPS,
        key=f"editor_{name}",
    )
    source, event = (sent["text"], sent["type"]) if sent and sent.get("id") else (draft, "")
    handled = st.session_state.setdefault("editor_events", {})
    submitted = event == "submit" and allowed and handled.get(name) != sent["id"]  # each press once
    if event:
        handled[name] = sent["id"]
st.toggle(
    "plain text box (for a screen reader, or where the editor does not show)",
    key="plain_box",
    help="The plain box keeps what you wrote; its code is sent when you press Submit.",
)
drafts[name] = source

if not allowed:
    st.warning(
        "Submitting is off: grading runs the submitted code. Install bubblewrap (`apt-get install bubblewrap`) "
        "and restart the app to grade in its sandbox, or, on your own machine only, start the app with "
        "`SIMDIST_ALLOW_CODE=1 streamlit run app.py`."
    )
    st.stop()
if not walled:
    st.warning(
        "bubblewrap is not installed: submissions run in a separate process with a bare environment, an empty "
        "private directory, no network where the platform permits it and limits, but they can read what the "
        "app's user can read. This app must not be served to others."
    )

if submitted:
    with st.spinner("grading under every schedule within the bound..."):
        result = V.grade_code(text, name, source)
    tally().add(name, result.verdict["kind"] if result.ok else "stopped")
    st.session_state.setdefault("verdicts", {})[name] = result

result = st.session_state.get("verdicts", {}).get(name)
if result is not None:
    if result.bubblewrap:
        st.caption(
            "Graded in bubblewrap's sandbox: no network, a private empty home and /tmp, read-only access to the "
            "Python installation and simdist only, its own processes (none outlives it), and limits on time, "
            "memory, CPU, files and processes."
        )
    else:
        st.caption(
            "Graded in a separate process: bare environment, empty private directory, limits on time, memory, CPU, "
            "files and processes. "
            + ("No network." if result.network_isolated else "Network NOT isolated on this platform.")
        )
    if not result.ok:
        st.error("Grading stopped")
        st.code(result.error, language="text")
    else:
        v = result.verdict
        if v["passed"]:
            st.success(f"Passed: {v['summary']}")
            st.markdown("Held in every run: " + ", ".join(v["checks"]) + ".")
        else:
            where = f" (world size {v['world']})" if v["world"] else ""
            st.error(f"{v['kind'].capitalize()}{where}: {v['explanation'] or v['summary']}")
            if v["decisions"]:
                st.markdown("**What the scheduler decided in the failing run** (at your lines):")
                for line in v["decisions"]:
                    st.markdown(f"- {line}")
            if v["token"]:
                st.caption("replay token of the smallest failing schedule")
                st.code(v["token"], language=None)
            if v["wait_for"]:
                st.markdown("**Who waits for whom** (a → b: rank a waits for rank b; the cycle in red)")
                found = SimpleNamespace(graph=nx.node_link_graph(v["wait_for"]["graph"], edges="links"),
                                        cycle=v["wait_for"]["cycle"])  # fmt: skip
                st.plotly_chart(V.wait_for_figure(V.wait_for(found)), key="verdict_wait_for")
            calls = v.get("calls") or []
            if any(calls):
                st.markdown(
                    "**What each rank's calls held in the failing run**, in the order they completed (a receive "
                    "when it was waited for): the values sent, the values in the buffer once received, and what "
                    "never completed"
                )
                rows = [{"rank": r, "#": i + 1, "call": text} for r, texts in enumerate(calls) for i, text in
                        enumerate(texts)]  # fmt: skip
                widths = {"rank": st.column_config.NumberColumn(width="small"),
                          "#": st.column_config.NumberColumn(width="small"),
                          "call": st.column_config.TextColumn(width="large")}  # fmt: skip
                height = 35 * (min(len(rows), 16) + 1) + 3  # every row in view, up to 16
                st.dataframe(rows, hide_index=True, column_config=widths, height=height, width="content",
                             key="verdict_calls")  # fmt: skip
            trace = simdist.Trace.from_json(v["trace_json"]) if v["trace_json"] else None
            if trace is not None and len(trace):
                st.markdown("**The failing run** (virtual time; arrows are messages)")
                st.plotly_chart(V.timeline_figure(V.timeline(trace)), key="verdict_timeline")
            with st.expander("the whole report", expanded=v["kind"] == "deadlock"):
                st.code(v["report"] or v["summary"], language="text")
