"""Deadlock lab: run a deadlocking program, see its wait-for graph and the report with call sites."""

import streamlit as st

from simdist import visualize as V


@st.cache_data(show_spinner=False)
def report(name: str):
    err = V.run_scenario(name)
    return err, str(err)


st.title("Deadlock lab")
name = st.selectbox("scenario", list(V.SCENARIOS), key="scenario")
scenario = V.SCENARIOS[name]
st.info(scenario.why)
err, text = report(name)
left, right = st.columns(2)
with left:
    st.subheader(f"The program ({scenario.world} ranks)")
    st.code(V.scenario_source(name), language="python")
with right:
    st.subheader("Wait-for graph")
    st.plotly_chart(V.wait_for_figure(V.wait_for(err)), key="wait_for")
    st.caption("An arrow goes from a blocked rank to the rank it waits for; a cycle means no rank can proceed.")
st.subheader("The report (simdist.DeadlockError)")
st.code(text, language="text")
