"""Traces: download the current run as Chrome/Perfetto JSON; upload a simdist trace and see its timeline."""

import streamlit as st

import simdist
from simdist import visualize as V

st.title("Traces")
st.subheader("Download a run")
op = st.selectbox("collective", ["all_reduce", "broadcast", "all_gather", "reduce_scatter"], key="tr_op")
world = st.slider("world size", 2, 16, 4, key="tr_world")
res = V.collective_run(op, "ring" if op != "broadcast" else "binomial", world, 4096)
st.download_button("Download trace (Chrome/Perfetto JSON)", res.trace.to_chrome_json(),
                   file_name=f"simdist_{op}_{world}.json", mime="application/json")
st.download_button("Download trace (simdist JSON, for upload here)", res.trace.to_json(),
                   file_name=f"simdist_{op}_{world}.trace.json", mime="application/json")
st.caption("Open the Chrome/Perfetto JSON at ui.perfetto.dev or chrome://tracing.")

st.subheader("Look at a trace")
uploaded = st.file_uploader("simdist traces (simdist JSON): one file, or one per rank of a real run "
                            "(`SIMDIST_TRACE=DIR` makes socket ranks write them)", type=["json"],
                            accept_multiple_files=True, key="tr_upload")
if not uploaded:
    trace = res.trace
    st.caption("No trace uploaded: showing the run above.")
else:
    try:
        trace = simdist.Trace.merge([simdist.Trace.from_json(f.getvalue().decode()) for f in uploaded])
    except (ValueError, KeyError, TypeError) as exc:
        st.error(f"This file is not a simdist trace: {exc}")
        st.stop()
tl = V.timeline(trace)
st.metric("events", len(trace))
st.plotly_chart(V.timeline_figure(tl), key="uploaded_timeline")
